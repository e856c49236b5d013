//! The typed walks of server-side apply over JSON objects and the kind's OpenAPI schema: the
//! field set an applied configuration names, the comparison of two objects, the merge of a
//! configuration into the live object, and the pruning of fields nobody owns any more.
//!
//! Types come from the schema as kube derives them from a CRD's: `properties` are a struct's
//! declared fields; other keys (an `additionalProperties` map, or anything under
//! `x-kubernetes-preserve-unknown-fields`) are map entries, members in their own right; a map
//! with `x-kubernetes-map-type: atomic` is one field. Simplification: **every list is atomic**
//! (owned and replaced as a whole), which is kube's default for CRDs without
//! `x-kubernetes-list-type`; none of Sluice's kinds declares list-map keys.

use serde_json::{json, Map, Value};

use super::fieldset::{field, FieldSet};
use crate::kind::KindSpec;
use crate::openapi_meta::object_meta_schema;

/// Metadata only the server sets: never owned, never compared (kube's stripped fields).
const SERVER_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// What a write may own: the main resource (everything but server-set metadata and, when it
/// is a subresource, status) or the `status` subresource (only status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Main,
    Status,
}

impl Scope {
    /// The `subresource` of a managedFields entry.
    pub fn subresource(self) -> Option<&'static str> {
        match self {
            Scope::Main => None,
            Scope::Status => Some("status"),
        }
    }
}

/// The schema of a whole object: apiVersion, kind, ObjectMeta and the kind's properties.
pub fn root_schema(spec: &KindSpec) -> Value {
    let mut properties = Map::new();
    properties.insert("apiVersion".into(), json!({"type": "string"}));
    properties.insert("kind".into(), json!({"type": "string"}));
    properties.insert("metadata".into(), object_meta_schema());
    if let Some(own) = spec.schema.get("properties").and_then(Value::as_object) {
        properties.extend(own.clone());
    }
    json!({"type": "object", "properties": properties})
}

/// The part of `object` a write in `scope` may own, as a copy.
pub fn project(spec: &KindSpec, object: &Value, scope: Scope) -> Value {
    let Some(map) = object.as_object() else {
        return json!({});
    };
    let mut out = Map::new();
    match scope {
        Scope::Status => {
            if let Some(status) = map.get("status") {
                out.insert("status".into(), status.clone());
            }
        }
        Scope::Main => {
            for (key, value) in map {
                match key.as_str() {
                    "apiVersion" | "kind" => {}
                    "status" if spec.status_subresource => {}
                    "metadata" => {
                        let mut meta = value.as_object().cloned().unwrap_or_default();
                        meta.retain(|k, _| !SERVER_METADATA.contains(&k.as_str()));
                        out.insert(key.clone(), Value::Object(meta));
                    }
                    _ => {
                        out.insert(key.clone(), value.clone());
                    }
                }
            }
            // Every stored object has metadata: a create adds none of it by itself.
            out.entry("metadata").or_insert_with(|| json!({}));
        }
    }
    Value::Object(out)
}

/// The schema of `key` under `schema`, and whether it is a declared (struct) field.
fn child_schema<'a>(schema: Option<&'a Value>, key: &str) -> (Option<&'a Value>, bool) {
    let Some(schema) = schema else {
        return (None, false);
    };
    if let Some(declared) = schema.pointer(&format!("/properties/{}", escape(key))) {
        return (Some(declared), true);
    }
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    (additional, false)
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A JSON object walked field by field (lists and atomic maps are single fields).
fn granular<'a>(schema: Option<&Value>, value: &'a Value) -> Option<&'a Map<String, Value>> {
    let atomic = schema.and_then(|s| s.get("x-kubernetes-map-type")) == Some(&json!("atomic"));
    value.as_object().filter(|_| !atomic)
}

/// The fields an applied configuration (already projected) sets.
pub fn applied_set(schema: &Value, config: &Value) -> FieldSet {
    let mut set = FieldSet::default();
    if let Some(map) = granular(Some(schema), config) {
        // Every object has metadata (its name at least): only what is in it is owned.
        let mut map = map.clone();
        if map
            .get("metadata")
            .is_some_and(|m| m.as_object().is_some_and(Map::is_empty))
        {
            map.remove("metadata");
        }
        collect_applied(Some(schema), &map, &mut Vec::new(), &mut set);
    }
    set
}

