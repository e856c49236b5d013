#![allow(clippy::unwrap_used)]

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::format;
use tracing_subscriber::fmt::MakeWriter;

use super::*;

/// Log lines written into memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn json_of(log: impl FnOnce()) -> Value {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .event_format(JsonLines)
        .finish();
    tracing::subscriber::with_default(subscriber, log);
    let lines = captured.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    serde_json::from_str(&lines[0]).unwrap()
}

#[test]
fn integers_stay_exact_for_a_javascript_reader() {
    let line = json_of(|| {
        tracing::info!(
            small = 42u64,
            edge = JS_SAFE_INTEGER,
            big = u64::MAX,
            id = 5_560_351_769_336_135_986i64,
            negative = -7i64,
            lowest = i64::MIN,
            "hello"
        );
    });
    assert_eq!(line["small"], Value::from(42u64), "{line}");
    assert_eq!(line["edge"], Value::from(JS_SAFE_INTEGER), "{line}");
    assert_eq!(line["big"], "18446744073709551615", "{line}");
    assert_eq!(line["id"], "5560351769336135986", "{line}");
    assert_eq!(line["negative"], Value::from(-7), "{line}");
    assert_eq!(line["lowest"], "-9223372036854775808", "{line}");
    assert_eq!(line["message"], "hello", "{line}");
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["target"], module_path!(), "{line}");
    assert!(line["timestamp"].as_str().unwrap().contains('T'), "{line}");
}

#[test]
fn debug_lists_become_arrays_and_other_debug_stays_text() {
    let addresses: Vec<SocketAddr> = vec![
        "127.0.0.1:80".parse().unwrap(),
        "[::1]:443".parse().unwrap(),
    ];
    let line = json_of(|| {
        tracing::warn!(
            agents = ?vec![4u64, u64::MAX],
            names = ?vec!["a, b", "c"],
            addresses = ?addresses,
            nested = ?vec![vec![1, 2], vec![3]],
            empty = ?Vec::<u64>::new(),
            pair = ?(1, 2),
            "[not a list]"
        );
    });
    assert_eq!(
        line["agents"],
        serde_json::json!([4, "18446744073709551615"]),
        "{line}"
    );
    assert_eq!(line["names"], serde_json::json!(["a, b", "c"]), "{line}");
    assert_eq!(
        line["addresses"],
        serde_json::json!(["127.0.0.1:80", "[::1]:443"]),
        "{line}"
    );
    assert_eq!(line["nested"], serde_json::json!([[1, 2], [3]]), "{line}");
    assert_eq!(line["empty"], serde_json::json!([]), "{line}");
    assert_eq!(line["pair"], "(1, 2)", "{line}");
    assert_eq!(line["message"], "[not a list]", "{line}");
}

#[test]
fn a_field_cannot_pass_itself_off_as_the_level() {
    let line = json_of(|| tracing::error!(level = "DEBUG", "x"));
    assert_eq!(line["level"], "ERROR", "{line}");
}

fn text_lines(journal: bool, log: impl FnOnce()) -> Vec<String> {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(Level::DEBUG)
        .event_format(Journald::new(format(), journal))
        .finish();
    tracing::subscriber::with_default(subscriber, log);
    captured.lines()
}

#[test]
fn under_journald_each_text_line_starts_with_its_priority() {
    let log = || {
        tracing::error!("e");
        tracing::warn!("w");
        tracing::info!("i");
        tracing::debug!("d");
    };
    let lines = text_lines(true, log);
    let prefixes: Vec<&str> = lines.iter().map(|line| &line[..3]).collect();
    assert_eq!(prefixes, ["<3>", "<4>", "<6>", "<7>"], "{lines:?}");
    assert!(lines[0].ends_with(" e"), "{lines:?}");
    let plain = text_lines(false, log);
    assert_eq!(plain.len(), 4);
    assert!(plain.iter().all(|line| !line.starts_with('<')), "{plain:?}");
}

#[test]
fn journal_stream_must_name_this_very_file() {
    assert!(names_stream("8:12345", 8, 12345));
    assert!(!names_stream("8:12345", 8, 12346));
    assert!(!names_stream("9:12345", 8, 12345));
    assert!(!names_stream("garbage", 8, 12345));
    assert!(!names_stream("", 0, 0));
}
