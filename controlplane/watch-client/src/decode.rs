//! Pure decoding of what the server sends: watch lines (bounded), watch events, list pages.

use bytes::{Buf, Bytes, BytesMut};
use serde_json::Value;
use sluice_kube_status::Status;

use crate::error::WatchError;
use crate::snapshot::ObjectKey;

/// Splits a watch body into newline-terminated lines without ever holding more than
/// `max_line` bytes of an unfinished line: a server that never sends `\n` cannot make the
/// client buffer without bound.
#[derive(Debug)]
pub struct LineDecoder {
    buffer: BytesMut,
    max_line: usize,
}

impl LineDecoder {
    /// A decoder refusing lines longer than `max_line` bytes (the newline not counted).
    pub fn new(max_line: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_line,
        }
    }

    /// Adds a chunk of the body and returns the complete, non-empty lines it finished.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Bytes>, WatchError> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(at) = rest.iter().position(|byte| *byte == b'\n') {
            self.check(at)?;
            self.buffer.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            let line = self.buffer.split().freeze();
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push(line);
            }
        }
        self.check(rest.len())?;
        self.buffer.extend_from_slice(rest);
        Ok(lines)
    }

    /// Bytes of an unfinished line (what is lost if the stream ends now).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    fn check(&self, adding: usize) -> Result<(), WatchError> {
        if self.buffer.len().saturating_add(adding) > self.max_line {
            Err(WatchError::TooLarge {
                what: "watch event line",
                limit: self.max_line,
            })
        } else {
            Ok(())
        }
    }
}

/// A decoded watch event.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// ADDED or MODIFIED: the object's new state.
    Upsert {
        added: bool,
        key: ObjectKey,
        resource_version: String,
        object: Value,
    },
    /// DELETED: the object's last state.
    Deleted {
        key: ObjectKey,
        resource_version: String,
    },
    /// BOOKMARK: only the resourceVersion.
    Bookmark { resource_version: String },
}

impl WatchEvent {
    /// The metric label of the event's type.
    pub fn type_label(&self) -> &'static str {
        match self {
            Self::Upsert { added: true, .. } => "ADDED",
            Self::Upsert { added: false, .. } => "MODIFIED",
            Self::Deleted { .. } => "DELETED",
            Self::Bookmark { .. } => "BOOKMARK",
        }
    }
}

/// Decodes one watch line. An ERROR event becomes an error: [`WatchError::Expired`] for a 410
/// Status (the caller re-lists), [`WatchError::Status`] otherwise.
pub fn decode_event(line: &[u8]) -> Result<WatchEvent, WatchError> {
    let mut event: Value = serde_json::from_slice(line)
        .map_err(|error| WatchError::Protocol(format!("watch line is not JSON: {error}")))?;
    let object = event
        .get_mut("object")
        .map(Value::take)
        .filter(Value::is_object)
        .ok_or_else(|| WatchError::Protocol("watch event without an object".into()))?;
    match event.get("type").and_then(Value::as_str) {
        Some(kind @ ("ADDED" | "MODIFIED")) => {
            let (key, resource_version) = identify(&object)?;
            Ok(WatchEvent::Upsert {
                added: kind == "ADDED",
                key,
                resource_version,
                object,
            })
        }
        Some("DELETED") => {
            let (key, resource_version) = identify(&object)?;
            Ok(WatchEvent::Deleted {
                key,
                resource_version,
            })
        }
        Some("BOOKMARK") => Ok(WatchEvent::Bookmark {
            resource_version: resource_version(&object)?,
        }),
        Some("ERROR") => Err(status_error(&object)),
        other => Err(WatchError::Protocol(format!(
            "unknown watch event type {:?}",
            other.map(|text| text.chars().take(32).collect::<String>())
        ))),
    }
}

/// The error an ERROR event's object stands for, read by the shared `Status` decoder (a
/// missing `kind` is accepted there, as client-go accepts it); an object that is not a
/// `Status` is a protocol error naming what is wrong with it.
pub fn status_error(status: &Value) -> WatchError {
    match Status::from_value(status) {
        Ok(status) => error_of(&status),
        Err(error) => WatchError::Protocol(format!("watch ERROR event: {error}")),
    }
}

/// [`WatchError::Expired`] for a 410 (the caller re-lists), [`WatchError::Status`] otherwise;
/// the message is cut to 512 characters.
pub fn error_of(status: &Status) -> WatchError {
    let message: String = status.message.chars().take(512).collect();
    if status.is_expired() {
        WatchError::Expired(message)
    } else {
        WatchError::Status {
            status: status.code,
            message: format!("{}: {message}", status.reason),
        }
    }
}

/// One decoded LIST page.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<(ObjectKey, Value)>,
    pub resource_version: String,
    pub continue_token: Option<String>,
}

/// Decodes a `<Kind>List` document.
pub fn decode_list(body: impl Buf) -> Result<ListPage, WatchError> {
    let mut list: Value = serde_json::from_reader(body.reader())
        .map_err(|error| WatchError::Protocol(format!("list is not JSON: {error}")))?;
    let metadata = list
        .get("metadata")
        .ok_or_else(|| WatchError::Protocol("list without metadata".into()))?;
    let resource_version = metadata
        .get("resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
        .ok_or_else(|| WatchError::Protocol("list without metadata.resourceVersion".into()))?
        .to_string();
    let continue_token = metadata
        .get("continue")
        .and_then(Value::as_str)
        .filter(|token| !token.is_empty())
        .map(str::to_string);
    let items = match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(WatchError::Protocol("list items is not an array".into())),
    };
    let items = items
        .into_iter()
        .map(|item| identify(&item).map(|(key, _)| (key, item)))
        .collect::<Result<_, _>>()?;
    Ok(ListPage {
        items,
        resource_version,
        continue_token,
    })
}

