//! `tunnel.sluice.dev/v1alpha1 Agent`: cluster-scoped; an agent a tunnel node lets connect (its
//! id and the SHA-256 of its token, as `tunnel.agents` lists them in a node's config); its
//! status names the nodes holding its tunnels (`status.nodes.<node>`, each node writing only
//! its own entry with a merge patch).

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};

use super::invalid_at;

pub fn agent() -> KindSpec {
    KindSpec {
        group: "tunnel.sluice.dev".into(),
        version: "v1alpha1".into(),
        kind: "Agent".into(),
        plural: "agents".into(),
        singular: "agent".into(),
        short_names: vec!["ag".into()],
        namespaced: false,
        status_subresource: true,
        printer_columns: vec![
            PrinterColumn::new("ID", ".spec.id", "integer", "the agent id clients call"),
            PrinterColumn::new(
                "Nodes",
                ".status.nodes",
                "string",
                "nodes holding the agent's tunnels",
            ),
        ],
        schema: json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "required": ["id", "tokenSha256"], "properties": {
                "id": {"type": "integer", "minimum": 1},
                "tokenSha256": {"type": "string"}}},
            "status": {"type": "object", "properties": {
                "nodes": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"connected": {"type": "boolean"}}}}}}}}),
        validate,
    }
}

/// The rules `tunnel.agents` entries follow in a node's config.
fn validate(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match object.pointer("/spec/id").and_then(Value::as_i64) {
        Some(id) if id >= 1 => {}
        Some(_) => errors.push(invalid_at(object, "spec.id", "must be at least 1")),
        None => errors.push(FieldError::required("spec.id", "the agent id clients call")),
    }
    match object.pointer("/spec/tokenSha256").and_then(Value::as_str) {
        Some(digest) if is_sha256_hex(digest) => {}
        Some(_) => errors.push(invalid_at(
            object,
            "spec.tokenSha256",
            "expected 64 hex digits (sha256sum of the agent's token)",
        )),
        None => errors.push(FieldError::required(
            "spec.tokenSha256",
            "the SHA-256 of the agent's token",
        )),
    }
    errors
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(spec: Value) -> Value {
        json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
               "metadata": {"name": "agent-7"}, "spec": spec})
    }

    #[test]
    fn a_valid_agent_passes() {
        let valid = object(json!({"id": 7, "tokenSha256": "a".repeat(64)}));
        assert_eq!(validate(&valid), []);
    }

    #[test]
    fn each_mistake_names_its_field() {
        let errors = validate(&object(json!({"id": 0, "tokenSha256": "abc"})));
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(fields, ["spec.id", "spec.tokenSha256"]);
        let errors = validate(&object(json!({})));
        assert_eq!(
            errors
                .iter()
                .map(|error| error.kind.clone())
                .collect::<Vec<_>>(),
            [const { sluice_apimachinery::FieldErrorKind::Required }; 2]
        );
    }
}
