//! The one error type of the API layer and its `meta.k8s.io/v1 Status` rendering.
//!
//! Messages, reasons and `details` follow kube-apiserver's
//! `k8s.io/apimachinery/pkg/api/errors` constructors so that client-go's `errors.IsNotFound`,
//! `IsConflict`, `IsResourceExpired`... and kubectl's printing behave as against a real cluster.
//! The reasons, the `details` types and the JSON encoding are `sluice-kube-status`'s, shared
//! with the gateway and the watch client.

use serde_json::Value;
use sluice_kube_status::Status;
pub use sluice_kube_status::{StatusCause, StatusDetails, StatusReason};

use crate::kind::KindSpec;

/// The kind of a field error, as `field.ErrorType` names it (it is the cause's `reason`).
#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    /// A required field is missing.
    Required,
    /// The value is wrong; the value is quoted in the message.
    Invalid(Value),
    /// The value is not one of the supported ones.
    NotSupported(Value, Vec<String>),
    /// The value repeats another one in the same list.
    Duplicate(Value),
    /// The value is longer than this many bytes (`field.TooLong`).
    TooLong(usize),
    /// The field may not be set (or changed).
    Forbidden,
}

/// One validation failure at a field path such as `spec.servers[0].endpoint`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The path of the field, in kube's notation (`spec.servers[0].endpoint`).
    pub field: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// Why, in words (may be empty).
    pub detail: String,
}

impl FieldError {
    /// A missing required field.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: detail.into(),
        }
    }

    /// A wrong value.
    pub fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid(value),
            detail: detail.into(),
        }
    }

    /// A value that is not one of `supported`.
    pub fn not_supported(field: impl Into<String>, value: Value, supported: &[&str]) -> Self {
        let supported = supported.iter().map(|s| s.to_string()).collect();
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotSupported(value, supported),
            detail: String::new(),
        }
    }

    /// A value repeated in a list.
    pub fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Duplicate(value),
            detail: String::new(),
        }
    }

    /// A value longer than `max` bytes (the value itself is not quoted: it is the problem).
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::TooLong(max),
            detail: String::new(),
        }
    }

    /// A field that may not be set or changed.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
        }
    }

    /// The cause's `reason` (`field.ErrorType` string).
    pub fn cause_type(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::NotSupported(..) => "FieldValueNotSupported",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::TooLong(_) => "FieldValueTooLong",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
        }
    }

    /// The message without the field (`field.Error.ErrorBody`).
    pub fn body(&self) -> String {
        let mut body = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::Invalid(value) => format!("Invalid value: {}", quote(value)),
            FieldErrorKind::Duplicate(value) => format!("Duplicate value: {}", quote(value)),
            FieldErrorKind::TooLong(max) => format!("Too long: may not be more than {max} bytes"),
            FieldErrorKind::NotSupported(value, supported) => {
                let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                format!(
                    "Unsupported value: {}: supported values: {}",
                    quote(value),
                    quoted.join(", ")
                )
            }
        };
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Go's `%#v`/`%q` of a JSON value as `field.Error` prints it: strings quoted, the rest as JSON.
fn quote(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// The API layer's error: everything a handler can fail with, rendered as a `Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason:?} ({code}): {message}")]
pub struct StatusError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason.
    pub reason: StatusReason,
    /// Human-readable message (what kubectl prints after "Error from server (Reason):").
    pub message: String,
    /// What the error is about; `None` renders no `details` key.
    pub details: Option<Box<StatusDetails>>,
}

impl StatusError {
    /// An error with a reason and message and no details.
    pub fn new(reason: StatusReason, message: impl Into<String>) -> Self {
        Self {
            code: reason.code(),
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(spec: &KindSpec, name: &str, reason: StatusReason, message: String) -> Self {
        let details = StatusDetails {
            name: name.to_string(),
            group: spec.group.clone(),
            kind: spec.plural.clone(),
            ..StatusDetails::default()
        };
        Self {
            details: Some(Box::new(details)),
            ..Self::new(reason, message)
        }
    }

    /// 404 `widgets.tests.sluice.dev "a" not found`.
    pub fn not_found(spec: &KindSpec, name: &str) -> Self {
        let message = format!("{} {name:?} not found", spec.qualified_resource());
        Self::about(spec, name, StatusReason::NotFound, message)
    }

    /// 409 AlreadyExists on create.
    pub fn already_exists(spec: &KindSpec, name: &str) -> Self {
        let message = format!("{} {name:?} already exists", spec.qualified_resource());
        Self::about(spec, name, StatusReason::AlreadyExists, message)
    }

    /// 409 Conflict for a stale resourceVersion (the message client-go users grep for).
    pub fn conflict(spec: &KindSpec, name: &str) -> Self {
        let detail = "the object has been modified; please apply your changes to the latest \
                      version and try again";
        Self::conflict_because(spec, name, detail)
    }

    /// 409 Conflict with a specific cause (a precondition that failed).
    pub fn conflict_because(spec: &KindSpec, name: &str, detail: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} {name:?}: {detail}",
            spec.qualified_resource()
        );
        Self::about(spec, name, StatusReason::Conflict, message)
    }

