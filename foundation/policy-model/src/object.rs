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

/// What a VM agent enforces, from the objects it was sent, and the policies left out for now.
#[derive(Debug)]
pub struct LoadedObjects {
    pub set: crate::model::PolicySet,
    /// Policies naming a group the agent does not hold (yet): objects arrive on separate
    /// watches, so a policy may come before its groups or outlive one briefly. Antrea's agent
    /// likewise realizes a policy once it holds its groups.
    pub waiting: Vec<String>,
}

/// The policy set a VM agent enforces, from the objects it was sent: each object becomes its
/// entry in a policy file (its `spec` with its `metadata.name`), and the whole is checked as one
/// file is (unique priorities, valid references), `origin` naming it in errors. Policies whose
/// groups are not all present wait (see [`LoadedObjects::waiting`]).
pub fn load_objects<'a>(
    address_groups: impl IntoIterator<Item = &'a Value>,
    applied_to_groups: impl IntoIterator<Item = &'a Value>,
    policies: impl IntoIterator<Item = &'a Value>,
    origin: &str,
) -> Result<LoadedObjects, sluice_config_error::InvalidConfig> {
    let address_groups = entries(address_groups);
    let applied_to_groups = entries(applied_to_groups);
    let names = |groups: &[Value]| -> std::collections::BTreeSet<String> {
        groups
            .iter()
            .filter_map(|group| group.get("name")?.as_str().map(str::to_string))
            .collect()
    };
    let (known_peers, known_targets) = (names(&address_groups), names(&applied_to_groups));
    let (ready, waiting): (Vec<Value>, Vec<Value>) = entries(policies)
        .into_iter()
        .partition(|policy| references(policy, &known_peers, &known_targets));
    let mut document = Map::new();
    document.insert("addressGroups".into(), Value::Array(address_groups));
    document.insert("appliedToGroups".into(), Value::Array(applied_to_groups));
    document.insert("policies".into(), Value::Array(ready));
    let text = Value::Object(document).to_string();
    let set = crate::load::load_str(&text, origin, crate::load::Format::Json)?;
    let waiting = waiting
        .iter()
        .map(|policy| {
            policy
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect();
    Ok(LoadedObjects { set, waiting })
}

/// Each object as its policy-file entry: its spec with its name.
fn entries<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Vec<Value> {
    objects
        .into_iter()
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
}

/// Whether every group a policy entry names is among the known ones.
fn references(
    policy: &Value,
    peers: &std::collections::BTreeSet<String>,
    targets: &std::collections::BTreeSet<String>,
) -> bool {
    let listed = |value: Option<&Value>| -> Vec<String> {
        value
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| name.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let targets_known = listed(policy.get("appliedTo"))
        .iter()
        .all(|name| targets.contains(name));
    let rules = policy
        .get("rules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let peers_known = rules.iter().all(|rule| {
        listed(rule.pointer("/peers/addressGroups"))
            .iter()
            .all(|name| peers.contains(name))
    });
    targets_known && peers_known
}

#[cfg(test)]
mod tests;
