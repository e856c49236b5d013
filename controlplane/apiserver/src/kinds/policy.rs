//! What the three `policy.sluice.dev/v1alpha1` kinds share: the group, the shape of the
//! declaration, and validation by `sluice-policy-model`, whose checks the VM agent's file loader
//! runs too, so an object is refused with the reason a policy file would get.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_policy_model::object;

use super::invalid_at;

pub const GROUP: &str = "policy.sluice.dev";
pub const VERSION: &str = "v1alpha1";

/// The names a policy kind is served under.
pub struct Names {
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short: &'static str,
}

/// A cluster-scoped policy kind without status. Groups are cluster-wide in the model (policies
/// name them without a namespace), and a policy carries its source namespace in `spec` (see
/// `network_policy`), so every kind is cluster-scoped.
pub fn policy_kind(
    names: Names,
    printer_columns: Vec<PrinterColumn>,
    spec_description: &str,
    validate: fn(&Value) -> Vec<FieldError>,
) -> KindSpec {
    KindSpec {
        group: GROUP.into(),
        version: VERSION.into(),
        kind: names.kind.into(),
        plural: names.plural.into(),
        singular: names.singular.into(),
        short_names: vec![names.short.into()],
        namespaced: false,
        status_subresource: false,
        printer_columns,
        // The spec's structure is checked by the model (unknown fields and wrong types are
        // errors there, with their path and the file loader's words), so the schema only says
        // it is a required object; typed properties here would answer first, in other words.
        schema: json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "description": spec_description,
                     "x-kubernetes-preserve-unknown-fields": true}}}),
        validate,
    }
}

/// The model's check of the object's name and spec, at the object's paths, quoting the value
/// found there.
pub fn model_errors(
    object: &Value,
    check: fn(&str, &Value) -> Vec<object::FieldError>,
) -> Vec<FieldError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let spec = object.get("spec").unwrap_or(&Value::Null);
    check(name, spec)
        .into_iter()
        .map(|error| invalid_at(object, &error.path, error.reason))
        .collect()
}

#[cfg(test)]
pub mod tests {
    use serde_json::Value;
    use std::time::SystemTime;

    /// A YAML example from `test_support::examples` as the JSON object a client sends.
    pub fn example(yaml: &str) -> Value {
        let yaml: serde_norway::Value = serde_norway::from_str(yaml).expect("example parses");
        serde_json::to_value(yaml).expect("example is JSON")
    }

    /// Whether the API machinery accepts `object` on create (metadata rules, schema, the
    /// kind's validator).
    pub fn created(kind: &sluice_apimachinery::KindSpec, object: Value) -> Value {
        sluice_apimachinery::meta::prepare_create(kind, object, None, SystemTime::UNIX_EPOCH, "u")
            .expect("the example is a valid object")
    }
}
