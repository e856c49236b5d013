//! Core `v1 Event`: namespaced, kube's shape, so `kubectl get events` and `kubectl describe`
//! read them as they read kube-apiserver's. The control plane writes them itself
//! (`crate::events`); the admin may read (and, as for every kind, write) them, no other role
//! may. Serving a core `v1` kind is also what gives kubectl the `v1` discovery it needs to
//! apply a `kind: List`.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};

use super::invalid_at;

/// The event types kube knows.
pub const EVENT_TYPES: [&str; 2] = ["Normal", "Warning"];
/// Longest `reason` (kube validates 128 characters).
pub const MAX_REASON: usize = 128;
/// Longest `message` kept (kube's recorder truncates to 1 KiB).
pub const MAX_MESSAGE: usize = 1024;

pub fn event() -> KindSpec {
    let string = || json!({"type": "string"});
    KindSpec {
        group: String::new(),
        version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
        singular: "event".into(),
        short_names: vec!["ev".into()],
        namespaced: true,
        status_subresource: false,
        printer_columns: vec![
            PrinterColumn::new(
                "Last Seen",
                ".lastTimestamp",
                "date",
                "when it last happened",
            ),
            PrinterColumn::new("Type", ".type", "string", "Normal or Warning"),
            PrinterColumn::new("Reason", ".reason", "string", "why, in one word"),
            PrinterColumn::new("Kind", ".involvedObject.kind", "string", "of the object"),
            PrinterColumn::new("Object", ".involvedObject.name", "string", "it is about"),
            PrinterColumn::new("Count", ".count", "integer", "times it happened"),
            PrinterColumn::new("Message", ".message", "string", "what happened"),
        ],
        schema: json!({"type": "object", "required": ["involvedObject"], "properties": {
            "involvedObject": {"type": "object", "properties": {
                "apiVersion": string(), "kind": string(), "name": string(),
                "namespace": string(), "uid": string(), "resourceVersion": string(),
                "fieldPath": string()}},
            "reason": string(),
            "message": string(),
            "type": {"type": "string", "enum": EVENT_TYPES},
            "source": {"type": "object", "properties": {"component": string(), "host": string()}},
            "firstTimestamp": {"type": "string", "format": "date-time", "nullable": true},
            "lastTimestamp": {"type": "string", "format": "date-time", "nullable": true},
            "eventTime": {"type": "string", "format": "date-time", "nullable": true},
            "count": {"type": "integer", "format": "int32"},
            "action": string(),
            "reportingComponent": string(),
            "reportingInstance": string()}}),
        validate,
    }
}

fn validate(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !object.get("involvedObject").is_some_and(Value::is_object) {
        errors.push(FieldError::required(
            "involvedObject",
            "the object the event is about",
        ));
    }
    if let Some(kind) = object.get("type").and_then(Value::as_str) {
        if !EVENT_TYPES.contains(&kind) {
            errors.push(invalid_at(object, "type", "must be Normal or Warning"));
        }
    }
    let reason = object.get("reason").and_then(Value::as_str).unwrap_or("");
    if reason.len() > MAX_REASON {
        errors.push(invalid_at(
            object,
            "reason",
            format!("must be at most {MAX_REASON} bytes"),
        ));
    }
    let message = object.get("message").and_then(Value::as_str).unwrap_or("");
    if message.len() > MAX_MESSAGE {
        errors.push(invalid_at(
            object,
            "message",
            format!("must be at most {MAX_MESSAGE} bytes"),
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_needs_its_object_and_a_known_type() {
        let good = json!({"involvedObject": {"kind": "VirtualMachine", "name": "vm1"},
            "type": "Normal", "reason": "StateChanged", "message": "m"});
        assert!(validate(&good).is_empty());
        let mut bad = good.clone();
        bad["type"] = json!("Loud");
        bad["reason"] = json!("r".repeat(MAX_REASON + 1));
        bad.as_object_mut().map(|map| map.remove("involvedObject"));
        let paths: Vec<String> = validate(&bad).into_iter().map(|e| e.field).collect();
        assert_eq!(paths, ["involvedObject", "type", "reason"]);
        assert_eq!(event().api_version(), "v1");
        assert_eq!(event().qualified_resource(), "events");
    }
}
