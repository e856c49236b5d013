//! Server-side apply and field ownership (kube's structured-merge-diff, for custom kinds):
//! `PATCH` with `application/apply-patch+yaml` merges a configuration into the object and makes
//! its manager own the fields it names; every other write records `Update` ownership of what
//! it changed, so a later apply by someone else conflicts with it instead of silently undoing
//! it. Pure functions: the clock comes from the caller.
//!
//! Simplifications against kube: every list is atomic (see [`walk`]); one version per kind, so
//! no conversion of field sets between versions; the control plane's own status writes (the
//! VMManager's) record no ownership.

pub mod fieldset;
pub mod managers;
pub mod walk;

use std::time::SystemTime;

use serde_json::{json, Value};

use crate::kind::KindSpec;
use crate::status::{StatusCause, StatusDetails, StatusError, StatusReason};
use crate::timestamp::format_rfc3339;
use fieldset::{render_path, FieldSet};
use managers::{Entry, Operation};
pub use walk::Scope;

/// Longest `fieldManager` kube accepts.
pub const MAX_FIELD_MANAGER: usize = 128;

fn options_invalid(field: &str, reason: &str, detail: String) -> StatusError {
    let message = format!("PatchOptions.meta.k8s.io \"\" is invalid: {field}: {detail}");
    let details = StatusDetails {
        group: "meta.k8s.io".into(),
        kind: "PatchOptions".into(),
        causes: vec![StatusCause {
            reason: reason.into(),
            message: detail,
            field: field.into(),
        }],
        ..StatusDetails::default()
    };
    StatusError {
        details: Some(Box::new(details)),
        ..StatusError::new(StatusReason::Invalid, message)
    }
}

/// The manager of a write: `?fieldManager=`, else (not for apply, where it is required) the
/// User-Agent up to its first `/` (`kubectl-edit/v1.32.0 ...` is `kubectl-edit`), as kube
/// derives it. 422 when missing for apply, too long or not printable.
pub fn field_manager(
    query: Option<&str>,
    user_agent: Option<&str>,
    apply: bool,
) -> Result<String, StatusError> {
    let manager = match query.filter(|m| !m.is_empty()) {
        Some(manager) => manager.to_string(),
        None if apply => {
            return Err(options_invalid(
                "fieldManager",
                "FieldValueRequired",
                "Required value: is required for apply patch".into(),
            ))
        }
        None => {
            let agent = user_agent.unwrap_or("");
            let prefix = agent.split('/').next().unwrap_or("");
            prefix.chars().take(MAX_FIELD_MANAGER).collect()
        }
    };
    if manager.chars().count() > MAX_FIELD_MANAGER {
        return Err(options_invalid(
            "fieldManager",
            "FieldValueTooLong",
            format!("Too long: may not be more than {MAX_FIELD_MANAGER} bytes"),
        ));
    }
    if let Some((at, bad)) = manager
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_control() || c.is_whitespace() && *c != ' ')
    {
        return Err(options_invalid(
            "fieldManager",
            "FieldValueInvalid",
            format!(
                "Invalid value: {manager:?}: invalid character U+{:04X} (at position {at})",
                u32::from(bad)
            ),
        ));
    }
    Ok(manager)
}

/// `?force=`: only for apply (422 on another patch, as kube).
pub fn force(query: Option<&str>, apply: bool) -> Result<bool, StatusError> {
    match (query, apply) {
        (None, _) => Ok(false),
        (Some(_), false) => Err(options_invalid(
            "force",
            "FieldValueForbidden",
            "Forbidden: may not be specified for non-apply patch".into(),
        )),
        (Some("true" | "1"), true) => Ok(true),
        (Some("false" | "0" | ""), true) => Ok(false),
        (Some(other), true) => Err(StatusError::bad_request(format!(
            "force: invalid boolean value {other:?}"
        ))),
    }
}

/// An apply body: a YAML (or JSON, which is YAML) object.
pub fn parse_config(body: &[u8]) -> Result<Value, StatusError> {
    let parsed: Result<Value, String> = match serde_json::from_slice::<Value>(body) {
        Ok(value) => Ok(value),
        Err(_) => serde_norway::from_slice::<Value>(body).map_err(|e| e.to_string()),
    };
    let config = parsed
        .map_err(|error| StatusError::bad_request(format!("error decoding YAML: {error}")))?;
    if !config.is_object() {
        return Err(StatusError::bad_request(
            "the apply configuration must be an object",
        ));
    }
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(StatusError::bad_request(
            "metadata.managedFields must be nil",
        ));
    }
    Ok(config)
}

/// The managed fields of `object`, or none when they do not decode (kube's fallback: a
/// write never fails on garbage someone stored).
fn stored_entries(object: &Value) -> Vec<Entry> {
    managers::decode(object).unwrap_or_default()
}

fn set_entries(object: &mut Value, entries: Vec<Entry>) {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let encoded = managers::encode(entries);
        if encoded.as_array().is_some_and(Vec::is_empty) {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), encoded);
        }
    }
}

fn take_entry(entries: &mut Vec<Entry>, probe: &Entry) -> Option<Entry> {
    let at = entries.iter().position(|e| e.same_manager(probe))?;
    Some(entries.remove(at))
}

fn new_entry(spec: &KindSpec, manager: &str, operation: Operation, scope: Scope) -> Entry {
    Entry {
        manager: manager.to_string(),
        operation,
        api_version: spec.api_version(),
        time: None,
        subresource: scope.subresource().map(str::to_string),
        fields: FieldSet::default(),
    }
}

