//! `auth.sluice.dev/v1alpha1 Token`: cluster-scoped; a bearer token the control plane accepts,
//! stored as the SHA-256 of its text with the role and subject it stands for. Only `admin`
//! may read or write them; `sluice controlplane token create` makes one and prints its text.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};

use super::invalid_at;
use crate::auth::{Identity, Role};

pub fn token() -> KindSpec {
    KindSpec {
        group: "auth.sluice.dev".into(),
        version: "v1alpha1".into(),
        kind: "Token".into(),
        plural: "tokens".into(),
        singular: "token".into(),
        short_names: vec!["tok".into()],
        namespaced: false,
        status_subresource: false,
        printer_columns: vec![
            PrinterColumn::new("Role", ".spec.role", "string", "what the token may do"),
            PrinterColumn::new("Subject", ".spec.subject", "string", "whose token it is"),
        ],
        schema: json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "required": ["role", "subject", "tokenSha256"], "properties": {
                "role": {"type": "string", "enum": ["admin", "gateway", "node", "vm-agent"]},
                "subject": {"type": "string"},
                "tokenSha256": {"type": "string"}}}}}),
        validate,
    }
}

/// The identity a stored Token object stands for, and its digest.
pub fn token_identity(object: &Value) -> Option<(String, Identity)> {
    let spec = object.get("spec")?;
    let role: Role = spec.get("role")?.as_str()?.parse().ok()?;
    let identity = Identity::new(role, spec.get("subject")?.as_str()?).ok()?;
    let digest = spec.get("tokenSha256")?.as_str()?.to_string();
    Some((digest, identity))
}

fn validate(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let role = object.pointer("/spec/role").and_then(Value::as_str);
    match role.map(str::parse::<Role>) {
        Some(Ok(_)) => {}
        Some(Err(error)) => errors.push(invalid_at(object, "spec.role", error.to_string())),
        None => errors.push(FieldError::required(
            "spec.role",
            "admin, gateway, node or vm-agent",
        )),
    }
    match object.pointer("/spec/subject").and_then(Value::as_str) {
        Some(subject) => {
            if let Err(error) = Identity::new(Role::Admin, subject) {
                errors.push(invalid_at(object, "spec.subject", error.to_string()));
            }
        }
        None => errors.push(FieldError::required("spec.subject", "whose token it is")),
    }
    match object.pointer("/spec/tokenSha256").and_then(Value::as_str) {
        Some(digest) if digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()) => {}
        Some(_) => errors.push(invalid_at(
            object,
            "spec.tokenSha256",
            "expected 64 hex digits (the SHA-256 of the token)",
        )),
        None => errors.push(FieldError::required(
            "spec.tokenSha256",
            "the SHA-256 of the token",
        )),
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_identity() {
        let object =
            json!({"spec": {"role": "gateway", "subject": "gw-1", "tokenSha256": "a".repeat(64)}});
        assert_eq!(validate(&object), []);
        let (digest, identity) = token_identity(&object).unwrap();
        assert_eq!(digest, "a".repeat(64));
        assert_eq!(identity.user_name(), "sluice:gateway:gw-1");
    }

    #[test]
    fn each_mistake_names_its_field() {
        let object = json!({"spec": {"role": "root", "subject": "Gw_1", "tokenSha256": "x"}});
        let fields: Vec<String> = validate(&object)
            .into_iter()
            .map(|error| error.field)
            .collect();
        assert_eq!(fields, ["spec.role", "spec.subject", "spec.tokenSha256"]);
        assert!(token_identity(&object).is_none());
    }
}
