//! Object metadata rules of create, update, status update and delete (kube-apiserver's
//! `rest.BeforeCreate`/`BeforeUpdate` and the CRD strategy), as pure functions: the clock and
//! the uid come from the caller, the resourceVersion from the store.

use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::kind::KindSpec;
use crate::names::{
    dns1123_label_error, dns1123_subdomain_error, label_key_error, label_value_error,
};
use crate::status::{FieldError, StatusError};
use crate::timestamp::format_rfc3339;

/// The object's `metadata.name` ("" when absent).
pub fn object_name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The object's `metadata.namespace` ("" when absent).
pub fn object_namespace(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The object's `metadata.resourceVersion` ("" when absent).
pub fn object_resource_version(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sets `metadata.resourceVersion` to the store's revision (as a decimal string).
pub fn set_resource_version(obj: &mut Value, revision: u64) {
    if let Some(meta) = metadata_mut(obj) {
        meta.insert("resourceVersion".into(), json!(revision.to_string()));
    }
}

fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = obj.as_object_mut()?;
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

/// 400 unless the body is an object of this kind's apiVersion and kind.
fn check_type(spec: &KindSpec, obj: &Value) -> Result<(), StatusError> {
    if !obj.is_object() {
        return Err(StatusError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let expected_api_version = spec.api_version();
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api_version != expected_api_version {
        return Err(StatusError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API \
             version ({expected_api_version})"
        )));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != spec.kind {
        return Err(StatusError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            spec.kind
        )));
    }
    if obj.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(StatusError::bad_request("metadata must be a JSON object"));
    }
    Ok(())
}

/// The 5-character suffix of a generated name, drawn from the uid so the function stays pure
/// (kube's alphabet avoids vowels and look-alike digits).
fn generated_suffix(uid: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let digest = sha2_digest(uid.as_bytes());
    digest[..5]
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn sha2_digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// Labels, annotations and finalizers must be string maps/lists with valid label syntax.
fn metadata_errors(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match obj.pointer("/metadata/labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(labels)) => {
            for (key, value) in labels {
                if let Some(reason) = label_key_error(key) {
                    errors.push(FieldError::invalid("metadata.labels", json!(key), reason));
                }
                match value.as_str() {
                    Some(text) => {
                        if let Some(reason) = label_value_error(text) {
                            errors.push(FieldError::invalid(
                                "metadata.labels",
                                json!(text),
                                reason,
                            ));
                        }
                    }
                    None => errors.push(FieldError::invalid(
                        format!("metadata.labels.{key}"),
                        value.clone(),
                        "must be a string",
                    )),
                }
            }
        }
        Some(other) => errors.push(FieldError::invalid(
            "metadata.labels",
            other.clone(),
            "must be a map",
        )),
    }
    if let Some(annotations) = obj.pointer("/metadata/annotations") {
        let all_strings = annotations
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string));
        if !annotations.is_null() && !all_strings {
            errors.push(FieldError::invalid(
                "metadata.annotations",
                annotations.clone(),
                "must be a map of strings",
            ));
        }
        if let Some(map) = annotations.as_object() {
            errors.extend(crate::limits::annotation_errors(map));
        }
    }
    if let Some(finalizers) = obj.pointer("/metadata/finalizers") {
        let all_strings = finalizers
            .as_array()
            .is_some_and(|f| f.iter().all(Value::is_string));
        if !finalizers.is_null() && !all_strings {
            errors.push(FieldError::invalid(
                "metadata.finalizers",
                finalizers.clone(),
                "must be a list of strings",
            ));
        }
    }
    errors
}

fn validated(spec: &KindSpec, obj: Value) -> Result<Value, StatusError> {
    let mut errors = crate::schema::schema_errors(spec, &obj);
    errors.extend(metadata_errors(&obj));
    // Semantic checks assume the structure holds; running them on a mistyped object would
    // only repeat the schema errors in other words.
    if errors.is_empty() {
        errors.extend((spec.validate)(&obj));
    }
    if errors.is_empty() {
        Ok(obj)
    } else {
        Err(StatusError::invalid(spec, object_name(&obj), &errors))
    }
}