/// Records an `Update` (create, PUT, merge or JSON patch) by `manager`: it owns what it set or
/// changed, nobody owns what it removed. `new` carries the client's `managedFields` (a PUT of
/// a read object) or the stored ones (a patch); a client's list is taken when it decodes
/// (kubectl's migration from client-side apply rewrites it), `[]` resets it, anything else
/// keeps the stored entries. A status write never takes the client's list.
pub fn record_update(
    spec: &KindSpec,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    scope: Scope,
    now: SystemTime,
) {
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let sent = new.pointer("/metadata/managedFields");
    let reset = sent.is_some_and(|m| m.as_array().is_some_and(Vec::is_empty));
    let mut entries = match managers::decode(new) {
        _ if reset => Vec::new(),
        Ok(entries) if scope == Scope::Main && !entries.is_empty() => entries,
        _ => stored_entries(old),
    };
    let schema = walk::root_schema(spec);
    let comparison = walk::compare(
        &schema,
        &walk::project(spec, old, scope),
        &walk::project(spec, new, scope),
    );
    let touched = comparison.changed().union(&comparison.removed);
    let probe = new_entry(spec, manager, Operation::Update, scope);
    let mine = take_entry(&mut entries, &probe);
    for entry in &mut entries {
        entry.fields = entry.fields.difference(&touched);
    }
    let mut mine = mine.unwrap_or(probe);
    mine.fields = mine.fields.difference(&comparison.removed);
    let changed = comparison.changed();
    if !changed.is_empty() {
        mine.fields = mine.fields.union(&changed);
        mine.time = Some(format_rfc3339(now));
    }
    entries.push(mine);
    set_entries(new, entries);
}

/// Applies `config` (parsed, checked by [`parse_config`]) by `manager` to `live` (the stored
/// object, or for a create the bare object with its name): the merged object with its
/// managedFields, still to pass the create or update rules. 409 `Conflict` with one
/// `FieldManagerConflict` cause per field another manager owns with another value, unless
/// `force`, which takes them over.
pub fn apply(
    spec: &KindSpec,
    live: &Value,
    mut config: Value,
    manager: &str,
    force: bool,
    scope: Scope,
    now: SystemTime,
) -> Result<Value, StatusError> {
    let schema = walk::root_schema(spec);
    if scope == Scope::Main && spec.status_subresource {
        if let Some(map) = config.as_object_mut() {
            map.remove("status");
        }
    }
    let applied = walk::applied_set(&schema, &walk::project(spec, &config, scope));
    let mut merged = match scope {
        Scope::Main => walk::merge(Some(&schema), live, &config),
        Scope::Status => {
            let status_only = json!({"status": config.get("status").cloned().unwrap_or(json!({}))});
            walk::merge(Some(&schema), live, &status_only)
        }
    };
    let mut entries = stored_entries(live);
    let probe = new_entry(spec, manager, Operation::Apply, scope);
    let previous = take_entry(&mut entries, &probe);
    if let Some(last) = &previous {
        let kept = entries
            .iter()
            .fold(applied.clone(), |all, e| all.union(&e.fields));
        walk::prune_object(&schema, &mut merged, &last.fields, &kept);
    }
    let comparison = walk::compare(
        &schema,
        &walk::project(spec, live, scope),
        &walk::project(spec, &merged, scope),
    );
    let changed = comparison.changed();
    if !force {
        let conflicts: Vec<(String, FieldSet)> = entries
            .iter()
            .map(|e| (describe(e), e.fields.intersection(&changed)))
            .filter(|(_, set)| !set.is_empty())
            .collect();
        if !conflicts.is_empty() {
            return Err(conflict_error(&conflicts));
        }
    }
    let lost = changed.union(&comparison.removed);
    for entry in &mut entries {
        entry.fields = entry.fields.difference(&lost);
    }
    let mut mine = previous.unwrap_or(probe);
    if mine.time.is_none() || !comparison.is_empty() {
        mine.time = Some(format_rfc3339(now));
    }
    mine.fields = applied;
    entries.push(mine);
    set_entries(&mut merged, entries);
    Ok(merged)
}

/// How kube names a manager in a conflict: `"kubectl"`, or for an update
/// `"kubectl-edit" using proxy.sluice.dev/v1alpha1`.
fn describe(entry: &Entry) -> String {
    let mut name = format!("{:?}", entry.manager);
    if let Some(subresource) = &entry.subresource {
        name = format!("{name} with subresource {subresource:?}");
    }
    match entry.operation {
        Operation::Update => format!("{name} using {}", entry.api_version),
        Operation::Apply => name,
    }
}

/// kube-apiserver's `NewApplyConflict`: one cause per field, managers in order.
fn conflict_error(conflicts: &[(String, FieldSet)]) -> StatusError {
    let mut sorted: Vec<&(String, FieldSet)> = conflicts.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut causes = Vec::new();
    let mut lines = Vec::new();
    for (manager, set) in sorted {
        lines.push(format!("conflicts with {manager}:"));
        for path in set.members() {
            let field = render_path(&path);
            lines.push(format!("- {field}"));
            causes.push(StatusCause {
                reason: "FieldManagerConflict".into(),
                message: format!("conflict with {manager}"),
                field,
            });
        }
    }
    let message = match causes.as_slice() {
        [only] => format!(
            "Apply failed with 1 conflict: {}: {}",
            only.message, only.field
        ),
        many => format!(
            "Apply failed with {} conflicts: {}",
            many.len(),
            lines.join("\n")
        ),
    };
    StatusError {
        details: Some(Box::new(StatusDetails {
            causes,
            ..StatusDetails::default()
        })),
        ..StatusError::new(StatusReason::Conflict, message)
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
