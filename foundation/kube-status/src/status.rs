//! The `Status` object and its one encoder.

use std::borrow::Cow;

use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;
use serde_json::Value;

use crate::StatusReason;

/// `kind` of every `Status`.
pub const KIND: &str = "Status";
/// `apiVersion` Sluice writes (kube-apiserver's, for client-go's decoder).
pub const API_VERSION: &str = "v1";

/// Written if encoding ever failed: a struct of strings and integers always serializes, but
/// the request path must not panic all the same.
const FALLBACK: &[u8] =
    br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","code":500}"#;

/// `status` of a `Status`: whether the operation succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "Success",
            Outcome::Failure => "Failure",
        }
    }
}

/// A `meta.k8s.io/v1 Status`. `kind`, `apiVersion` and the empty `metadata` are constants of
/// the encoder, not fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub outcome: Outcome,
    /// Human-readable (what kubectl prints after "Error from server (Reason):").
    pub message: String,
    /// Machine-readable; text, since a server may send reasons Sluice does not know.
    pub reason: Cow<'static, str>,
    /// What the status is about; `None` writes no `details` key.
    pub details: Option<StatusDetails>,
    /// The HTTP status code.
    pub code: u16,
}

/// `details` of a `Status`; empty fields are not written (`omitempty` on every field).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    /// The object's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The API group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The kind, or the plural for the errors kube-apiserver builds from a resource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Field-level causes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    /// Seconds the client should wait before retrying (429/503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

impl StatusDetails {
    /// Details carrying only `retryAfterSeconds`.
    pub fn retry_after(seconds: u32) -> Self {
        Self {
            retry_after_seconds: Some(seconds),
            ..Self::default()
        }
    }
}

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct StatusCause {
    /// The machine-readable cause (`FieldValueInvalid`...).
    pub reason: String,
    /// The human-readable message.
    pub message: String,
    /// The field path, empty (and not written) when the cause is not about one field.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// `metadata: {}`.
#[derive(Serialize)]
struct EmptyObject {}

impl Status {
    /// A failure with `reason`, served with the reason's usual code.
    pub fn failure(reason: StatusReason, message: impl Into<String>) -> Self {
        Self::failure_with_code(reason.code(), reason.as_str(), message)
    }

    /// A failure with an explicit code (the gateway's 502 `ServiceUnavailable`, a simulator's
    /// imitation of any apiserver answer).
    pub fn failure_with_code(
        code: u16,
        reason: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            outcome: Outcome::Failure,
            message: message.into(),
            reason: reason.into(),
            details: None,
            code,
        }
    }

    /// The same status with `details`.
    pub fn with_details(self, details: Option<StatusDetails>) -> Self {
        Self { details, ..self }
    }

    /// The reason, if it is one Sluice knows.
    pub fn known_reason(&self) -> Option<StatusReason> {
        StatusReason::parse(&self.reason)
    }

    /// client-go's `IsResourceExpired || IsGone` (a 410 code counts even with another reason):
    /// the reader must re-list instead of resuming.
    pub fn is_expired(&self) -> bool {
        self.code == 410
            || matches!(
                self.known_reason(),
                Some(StatusReason::Expired | StatusReason::Gone)
            )
    }

    /// The JSON body (`Content-Type: application/json`), keys in kube-apiserver's order.
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| FALLBACK.to_vec())
    }

    /// The same object as a JSON value, to embed in a larger document.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self)
            .or_else(|_| serde_json::from_slice(FALLBACK))
            .unwrap_or(Value::Null)
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.details.is_some() { 8 } else { 7 };
        let mut out = serializer.serialize_struct("Status", fields)?;
        out.serialize_field("kind", KIND)?;
        out.serialize_field("apiVersion", API_VERSION)?;
        out.serialize_field("metadata", &EmptyObject {})?;
        out.serialize_field("status", self.outcome.as_str())?;
        out.serialize_field("message", &self.message)?;
        out.serialize_field("reason", &self.reason)?;
        match &self.details {
            Some(details) => out.serialize_field("details", details)?,
            None => out.skip_field("details")?,
        }
        out.serialize_field("code", &self.code)?;
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bytes_are_in_kube_apiservers_key_order() {
        let status = Status::failure(StatusReason::TooManyRequests, "slow down")
            .with_details(Some(StatusDetails::retry_after(1)));
        assert_eq!(
            String::from_utf8(status.to_vec()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"slow down","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#
        );
        let plain = Status::failure_with_code(502, "ServiceUnavailable", "upstream reset");
        assert_eq!(
            String::from_utf8(plain.to_vec()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"upstream reset","reason":"ServiceUnavailable","code":502}"#
        );
    }

    #[test]
    fn empty_details_fields_are_left_out() {
        let details = StatusDetails {
            name: "a".into(),
            causes: vec![
                StatusCause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: String::new(),
                },
                StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: "Invalid value".into(),
                    field: "spec.x".into(),
                },
            ],
            ..StatusDetails::default()
        };
        let value = Status::failure(StatusReason::Invalid, "bad")
            .with_details(Some(details))
            .to_value();
        assert_eq!(
            value,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "bad", "reason": "Invalid", "code": 422,
                   "details": {"name": "a", "causes": [
                       {"reason": "FieldValueRequired", "message": "Required value"},
                       {"reason": "FieldValueInvalid", "message": "Invalid value", "field": "spec.x"}]}})
        );
        let empty = Status::failure(StatusReason::NotFound, "gone")
            .with_details(Some(StatusDetails::default()))
            .to_value();
        assert_eq!(empty["details"], json!({}));
    }

    #[test]
    fn expired_is_a_410_or_the_expired_or_gone_reason() {
        assert!(Status::failure(StatusReason::Expired, "old").is_expired());
        assert!(Status::failure_with_code(500, "Gone", "x").is_expired());
        assert!(Status::failure_with_code(410, "Whatever", "x").is_expired());
        assert!(!Status::failure(StatusReason::InternalError, "x").is_expired());
        assert_eq!(
            Status::failure_with_code(500, "Odd", "x").known_reason(),
            None
        );
    }
}