/// The key (namespace, name) and resourceVersion of an object.
fn identify(object: &Value) -> Result<(ObjectKey, String), WatchError> {
    let metadata = object.get("metadata");
    let field = |name: &str| metadata.and_then(|m| m.get(name)).and_then(Value::as_str);
    let name = field("name")
        .filter(|name| !name.is_empty())
        .ok_or_else(|| WatchError::Protocol("object without metadata.name".into()))?;
    let key = ObjectKey::new(field("namespace").unwrap_or(""), name);
    Ok((key, resource_version(object)?))
}

fn resource_version(object: &Value) -> Result<String, WatchError> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
        .map(str::to_string)
        .ok_or_else(|| WatchError::Protocol("object without metadata.resourceVersion".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_split_across_chunks_and_skip_blanks() {
        let mut decoder = LineDecoder::new(16);
        assert!(decoder.push(b"{\"a\"").expect("part").is_empty());
        assert_eq!(decoder.pending(), 4);
        let lines = decoder.push(b":1}\n\n  \n{\"b\":2}\n{").expect("lines");
        assert_eq!(
            lines,
            vec![Bytes::from("{\"a\":1}"), Bytes::from("{\"b\":2}")]
        );
        assert_eq!(decoder.pending(), 1);
    }

    #[test]
    fn lines_over_the_bound_are_refused() {
        let mut decoder = LineDecoder::new(8);
        assert!(decoder.push(b"12345678\n").is_ok(), "exactly the bound");
        let mut decoder = LineDecoder::new(8);
        assert!(decoder.push(b"12345").is_ok());
        let error = decoder.push(b"6789").expect_err("no newline yet, too long");
        assert!(matches!(error, WatchError::TooLarge { limit: 8, .. }));
        let mut decoder = LineDecoder::new(8);
        assert!(
            decoder.push(b"123456789\n").is_err(),
            "complete but too long"
        );
    }

    #[test]
    fn events_decode() {
        let added = br#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"n","resourceVersion":"5"},"spec":1}}"#;
        match decode_event(added).expect("added") {
            WatchEvent::Upsert {
                added: true,
                key,
                resource_version,
                object,
            } => {
                assert_eq!(key, ObjectKey::new("n", "a"));
                assert_eq!(resource_version, "5");
                assert_eq!(object["spec"], 1);
            }
            other => panic!("{other:?}"),
        }
        let bookmark =
            br#"{"type":"BOOKMARK","object":{"kind":"X","metadata":{"resourceVersion":"9"}}}"#;
        assert_eq!(
            decode_event(bookmark).expect("bookmark"),
            WatchEvent::Bookmark {
                resource_version: "9".into()
            }
        );
        let deleted =
            br#"{"type":"DELETED","object":{"metadata":{"name":"a","resourceVersion":"6"}}}"#;
        assert_eq!(decode_event(deleted).expect("d").type_label(), "DELETED");
    }

    #[test]
    fn error_events_and_garbage() {
        let gone = json!({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 3 (10)"}});
        let error = decode_event(gone.to_string().as_bytes()).expect_err("410");
        assert!(error.needs_relist(), "{error}");
        let other = json!({"type":"ERROR","object":{"kind":"Status","code":500,"reason":"InternalError","message":"boom"}});
        let error = decode_event(other.to_string().as_bytes()).expect_err("500");
        assert!(matches!(error, WatchError::Status { status: 500, .. }));
        assert_eq!(
            error.to_string(),
            "server answered 500: InternalError: boom"
        );
        let gone_by_reason = json!({"type":"ERROR","object":{"code":500,"reason":"Gone"}});
        let error = decode_event(gone_by_reason.to_string().as_bytes()).expect_err("Gone");
        assert!(error.needs_relist(), "{error}");
        for not_a_status in [
            json!({"type":"ERROR","object":{"kind":"Pod","code":500}}),
            json!({"type":"ERROR","object":{"code":"500"}}),
        ] {
            let error = decode_event(not_a_status.to_string().as_bytes()).expect_err("bad");
            assert!(matches!(error, WatchError::Protocol(_)), "{error}");
        }
        for bad in [
            &b"not json"[..],
            br#"{"type":"ADDED"}"#,
            br#"{"type":"NOPE","object":{}}"#,
            br#"{"type":"ADDED","object":{"metadata":{"resourceVersion":"1"}}}"#,
            br#"{"type":"ADDED","object":{"metadata":{"name":"a"}}}"#,
            br#"{"type":"BOOKMARK","object":{}}"#,
        ] {
            assert!(
                matches!(decode_event(bad), Err(WatchError::Protocol(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn list_pages_decode() {
        let page = json!({"kind":"AgentList","apiVersion":"v1","metadata":{"resourceVersion":"12","continue":"abc"},
            "items":[{"metadata":{"name":"a","resourceVersion":"3"}},{"metadata":{"name":"b","namespace":"x","resourceVersion":"4"}}]});
        let page = decode_list(Bytes::from(page.to_string())).expect("page");
        assert_eq!(page.resource_version, "12");
        assert_eq!(page.continue_token.as_deref(), Some("abc"));
        assert_eq!(page.items[1].0, ObjectKey::new("x", "b"));
        let empty = json!({"metadata":{"resourceVersion":"1","continue":""},"items":null});
        let empty = decode_list(Bytes::from(empty.to_string())).expect("empty");
        assert!(empty.items.is_empty() && empty.continue_token.is_none());
        for bad in [
            json!({"items":[]}),
            json!({"metadata":{"resourceVersion":"1"},"items":{}}),
        ] {
            assert!(decode_list(Bytes::from(bad.to_string())).is_err());
        }
    }
}
