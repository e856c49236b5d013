//! The shape of one log line: JSON a log pipeline reads without losing precision, and text that
//! journald files under the line's own priority.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The largest integer a JavaScript number (an IEEE double) holds exactly. Log pipelines
/// (Elasticsearch, Loki's and Grafana's JSON, `jq` before 1.7) parse JSON numbers as doubles:
/// an id above this would come out as a different id, so it is written as a string.
const JS_SAFE_INTEGER: u64 = (1 << 53) - 1;

fn safe_u64(value: u64) -> Value {
    if value <= JS_SAFE_INTEGER {
        Value::from(value)
    } else {
        Value::String(value.to_string())
    }
}

fn safe_i64(value: i64) -> Value {
    if value.unsigned_abs() <= JS_SAFE_INTEGER {
        Value::from(value)
    } else {
        Value::String(value.to_string())
    }
}

/// `value` with every integer a double cannot hold exactly turned into a string.
fn js_safe(value: Value) -> Value {
    match value {
        Value::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(unsigned), _) => safe_u64(unsigned),
            (None, Some(signed)) => safe_i64(signed),
            _ => Value::Number(number),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(js_safe).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, js_safe(value)))
                .collect(),
        ),
        other => other,
    }
}

/// A field the code logged with `?` (its `Debug`): a list (`[a, b]`) becomes a JSON array, so
/// a pipeline can count or match its items; anything else stays the text it printed.
fn debug_value(text: String) -> Value {
    match debug_list(&text) {
        Some(items) => Value::Array(items),
        None => Value::String(text),
    }
}

fn debug_list(text: &str) -> Option<Vec<Value>> {
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    // Lists of numbers and plain strings print as JSON already.
    if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) {
        return Some(items.into_iter().map(js_safe).collect());
    }
    let items = split_top_level(inner)?;
    Some(items.into_iter().map(debug_item).collect())
}

/// One item of a `Debug` list: a number or quoted string as such, anything else (an address,
/// a struct) as its text.
fn debug_item(item: &str) -> Value {
    match serde_json::from_str::<Value>(item) {
        Ok(value @ (Value::Number(_) | Value::String(_) | Value::Bool(_))) => js_safe(value),
        _ => Value::String(item.to_string()),
    }
}

/// Splits `a, [b, c], "d, e"` at the commas outside brackets and quotes; `None` when the
/// brackets or quotes do not balance (then it is no list `Debug` printed).
fn split_top_level(inner: &str) -> Option<Vec<&str>> {
    let mut items = Vec::new();
    if inner.trim().is_empty() {
        return Some(items);
    }
    let (mut depth, mut quoted, mut escaped, mut start) = (0usize, false, false, 0);
    for (at, character) in inner.char_indices() {
        if quoted {
            match character {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match character {
            '"' => quoted = true,
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                items.push(inner[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 || quoted {
        return None;
    }
    items.push(inner[start..].trim());
    Some(items)
}

/// Collects an event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), safe_i64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), safe_u64(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        let value = i64::try_from(value).map_or(Value::String(value.to_string()), safe_i64);
        self.0.insert(field.name().into(), value);
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        let value = u64::try_from(value).map_or(Value::String(value.to_string()), safe_u64);
        self.0.insert(field.name().into(), value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().into(), Value::from(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        // The message is prose even when it starts with a bracket.
        let value = if field.name() == "message" {
            Value::String(text)
        } else {
            debug_value(text)
        };
        self.0.insert(field.name().into(), value);
    }
}

/// One JSON object per line: `timestamp`, `level`, `target`, `threadName`, `message` and the
/// event's fields flattened, integers beyond 2^53 as strings, `Debug` lists as arrays.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        event.record(&mut Fields(&mut line));
        // The fixed keys last: a field of the same name cannot pass itself off as one.
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), Value::String(timestamp));
        let metadata = event.metadata();
        line.insert("level".into(), Value::from(metadata.level().as_str()));
        line.insert("target".into(), Value::from(metadata.target()));
        if let Some(name) = std::thread::current().name() {
            line.insert("threadName".into(), Value::from(name));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// sd-daemon's priority prefix for a level: journald reads `<N>` at the start of a line on a
/// service's stream as the line's syslog priority, so `journalctl -p warning` finds warnings.
fn syslog_priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A text format that, under journald, starts each line with its syslog priority.
pub struct Journald<F> {
    inner: F,
    prefix: bool,
}

impl<F> Journald<F> {
    pub fn new(inner: F, prefix: bool) -> Self {
        Self { inner, prefix }
    }
}

impl<S, N, F> FormatEvent<S, N> for Journald<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.prefix {
            write!(writer, "<{}>", syslog_priority(event.metadata().level()))?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

/// Whether stderr is the journal stream systemd connected (`JOURNAL_STREAM` names its device
/// and inode). Checked against stderr itself, as sd-daemon advises: a child that inherited the
/// variable but writes to a pipe or terminal must not get the prefixes.
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stderr) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(metadata) = std::fs::File::from(stderr).metadata() else {
        return false;
    };
    names_stream(&stream.to_string_lossy(), metadata.dev(), metadata.ino())
}

/// Whether `JOURNAL_STREAM` (`DEVICE:INODE`, decimal) names the file `(dev, ino)`.
fn names_stream(variable: &str, dev: u64, ino: u64) -> bool {
    let Some((device, inode)) = variable.split_once(':') else {
        return false;
    };
    device.parse() == Ok(dev) && inode.parse() == Ok(ino)
}

#[cfg(test)]
#[path = "lines_tests.rs"]
mod tests;