fn collect_applied(
    schema: Option<&Value>,
    map: &Map<String, Value>,
    path: &mut Vec<String>,
    set: &mut FieldSet,
) {
    for (key, child) in map {
        let (child_schema, declared) = child_schema(schema, key);
        path.push(field(key));
        let inner = granular(child_schema, child).filter(|m| !m.is_empty());
        match inner {
            Some(inner) => {
                collect_applied(child_schema, inner, path, set);
                // Map entries are fields of their own; a struct's field is only its leaves.
                if !declared {
                    set.insert(path);
                }
            }
            None => set.insert(path),
        }
        path.pop();
    }
}

/// What changed from one (projected) object to another, as kube's `typed.Compare`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

impl Comparison {
    /// Fields set or changed (what an update takes from other managers).
    pub fn changed(&self) -> FieldSet {
        self.added.union(&self.modified)
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.removed.is_empty()
    }
}

pub fn compare(schema: &Value, old: &Value, new: &Value) -> Comparison {
    let mut out = Comparison::default();
    compare_node(
        Some(schema),
        Some(old),
        Some(new),
        &mut Vec::new(),
        &mut out,
    );
    out
}

fn compare_node(
    schema: Option<&Value>,
    old: Option<&Value>,
    new: Option<&Value>,
    path: &mut Vec<String>,
    out: &mut Comparison,
) {
    let old_map = old.and_then(|v| granular(schema, v));
    let new_map = new.and_then(|v| granular(schema, v));
    if let (Some(old_map), Some(new_map)) = (old_map, new_map) {
        let keys = old_map
            .keys()
            .chain(new_map.keys().filter(|k| !old_map.contains_key(*k)));
        for key in keys {
            let (child_schema, _) = child_schema(schema, key);
            path.push(field(key));
            compare_node(child_schema, old_map.get(key), new_map.get(key), path, out);
            path.pop();
        }
        return;
    }
    match (old, new) {
        (None, Some(_)) => out.added.insert(path),
        (Some(_), None) => out.removed.insert(path),
        (Some(old), Some(new)) if old != new => out.modified.insert(path),
        _ => return,
    }
    // A map that appeared or went away: its entries did too.
    for (map, is_new) in [(old_map, false), (new_map, true)] {
        for (key, child) in map.into_iter().flatten() {
            let (child_schema, _) = child_schema(schema, key);
            path.push(field(key));
            let (before, after) = if is_new {
                (None, Some(child))
            } else {
                (Some(child), None)
            };
            compare_node(child_schema, before, after, path, out);
            path.pop();
        }
    }
}

/// The live object with the configuration merged in: maps field by field, lists and scalars
/// replaced; a `null` in the configuration removes the field.
pub fn merge(schema: Option<&Value>, live: &Value, config: &Value) -> Value {
    let (Some(live_map), Some(config_map)) = (granular(schema, live), granular(schema, config))
    else {
        return without_nulls(config);
    };
    let mut out = live_map.clone();
    for (key, value) in config_map {
        if value.is_null() {
            out.remove(key);
            continue;
        }
        let (child_schema, _) = child_schema(schema, key);
        let merged = match live_map.get(key) {
            Some(current) => merge(child_schema, current, value),
            None => without_nulls(value),
        };
        out.insert(key.clone(), merged);
    }
    Value::Object(out)
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Removes from a whole object the fields the applier owned (`last`) that no manager owns now
/// (`kept`: the new applied set and every other manager's). `metadata` itself stays whatever
/// happens to its owned fields: the server's own keys are in no set.
pub fn prune_object(schema: &Value, object: &mut Value, last: &FieldSet, kept: &FieldSet) {
    let element = [field("metadata")];
    if let (Some(meta), Some(last_meta)) = (object.get_mut("metadata"), last.at(&element)) {
        let kept_meta = kept.at(&element).cloned().unwrap_or_default();
        let (meta_schema, _) = child_schema(Some(schema), "metadata");
        prune(meta_schema, meta, last_meta, &kept_meta);
    }
    let last = last.without(&element);
    prune(Some(schema), object, &last, kept);
}

fn prune(schema: Option<&Value>, value: &mut Value, last: &FieldSet, kept: &FieldSet) {
    let atomic = granular(schema, value).is_none();
    let Some(map) = value.as_object_mut().filter(|_| !atomic) else {
        return;
    };
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let element = [field(&key)];
        let Some(last_child) = last.at(&element).filter(|s| !s.is_empty()) else {
            continue;
        };
        match kept.at(&element).filter(|s| !s.is_empty()) {
            None => {
                map.remove(&key);
            }
            Some(kept_child) => {
                let (child_schema, _) = child_schema(schema, &key);
                if let Some(child) = map.get_mut(&key) {
                    prune(child_schema, child, last_child, kept_child);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "walk_tests.rs"]
mod tests;
