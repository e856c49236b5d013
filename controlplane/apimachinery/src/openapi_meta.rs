//! The `meta.k8s.io/v1` component schemas every group version document carries, so that
//! validation (kubectl `explain`, the server's strict field check) knows metadata's fields.

use serde_json::{json, Map, Value};

/// The definition prefix of `meta.k8s.io/v1` types.
pub const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
/// The ObjectMeta definition name.
pub const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn string_map() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}})
}

fn object_meta() -> Value {
    json!({
        "type": "object",
        "description": "Standard object's metadata.",
        "properties": {
            "annotations": string_map(),
            "creationTimestamp": {"type": "string", "format": "date-time"},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
            "deletionTimestamp": {"type": "string", "format": "date-time"},
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""},
                           "x-kubernetes-list-type": "set"},
            "generateName": {"type": "string"},
            "generation": {"type": "integer", "format": "int64"},
            "labels": string_map(),
            "managedFields": {"type": "array", "items": {"type": "object",
                              "x-kubernetes-preserve-unknown-fields": true}},
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "ownerReferences": {"type": "array", "items": {"allOf": [
                {"$ref": format!("#/components/schemas/{META}.OwnerReference")}]}},
            "resourceVersion": {"type": "string"},
            "selfLink": {"type": "string"},
            "uid": {"type": "string"},
        },
    })
}

fn owner_reference() -> Value {
    json!({
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": {"type": "string", "default": ""},
            "blockOwnerDeletion": {"type": "boolean"},
            "controller": {"type": "boolean"},
            "kind": {"type": "string", "default": ""},
            "name": {"type": "string", "default": ""},
            "uid": {"type": "string", "default": ""},
        },
    })
}

fn list_meta() -> Value {
    json!({
        "type": "object",
        "properties": {
            "continue": {"type": "string"},
            "remainingItemCount": {"type": "integer", "format": "int64"},
            "resourceVersion": {"type": "string"},
            "selfLink": {"type": "string"},
        },
    })
}

fn status() -> Value {
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "code": {"type": "integer", "format": "int32"},
            "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "kind": {"type": "string"},
            "message": {"type": "string"},
            "metadata": {"allOf": [{"$ref": format!("#/components/schemas/{META}.ListMeta")}]},
            "reason": {"type": "string"},
            "status": {"type": "string"},
        },
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}],
    })
}

fn delete_options() -> Value {
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "dryRun": {"type": "array", "items": {"type": "string", "default": ""}},
            "gracePeriodSeconds": {"type": "integer", "format": "int64"},
            "kind": {"type": "string"},
            "preconditions": {"type": "object", "properties": {
                "resourceVersion": {"type": "string"}, "uid": {"type": "string"}}},
            "propagationPolicy": {"type": "string"},
        },
    })
}

/// The shared schemas, keyed by definition name.
pub fn meta_schemas() -> Map<String, Value> {
    let mut schemas = Map::new();
    schemas.insert(OBJECT_META.to_string(), object_meta());
    schemas.insert(format!("{META}.OwnerReference"), owner_reference());
    schemas.insert(format!("{META}.ListMeta"), list_meta());
    schemas.insert(format!("{META}.Status"), status());
    schemas.insert(format!("{META}.DeleteOptions"), delete_options());
    schemas.insert(
        format!("{META}.Patch"),
        json!({"type": "object", "description": "A JSON patch or merge patch document."}),
    );
    schemas
}

/// The ObjectMeta schema (for the server's own unknown-field check).
pub fn object_meta_schema() -> Value {
    object_meta()
}

/// The OwnerReference schema (for the server's own unknown-field check).
pub fn owner_reference_schema() -> Value {
    owner_reference()
}
