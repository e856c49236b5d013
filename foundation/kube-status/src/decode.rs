//! The one `Status` decoder. Lenient where Kubernetes is (every field may be missing or null,
//! as Go's zero values), strict on types: a field of the wrong type is an error naming it, never
//! a silent zero.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::status::{Outcome, Status, StatusCause, StatusDetails, KIND};
use crate::StatusReason;

/// The longest foreign `kind` quoted back in [`DecodeError::NotAStatus`].
const MAX_QUOTED: usize = 64;

/// Why bytes or a JSON value are not a `Status`. None is retryable: the same bytes decode the
/// same way.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("a Status must be JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("a Status must be a JSON object")]
    NotAnObject,
    #[error("a Status document must say kind: Status")]
    MissingKind,
    #[error("kind is {kind:?}, not Status")]
    NotAStatus { kind: String },
    #[error("{field} must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    #[error("{field} is {value}, out of range 0..={max}")]
    OutOfRange {
        field: &'static str,
        value: i128,
        max: u32,
    },
}

impl Status {
    /// Decodes a `Status` document (an error body), which must say `kind: Status`: a body
    /// that is JSON but another object is not read as a failure. The caller bounds the length.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let value: Value = serde_json::from_slice(bytes)?;
        if value
            .as_object()
            .is_some_and(|object| present(object, "kind").is_none())
        {
            return Err(DecodeError::MissingKind);
        }
        Self::from_value(&value)
    }

    /// Decodes a `Status` already parsed (a watch ERROR event's object). A missing `kind` is
    /// accepted, as client-go accepts it in an ERROR event.
    pub fn from_value(value: &Value) -> Result<Self, DecodeError> {
        let object = value.as_object().ok_or(DecodeError::NotAnObject)?;
        if let Some(kind) = text(object, "kind")? {
            if kind != KIND {
                let kind = kind.chars().take(MAX_QUOTED).collect();
                return Err(DecodeError::NotAStatus { kind });
            }
        }
        // Anything but "Success" is a failure, as client-go reads it.
        let outcome = match text(object, "status")? {
            Some("Success") => Outcome::Success,
            _ => Outcome::Failure,
        };
        let reason = text(object, "reason")?.unwrap_or_default();
        let reason = match StatusReason::parse(reason) {
            Some(known) => Cow::Borrowed(known.as_str()),
            None => Cow::Owned(reason.to_string()),
        };
        let code = number(object, "code", u16::MAX.into())?.unwrap_or(0);
        let details = match present(object, "details") {
            None => None,
            Some(Value::Object(details)) => Some(decode_details(details)?),
            Some(_) => return Err(wrong("details", "an object")),
        };
        Ok(Status {
            outcome,
            message: text(object, "message")?.unwrap_or_default().to_string(),
            reason,
            details,
            code: u16::try_from(code).unwrap_or(u16::MAX),
        })
    }
}

fn decode_details(details: &Map<String, Value>) -> Result<StatusDetails, DecodeError> {
    let owned = |field: &'static str, name| -> Result<String, DecodeError> {
        Ok(text_at(details, name, field)?
            .unwrap_or_default()
            .to_string())
    };
    let causes = match present(details, "causes") {
        None => Vec::new(),
        Some(Value::Array(causes)) => causes.iter().map(decode_cause).collect::<Result<_, _>>()?,
        Some(_) => return Err(wrong("details.causes", "an array")),
    };
    let retry = number_at(
        details,
        "retryAfterSeconds",
        "details.retryAfterSeconds",
        u32::MAX,
    )?;
    Ok(StatusDetails {
        name: owned("details.name", "name")?,
        group: owned("details.group", "group")?,
        kind: owned("details.kind", "kind")?,
        causes,
        retry_after_seconds: retry.and_then(|seconds| u32::try_from(seconds).ok()),
    })
}

fn decode_cause(cause: &Value) -> Result<StatusCause, DecodeError> {
    let cause = cause
        .as_object()
        .ok_or_else(|| wrong("details.causes[*]", "an object"))?;
    let owned = |field: &'static str, name| -> Result<String, DecodeError> {
        Ok(text_at(cause, name, field)?.unwrap_or_default().to_string())
    };
    Ok(StatusCause {
        reason: owned("details.causes[*].reason", "reason")?,
        message: owned("details.causes[*].message", "message")?,
        field: owned("details.causes[*].field", "field")?,
    })
}

/// The value of `name`, `None` when missing or null (Go's zero value).
fn present<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).filter(|value| !value.is_null())
}

fn text<'a>(
    object: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a str>, DecodeError> {
    text_at(object, name, name)
}

fn text_at<'a>(
    object: &'a Map<String, Value>,
    name: &str,
    field: &'static str,
) -> Result<Option<&'a str>, DecodeError> {
    match present(object, name) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(wrong(field, "a string")),
    }
}

fn number(
    object: &Map<String, Value>,
    name: &'static str,
    max: u32,
) -> Result<Option<u64>, DecodeError> {
    number_at(object, name, name, max)
}

fn number_at(
    object: &Map<String, Value>,
    name: &str,
    field: &'static str,
    max: u32,
) -> Result<Option<u64>, DecodeError> {
    let Some(value) = present(object, name) else {
        return Ok(None);
    };
    let Value::Number(number) = value else {
        return Err(wrong(field, "an integer"));
    };
    let value = match (number.as_u64(), number.as_i64()) {
        (Some(unsigned), _) => i128::from(unsigned),
        (None, Some(signed)) => i128::from(signed),
        (None, None) => return Err(wrong(field, "an integer")),
    };
    match u64::try_from(value) {
        Ok(fits) if fits <= u64::from(max) => Ok(Some(fits)),
        _ => Err(DecodeError::OutOfRange { field, value, max }),
    }
}

fn wrong(field: &'static str, expected: &'static str) -> DecodeError {
    DecodeError::WrongType { field, expected }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
