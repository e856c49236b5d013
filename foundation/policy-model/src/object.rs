//! Policy objects as the control plane stores them: one `NetworkPolicy`, `AddressGroup` or
//! `AppliedToGroup` per object, named by `metadata.name`, whose `spec` is the object's entry in
//! a policy file without its `name` (a policy keeps its optional `namespace` in the spec).
//!
//! Each object is checked by the file loader's own code, so a mistake gets the file's reason at
//! the object's path (`policies[0].rules[1].action` in a file is `spec.rules[1].action` here,
//! `…name` is `metadata.name`). What one object cannot know is left out: whether the groups a
//! policy names exist (objects are created in any order; the agent compiles a policy once it
//! holds its groups), names unique across objects (the store's business) and policy priorities
//! unique across policies (the agent's compiler refuses a clash in its span). What only the
//! control plane needs is added: every applied-to member names its `vm`, since that decides
//! which agents receive the group.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::load::raw::{RawAddressGroup, RawAppliedToGroup, RawPolicy};
use crate::load::validate::{self, Bridges, Known};
use crate::load::{deserialize_tracked, Errors};
pub use sluice_config_error::FieldError;

/// The errors of a `NetworkPolicy` object named `name` with this `spec`.
pub fn validate_network_policy(name: &str, spec: &Value) -> Vec<FieldError> {
    check::<RawPolicy>(name, spec, |raw, errors| {
        validate::validate_policy(raw, "spec", Known::Anything, errors);
    })
}

/// The errors of an `AddressGroup` object named `name` with this `spec`.
pub fn validate_address_group(name: &str, spec: &Value) -> Vec<FieldError> {
    check::<RawAddressGroup>(name, spec, |raw, errors| {
        validate::address_group(raw, "spec", errors);
    })
}

/// The errors of an `AppliedToGroup` object named `name` with this `spec`.
pub fn validate_applied_to_group(name: &str, spec: &Value) -> Vec<FieldError> {
    check::<RawAppliedToGroup>(name, spec, |raw, errors| {
        validate::applied_to_group(raw, "spec", errors);
        for (index, member) in raw.members.iter().enumerate() {
            if member.vm.is_none() {
                errors.push(
                    format!("spec.members[{index}].vm"),
                    "must name the VM the interface is attached to (its vm-agent enforces the group)",
                );
            }
        }
        let members = raw.members.iter().enumerate();
        let members = members.map(|(index, member)| (format!("spec.members[{index}]"), member));
        validate::check_ports_owned_once(members, Bridges::PerVm, errors);
    })
}

/// Deserializes the object's entry, then runs `validate` on it. The validators see the name
/// at `spec.name`, where the entry carries it; the object keeps it in `metadata.name`.
fn check<T: DeserializeOwned>(
    name: &str,
    spec: &Value,
    validate: impl FnOnce(&T, &mut Errors),
) -> Vec<FieldError> {
    let mut errors = Errors::default();
    if let Some(raw) = entry::<T>(name, spec, &mut errors) {
        let mut checked = Errors::default();
        validate(&raw, &mut checked);
        for error in checked.list {
            let path = match error.path.as_str() {
                "spec.name" => "metadata.name".to_string(),
                _ => error.path,
            };
            errors.push(path, error.reason);
        }
    }
    errors.list
}

/// Deserializes the file entry an object stands for: its spec with the object's name added.
/// Paths of the errors recorded are the object's (`spec.…`).
fn entry<T: DeserializeOwned>(name: &str, spec: &Value, errors: &mut Errors) -> Option<T> {
    let mut fields = match spec {
        Value::Object(fields) => fields.clone(),
        Value::Null => Map::new(),
        _ => {
            errors.push("spec", "must be a mapping");
            return None;
        }
    };
    // The name belongs in metadata; in the spec it is as unknown as in a file entry's body.
    if fields.remove("name").is_some() {
        errors.push("spec.name", "unknown field");
    }
    fields.insert("name".into(), Value::String(name.into()));
    let mut entry_errors = Errors::default();
    let raw = deserialize_tracked(Value::Object(fields), &mut entry_errors);
    for error in entry_errors.list {
        errors.push(under_spec(&error.path), error.reason);
    }
    raw
}

fn under_spec(path: &str) -> String {
    if path.is_empty() {
        "spec".into()
    } else {
        format!("spec.{path}")
    }
}

/// The policy set a VM agent enforces, from the objects it was sent: each object becomes its
/// entry in a policy file (its `spec` with its `metadata.name`), and the whole is checked as one
/// file is (group references, unique priorities), `origin` naming it in errors.
pub fn load_objects<'a>(
    address_groups: impl IntoIterator<Item = &'a Value>,
    applied_to_groups: impl IntoIterator<Item = &'a Value>,
    policies: impl IntoIterator<Item = &'a Value>,
    origin: &str,
) -> Result<crate::model::PolicySet, sluice_config_error::InvalidConfig> {
    let entries = |objects: &mut dyn Iterator<Item = &'a Value>| -> Vec<Value> {
        objects
            .map(|object| {
                let mut entry = object
                    .get("spec")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let name = object
                    .pointer("/metadata/name")
                    .cloned()
                    .unwrap_or(Value::Null);
                entry.insert("name".into(), name);
                Value::Object(entry)
            })
            .collect()
    };
    let mut document = Map::new();
    document.insert(
        "addressGroups".into(),
        Value::Array(entries(&mut address_groups.into_iter())),
    );
    document.insert(
        "appliedToGroups".into(),
        Value::Array(entries(&mut applied_to_groups.into_iter())),
    );
    document.insert(
        "policies".into(),
        Value::Array(entries(&mut policies.into_iter())),
    );
    crate::load::load_str(
        &Value::Object(document).to_string(),
        origin,
        crate::load::Format::Json,
    )
}

#[cfg(test)]
mod tests;