    /// 422 Invalid with one cause per field error; `details.kind` is the Kind, as in
    /// `errors.NewInvalid`.
    pub fn invalid(spec: &KindSpec, name: &str, errors: &[FieldError]) -> Self {
        let qualified_kind = spec.qualified_kind();
        let message = match errors {
            [] => format!("{qualified_kind} {name:?} is invalid"),
            [only] => format!("{qualified_kind} {name:?} is invalid: {only}"),
            many => {
                let parts: Vec<String> = many.iter().map(ToString::to_string).collect();
                format!(
                    "{qualified_kind} {name:?} is invalid: [{}]",
                    parts.join(", ")
                )
            }
        };
        let causes = errors
            .iter()
            .map(|error| StatusCause {
                reason: error.cause_type().to_string(),
                message: error.body(),
                field: error.field.clone(),
            })
            .collect();
        let details = StatusDetails {
            name: name.to_string(),
            group: spec.group.clone(),
            kind: spec.kind.clone(),
            causes,
            retry_after_seconds: None,
        };
        Self {
            details: Some(Box::new(details)),
            ..Self::new(StatusReason::Invalid, message)
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusReason::BadRequest, message)
    }

    /// 410 Expired for a watch or list from a compacted resourceVersion: client-go's reflector
    /// re-lists on `IsResourceExpired || IsGone`; the message is the watch cache's.
    pub fn gone(requested: u64, oldest: u64) -> Self {
        let message = format!("too old resource version: {requested} ({oldest})");
        Self::new(StatusReason::Expired, message)
    }

    /// 410 Expired for a continue token whose revision was compacted (kube's wording).
    pub fn continue_expired() -> Self {
        Self::new(
            StatusReason::Expired,
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
        )
    }

    /// 405 for a verb the resource does not serve.
    pub fn method_not_allowed(spec: &KindSpec, verb: &str) -> Self {
        let message = format!(
            "{verb} is not supported on resources of kind {:?}",
            spec.qualified_resource()
        );
        Self::about(spec, "", StatusReason::MethodNotAllowed, message)
    }