/// Prepares a new object for the store: checks type, name and namespace, sets uid,
/// creationTimestamp and generation 1, clears what only the server may set, drops `status`
/// when it is a subresource, validates. `namespace` is the request path's namespace.
pub fn prepare_create(
    spec: &KindSpec,
    obj: Value,
    namespace: Option<&str>,
    now: SystemTime,
    uid: &str,
) -> Result<Value, StatusError> {
    check_type(spec, &obj)?;
    let mut obj = obj;
    let name = object_name(&obj).to_string();
    let generate_name = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = match (name.is_empty(), generate_name.is_empty()) {
        (false, _) => name,
        (true, false) => format!("{generate_name}{}", generated_suffix(uid)),
        (true, true) => {
            let error = FieldError::required("metadata.name", "name or generateName is required");
            return Err(StatusError::invalid(spec, "", &[error]));
        }
    };
    if let Some(reason) = dns1123_subdomain_error(&name) {
        let error = FieldError::invalid("metadata.name", json!(name), reason);
        return Err(StatusError::invalid(spec, &name, &[error]));
    }
    let namespace = resolve_namespace(spec, &obj, namespace, &name)?;
    if spec.status_subresource {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
    if let Some(meta) = metadata_mut(&mut obj) {
        meta.insert("name".into(), json!(name));
        match &namespace {
            Some(ns) => meta.insert("namespace".into(), json!(ns)),
            None => meta.remove("namespace"),
        };
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(format_rfc3339(now)));
        meta.insert("generation".into(), json!(1));
        for server_only in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            meta.remove(server_only);
        }
    }
    validated(spec, obj)
}

