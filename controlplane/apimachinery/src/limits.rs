//! Size limits of one object, as Kubernetes has them: what keeps one writer from filling the
//! store with a few large objects (issue 32: 1.4 MiB annotations at 35 MiB/s).

use serde_json::{Map, Value};

use crate::kind::KindSpec;
use crate::names::label_key_error;
use crate::status::{FieldError, StatusDetails, StatusError, StatusReason};

/// Kubernetes' `TotalAnnotationSizeLimitB`: keys and values of all annotations together.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// The largest object as stored (its JSON): etcd's default `--max-request-bytes`, which
/// Kubernetes relies on, so an object the embedded store holds fits etcd too.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Kubernetes' `ValidateAnnotations`: each key a qualified name (compared lowercased, as
/// kube does), and the keys and values together at most [`MAX_ANNOTATION_BYTES`].
pub fn annotation_errors(annotations: &Map<String, Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut total = 0usize;
    for (key, value) in annotations {
        if let Some(reason) = label_key_error(&key.to_ascii_lowercase()) {
            errors.push(FieldError::invalid(
                "metadata.annotations",
                Value::String(key.clone()),
                reason,
            ));
        }
        total = total
            .saturating_add(key.len())
            .saturating_add(value.as_str().map_or(0, str::len));
    }
    if total > MAX_ANNOTATION_BYTES {
        errors.push(FieldError::too_long(
            "metadata.annotations",
            MAX_ANNOTATION_BYTES,
        ));
    }
    errors
}

/// 413 RequestEntityTooLarge when an object's JSON is over `max` bytes, naming the object,
/// its size and the limit; the cause's field is empty: it is the whole object.
pub fn object_size_error(
    spec: &KindSpec,
    name: &str,
    size: usize,
    max: usize,
) -> Option<StatusError> {
    if size <= max {
        return None;
    }
    let cause = FieldError::too_long("", max);
    let details = StatusDetails {
        name: name.to_string(),
        group: spec.group.clone(),
        kind: spec.kind.clone(),
        causes: vec![crate::status::StatusCause {
            reason: cause.cause_type().to_string(),
            message: cause.body(),
            field: String::new(),
        }],
        retry_after_seconds: None,
    };
    let message = format!(
        "{} {name:?} is too large: it is {size} bytes as stored; an object may be at most {max} \
         bytes (etcd's request limit)",
        spec.qualified_kind()
    );
    Some(StatusError {
        details: Some(Box::new(details)),
        ..StatusError::new(StatusReason::RequestEntityTooLarge, message)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kind::tests::widget;

    fn annotations(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn annotations_are_bounded_in_total_as_kube_bounds_them() {
        let half = "x".repeat(MAX_ANNOTATION_BYTES / 2);
        // Two keys of 1 byte plus two halves: 2 bytes over.
        let over = annotations(json!({"a": half, "b": half}));
        let errors = annotation_errors(&over);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "metadata.annotations");
        assert!(errors[0].to_string().contains("262144 bytes"), "{errors:?}");
        let at_limit = annotations(json!({"a": "x".repeat(MAX_ANNOTATION_BYTES - 1)}));
        assert!(annotation_errors(&at_limit).is_empty());
    }

    #[test]
    fn annotation_keys_are_qualified_names() {
        let keys = annotations(json!({"Example.COM/Key": "v", "bad key": "v", "/x": "v"}));
        let refused: Vec<Value> = annotation_errors(&keys)
            .into_iter()
            .map(|error| match error.kind {
                crate::FieldErrorKind::Invalid(value) => value,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(refused, [json!("/x"), json!("bad key")]);
    }

    #[test]
    fn oversized_objects_are_413_naming_object_size_and_limit() {
        assert!(object_size_error(&widget(), "a", 10, 10).is_none());
        let error = object_size_error(&widget(), "a", 11, 10).unwrap();
        assert_eq!(
            (error.code, error.reason.as_str()),
            (413, "RequestEntityTooLarge")
        );
        assert!(
            error.message.contains("\"a\"")
                && error.message.contains("11 bytes")
                && error.message.contains("at most 10 bytes"),
            "{}",
            error.message
        );
        assert_eq!(
            error.to_json()["details"]["causes"][0]["reason"],
            "FieldValueTooLong"
        );
    }
}