    /// 415 listing what is accepted (`negotiation.NewUnsupportedMediaTypeError`).
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        let message = format!(
            "the body of the request was in an unknown format - accepted media types include: {}",
            accepted.join(", ")
        );
        Self::new(StatusReason::UnsupportedMediaType, message)
    }

    /// 406 listing what can be served (`negotiation.NewNotAcceptableError`).
    pub fn not_acceptable(served: &[&str]) -> Self {
        let message = format!(
            "only the following media types are accepted: {}",
            served.join(", ")
        );
        Self::new(StatusReason::NotAcceptable, message)
    }

    /// 403 naming who was refused what, in kube-apiserver's words (`errors.NewForbidden` around
    /// the authorizer's reason): the object (unquoted and without a name for a collection), the
    /// user, the verb, the resource and the scope.
    pub fn forbidden(
        spec: &KindSpec,
        namespace: Option<&str>,
        name: &str,
        user: &str,
        verb: &str,
    ) -> Self {
        let object = if name.is_empty() {
            spec.qualified_resource()
        } else {
            format!("{} {name:?}", spec.qualified_resource())
        };
        let scope = match namespace {
            Some(namespace) => format!("in the namespace {namespace:?}"),
            None => "at the cluster scope".to_string(),
        };
        let message = format!(
            "{object} is forbidden: User {user:?} cannot {verb} resource {:?} in API group {:?} \
             {scope}",
            spec.plural, spec.group
        );
        Self::about(spec, name, StatusReason::Forbidden, message)
    }

    /// 429 TooManyRequests with `details.retryAfterSeconds` (served as `Retry-After` too).
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        let details = StatusDetails {
            retry_after_seconds: Some(retry_after_seconds),
            ..StatusDetails::default()
        };
        Self {
            details: Some(Box::new(details)),
            ..Self::new(StatusReason::TooManyRequests, message)
        }
    }

    /// 500 for a failure that is the server's fault.
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusReason::InternalError,
            format!("Internal error occurred: {message}"),
        )
    }

    /// Whether a client may retry the same request (see [`StatusReason::retryable`]).
    pub fn retryable(&self) -> bool {
        self.reason.retryable()
    }

    /// The `meta.k8s.io/v1 Status` document with kube-apiserver's keys and values (serde_json
    /// sorts keys; their order means nothing to clients), from the shared encoder.
    pub fn to_json(&self) -> Value {
        Status::failure_with_code(self.code, self.reason.as_str(), self.message.clone())
            .with_details(self.details.as_deref().cloned())
            .to_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::tests::widget;
    use serde_json::json;

    #[test]
    fn not_found_is_kube_apiserver_json() {
        // Shape and wording of kube-apiserver's answer to a GET of a missing custom object
        // (apimachinery `errors.NewNotFound`, `details.kind` is the resource).
        let expected = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "widgets.tests.sluice.dev \"a\" not found", "reason": "NotFound",
            "details": {"name": "a", "group": "tests.sluice.dev", "kind": "widgets"}, "code": 404,
        });
        assert_eq!(StatusError::not_found(&widget(), "a").to_json(), expected);
    }

    #[test]
    fn invalid_lists_causes_with_paths() {
        let errors = [
            FieldError::invalid("spec.servers[0].endpoint", json!("x"), "must be host:port"),
            FieldError::required("spec.name", ""),
        ];
        let error = StatusError::invalid(&widget(), "a", &errors);
        assert_eq!(error.code, 422);
        assert_eq!(
            error.message,
            "Widget.tests.sluice.dev \"a\" is invalid: [spec.servers[0].endpoint: Invalid value: \"x\": must be host:port, spec.name: Required value]"
        );
        let json = error.to_json();
        assert_eq!(json["details"]["kind"], "Widget");
        assert_eq!(
            json["details"]["causes"][0],
            json!({"reason": "FieldValueInvalid",
            "message": "Invalid value: \"x\": must be host:port", "field": "spec.servers[0].endpoint"})
        );
        let single = StatusError::invalid(&widget(), "a", &errors[1..]);
        assert_eq!(
            single.message,
            "Widget.tests.sluice.dev \"a\" is invalid: spec.name: Required value"
        );
    }

    #[test]
    fn codes_and_retries() {
        let conflict = StatusError::conflict(&widget(), "a");
        assert_eq!((conflict.code, conflict.retryable()), (409, true));
        assert!(conflict
            .message
            .starts_with("Operation cannot be fulfilled on widgets.tests.sluice.dev \"a\""));
        let gone = StatusError::gone(1, 5);
        assert_eq!(
            (gone.code, gone.reason.as_str(), gone.retryable()),
            (410, "Expired", false)
        );
        assert_eq!(
            StatusError::already_exists(&widget(), "a").to_json()["reason"],
            "AlreadyExists"
        );
        assert_eq!(StatusError::not_acceptable(&["application/json"]).code, 406);
        assert_eq!(
            StatusError::internal("disk").message,
            "Internal error occurred: disk"
        );
        assert!(!StatusError::bad_request("x").retryable());
        let forbidden = StatusError::forbidden(&widget(), None, "a", "gw", "delete");
        assert_eq!(forbidden.code, 403);
        assert_eq!(
            forbidden.message,
            format!(
                "{} \"a\" is forbidden: User \"gw\" cannot delete resource \"widgets\" in API \
                 group \"tests.sluice.dev\" at the cluster scope",
                widget().qualified_resource()
            )
        );
        let listing = StatusError::forbidden(&widget(), Some("ns-1"), "", "gw", "list");
        assert_eq!(
            listing.message,
            format!(
                "{} is forbidden: User \"gw\" cannot list resource \"widgets\" in API group \
                 \"tests.sluice.dev\" in the namespace \"ns-1\"",
                widget().qualified_resource()
            )
        );
        assert!(StatusError::new(StatusReason::TooManyRequests, "slow")
            .to_json()
            .get("details")
            .is_none());
    }

    #[test]
    fn limits_have_their_own_codes_and_say_when_to_retry() {
        let busy = StatusError::too_many_requests("over budget", 3);
        assert_eq!((busy.code, busy.retryable()), (429, true));
        assert_eq!(busy.to_json()["details"]["retryAfterSeconds"], json!(3));
        let full = StatusError::new(StatusReason::StorageQuotaExceeded, "full");
        assert_eq!((full.code, full.retryable()), (507, false));
        assert_eq!(full.to_json()["reason"], json!("StorageQuotaExceeded"));
        let long = FieldError::too_long("metadata.annotations", 262144);
        assert_eq!(
            long.to_string(),
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        assert_eq!(long.cause_type(), "FieldValueTooLong");
    }
}