/// The namespace the object is stored in: the path's for namespaced kinds (the body may repeat
/// it, not contradict it), none for cluster-scoped ones (a body namespace is dropped as kube
/// does).
fn resolve_namespace(
    spec: &KindSpec,
    obj: &Value,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<String>, StatusError> {
    let in_body = object_namespace(obj);
    if !spec.namespaced {
        if namespace.is_some_and(|ns| !ns.is_empty()) {
            return Err(StatusError::bad_request(format!(
                "{} is cluster-scoped: it cannot be created in a namespace",
                spec.qualified_resource()
            )));
        }
        return Ok(None);
    }
    let Some(path_namespace) = namespace.filter(|ns| !ns.is_empty()) else {
        let error = FieldError::required("metadata.namespace", "");
        return Err(StatusError::invalid(spec, name, &[error]));
    };
    if !in_body.is_empty() && in_body != path_namespace {
        return Err(StatusError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if let Some(reason) = dns1123_label_error(path_namespace) {
        let error = FieldError::invalid("metadata.namespace", json!(path_namespace), reason);
        return Err(StatusError::invalid(spec, name, &[error]));
    }
    Ok(Some(path_namespace.to_string()))
}

/// Everything but metadata (and status when it is a subresource): what `generation` counts.
fn generation_relevant(spec: &KindSpec, obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        if spec.status_subresource {
            map.remove("status");
        }
    }
    copy
}

/// Checks identity and the optimistic-concurrency precondition shared by update and status
/// update: same name and namespace, same uid if given, and a resourceVersion equal to the
/// stored one (409 when stale, 422 when missing: custom kinds allow no unconditional update).
fn check_update_identity(spec: &KindSpec, old: &Value, new: &Value) -> Result<(), StatusError> {
    check_type(spec, new)?;
    let name = object_name(old);
    if object_name(new) != name {
        return Err(StatusError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            object_name(new)
        )));
    }
    if spec.namespaced
        && !object_namespace(new).is_empty()
        && object_namespace(new) != object_namespace(old)
    {
        return Err(StatusError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if let Some(uid) = new.pointer("/metadata/uid").and_then(Value::as_str) {
        if Some(uid) != old.pointer("/metadata/uid").and_then(Value::as_str) {
            let error = FieldError::invalid("metadata.uid", json!(uid), "field is immutable");
            return Err(StatusError::invalid(spec, name, &[error]));
        }
    }
    match object_resource_version(new) {
        "" => {
            let error = FieldError::invalid(
                "metadata.resourceVersion",
                json!(0),
                "must be specified for an update",
            );
            Err(StatusError::invalid(spec, name, &[error]))
        }
        rv if rv != object_resource_version(old) => Err(StatusError::conflict(spec, name)),
        _ => Ok(()),
    }
}

/// Keys of metadata only the server sets: an update keeps the stored values.
const PRESERVED_ON_UPDATE: [&str; 6] = [
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "namespace",
];

/// Prepares an update of the main resource: identity and resourceVersion checked, server-set
/// metadata kept, `status` kept from `old` when it is a subresource, generation bumped only
/// when something besides metadata (and status) changed, no new finalizers while deleting.
pub fn prepare_update(spec: &KindSpec, old: &Value, new: Value) -> Result<Value, StatusError> {
    check_update_identity(spec, old, &new)?;
    let mut obj = new;
    if spec.status_subresource {
        if let Some(map) = obj.as_object_mut() {
            match old.get("status") {
                Some(status) => map.insert("status".into(), status.clone()),
                None => map.remove("status"),
            };
        }
    }
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let changed = generation_relevant(spec, old) != generation_relevant(spec, &obj);
    if let Some(meta) = metadata_mut(&mut obj) {
        for key in PRESERVED_ON_UPDATE {
            match old_meta.get(key) {
                Some(value) => meta.insert(key.into(), value.clone()),
                None => meta.remove(key),
            };
        }
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        meta.insert(
            "generation".into(),
            json!(if changed { generation + 1 } else { generation }),
        );
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let before = finalizers(old);
        if let Some(added) = finalizers(&obj).into_iter().find(|f| !before.contains(f)) {
            let error = FieldError::forbidden(
                "metadata.finalizers",
                format!("no new finalizers can be added if the object is being deleted, found new finalizers [{added:?}]"),
            );
            return Err(StatusError::invalid(spec, object_name(old), &[error]));
        }
    }
    validated(spec, obj)
}

/// Prepares a status update: only `status` is taken from `new`; metadata and spec stay.
pub fn prepare_status_update(
    spec: &KindSpec,
    old: &Value,
    new: Value,
) -> Result<Value, StatusError> {
    check_update_identity(spec, old, &new)?;
    let mut obj = old.clone();
    if let Some(map) = obj.as_object_mut() {
        match new.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
    }
    validated(spec, obj)
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a stored object has finished finalizing: being deleted and no finalizer left. The
/// server deletes it instead of storing the update that emptied its finalizers.
pub fn finalized(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some() && finalizers(obj).is_empty()
}

/// What a DELETE does to a stored object.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// No finalizers: remove it from the store now.
    DeleteNow,
    /// Finalizers hold it: store this object (deletionTimestamp set) and answer 200 with it.
    MarkDeleting(Value),
    /// Already being deleted: nothing to write; answer 200 with the object as stored.
    AlreadyDeleting,
}

/// Starts the deletion of `old`: immediate without finalizers, otherwise a deletionTimestamp.
pub fn begin_delete(old: &Value, now: SystemTime) -> DeleteOutcome {
    if finalizers(old).is_empty() {
        return DeleteOutcome::DeleteNow;
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        return DeleteOutcome::AlreadyDeleting;
    }
    let mut marked = old.clone();
    if let Some(meta) = metadata_mut(&mut marked) {
        meta.insert("deletionTimestamp".into(), json!(format_rfc3339(now)));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        // kube bumps generation when it sets deletionTimestamp, so controllers see a change.
        let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(1);
        meta.insert("generation".into(), json!(generation + 1));
    }
    DeleteOutcome::MarkDeleting(marked)
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
