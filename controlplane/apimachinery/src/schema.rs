//! The structural-schema checks kube-apiserver runs on custom objects: types, `required` and
//! `enum` (422 with the field path), and unknown fields for `?fieldValidation=` (kubectl sends
//! `Strict` by default once the OpenAPI document advertises the parameter).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use serde_json::{json, Value};

use crate::kind::KindSpec;
use crate::openapi_meta::{object_meta_schema, owner_reference_schema};
use crate::status::{FieldError, StatusError};

/// Whole-object schemas built so far, by kind name: `(group, the kind's own schema, the whole
/// schema)`. Building one copies ObjectMeta's schema (hundreds of nodes), and every write
/// walks its object against it up to three times (issue 36: 6 % of a 5,000-VM control plane's
/// steady CPU went to building them). An entry is used only while the kind's own schema is
/// the same, so a kind registered again with another schema gets its own.
type SchemaCache = HashMap<String, Vec<(String, Value, Arc<Value>)>>;
static SCHEMAS: LazyLock<RwLock<SchemaCache>> = LazyLock::new(RwLock::default);
/// Kinds the cache holds at most (a registry has a few dozen); past it, new kinds are built
/// each time rather than pushing out the ones cached.
const MAX_CACHED_KINDS: usize = 1024;

/// The schema of a whole object: apiVersion, kind, metadata and the kind's own properties.
fn object_schema(spec: &KindSpec) -> Arc<Value> {
    let cached = SCHEMAS
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&spec.kind)
        .and_then(|entries| {
            entries
                .iter()
                .find(|(group, own, _)| *group == spec.group && *own == spec.schema)
                .map(|(_, _, whole)| whole.clone())
        });
    if let Some(whole) = cached {
        return whole;
    }
    let whole = Arc::new(build_object_schema(spec));
    let mut schemas = SCHEMAS.write().unwrap_or_else(PoisonError::into_inner);
    if schemas.len() >= MAX_CACHED_KINDS && !schemas.contains_key(&spec.kind) {
        return whole;
    }
    let entries = schemas.entry(spec.kind.clone()).or_default();
    entries.retain(|(group, _, _)| *group != spec.group);
    entries.push((spec.group.clone(), spec.schema.clone(), whole.clone()));
    whole
}

fn build_object_schema(spec: &KindSpec) -> Value {
    let mut metadata = object_meta_schema();
    metadata["properties"]["ownerReferences"]["items"] = owner_reference_schema();
    let mut schema = json!({"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": metadata}});
    if let Some(own) = spec.schema.get("properties").and_then(Value::as_object) {
        for (key, value) in own {
            schema["properties"][key] = value.clone();
        }
    }
    if let Some(required) = spec.schema.get("required") {
        schema["required"] = required.clone();
    }
    schema
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Walks value and schema together, collecting type/required/enum errors and unknown fields.
struct Walker {
    errors: Vec<FieldError>,
    unknown: Vec<String>,
}

impl Walker {
    fn walk(&mut self, schema: &Value, value: &Value, path: &str) {
        // `nullable` aside, kube drops nulls of optional fields before validating.
        if value.is_null() {
            return;
        }
        if let Some(expected) = schema.get("type").and_then(Value::as_str) {
            if !type_matches(expected, value) {
                let detail = format!(
                    "{path} in body must be of type {expected}: {:?}",
                    type_name(value)
                );
                self.errors
                    .push(FieldError::invalid(path, json!(type_name(value)), detail));
                return;
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(value) {
                let names: Vec<String> = allowed
                    .iter()
                    .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
                    .collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                self.errors
                    .push(FieldError::not_supported(path, value.clone(), &names));
            }
        }
        for nested in schema
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.walk(nested, value, path);
        }
        match value {
            Value::Object(map) => self.walk_object(schema, map, path),
            Value::Array(items) => {
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.walk(item_schema, item, &format!("{path}[{i}]"));
                    }
                }
            }
            _ => {}
        }
    }

    fn walk_object(&mut self, schema: &Value, map: &serde_json::Map<String, Value>, path: &str) {
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(key) = required.as_str() {
                if map.get(key).is_none_or(Value::is_null) {
                    self.errors
                        .push(FieldError::required(child_path(path, key), ""));
                }
            }
        }
        let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        let has_all_of = schema.get("allOf").is_some();
        for (key, value) in map {
            let field = child_path(path, key);
            if let Some(property) = properties.and_then(|p| p.get(key)) {
                self.walk(property, value, &field);
            } else if let Some(additional) = additional {
                self.walk(additional, value, &field);
            } else if !preserve
                && !has_all_of
                && (properties.is_some() || schema.get("type") == Some(&json!("object")))
            {
                self.unknown.push(field);
            }
        }
    }
}

/// The schema errors of an object (types, required fields, enums) with kube's field paths.
pub fn schema_errors(spec: &KindSpec, obj: &Value) -> Vec<FieldError> {
    let mut walker = Walker {
        errors: Vec::new(),
        unknown: Vec::new(),
    };
    walker.walk(&object_schema(spec), obj, "");
    walker.errors
}

/// The paths of fields the schema does not know (`spec.sizee`), in document order.
pub fn unknown_fields(spec: &KindSpec, obj: &Value) -> Vec<String> {
    let mut walker = Walker {
        errors: Vec::new(),
        unknown: Vec::new(),
    };
    walker.walk(&object_schema(spec), obj, "");
    walker.unknown
}

/// Drops the fields the schema does not know, as kube-apiserver prunes custom objects before
/// storing them (after [`FieldValidation::check`] has warned or refused).
pub fn prune_unknown_fields(spec: &KindSpec, obj: &mut Value) {
    prune(&object_schema(spec), obj);
}

fn prune(schema: &Value, value: &mut Value) {
    for nested in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        prune(nested, value);
    }
    match value {
        Value::Object(map) => {
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let typed_object = properties.is_some() || schema.get("type") == Some(&json!("object"));
            if !preserve && additional.is_none() && schema.get("allOf").is_none() && typed_object {
                map.retain(|key, _| properties.is_some_and(|p| p.contains_key(key)));
            }
            for (key, child) in map.iter_mut() {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(property), _) => prune(property, child),
                    (None, Some(additional)) => prune(additional, child),
                    (None, None) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|item| prune(item_schema, item));
            }
        }
        _ => {}
    }
}

/// `?fieldValidation=`: what to do with unknown fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (kube's default for requests without the parameter).
    #[default]
    Warn,
    /// Refuse the request (kubectl's default).
    Strict,
}

impl FieldValidation {
    /// Parses the parameter; 400 for an unknown value.
    pub fn parse(value: Option<&str>) -> Result<Self, StatusError> {
        match value {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(StatusError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }

    /// Applies the directive to an object: `Ok(warnings)` (one `unknown field "x"` per field,
    /// for `Warning: 299 - "..."` headers, empty for Ignore) or, for Strict, 400 BadRequest
    /// `Widget in version "v1" cannot be handled as a Widget: strict decoding error: unknown
    /// field "spec.x"` as kube-apiserver answers.
    pub fn check(self, spec: &KindSpec, obj: &Value) -> Result<Vec<String>, StatusError> {
        let unknown = unknown_fields(spec, obj);
        let messages: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        match self {
            Self::Ignore => Ok(Vec::new()),
            Self::Warn => Ok(messages),
            Self::Strict if messages.is_empty() => Ok(Vec::new()),
            // kube-apiserver's decode error wording (`transformDecodeError`).
            Self::Strict => Err(StatusError::bad_request(format!(
                "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                messages.join(", "),
                kind = spec.kind,
                version = spec.version,
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::tests::widget;

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
               "metadata": {"name": "a", "labels": {"x": "y"}, "ownerReferences": [
                   {"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u"}]},
               "spec": spec, "status": {"anything": {"goes": 1}}})
    }

    #[test]
    fn finds_unknown_fields_but_not_preserved_ones() {
        let spec = widget();
        assert!(unknown_fields(&spec, &obj(json!({"size": 1}))).is_empty());
        let typo = obj(json!({"sise": 1}));
        assert_eq!(unknown_fields(&spec, &typo), ["spec.sise"]);
        let mut meta_typo = obj(json!({}));
        meta_typo["metadata"]["lables"] = json!({});
        assert_eq!(unknown_fields(&spec, &meta_typo), ["metadata.lables"]);
        let error = FieldValidation::Strict
            .check(&spec, &typo)
            .expect_err("strict");
        assert_eq!(
            error.message,
            "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: unknown field \"spec.sise\""
        );
        assert_eq!(
            FieldValidation::Warn.check(&spec, &typo),
            Ok(vec!["unknown field \"spec.sise\"".to_string()])
        );
        assert_eq!(
            FieldValidation::parse(Some("Strict")),
            Ok(FieldValidation::Strict)
        );
        assert_eq!(
            FieldValidation::parse(Some("strict"))
                .expect_err("case")
                .code,
            400
        );
        let mut pruned = typo.clone();
        prune_unknown_fields(&spec, &mut pruned);
        assert_eq!(pruned["spec"], json!({}));
        assert_eq!(
            pruned["status"], typo["status"],
            "status preserves unknown fields"
        );
        assert_eq!(pruned["metadata"]["labels"], json!({"x": "y"}));
    }

    #[test]
    fn a_kind_registered_again_with_another_schema_is_checked_against_it() {
        let first = widget();
        assert!(unknown_fields(&first, &obj(json!({"size": 1}))).is_empty());
        let mut second = widget();
        second.schema["properties"]["spec"]["properties"] = json!({"colour": {"type": "string"}});
        assert_eq!(
            unknown_fields(&second, &obj(json!({"size": 1}))),
            ["spec.size"]
        );
        assert!(unknown_fields(&first, &obj(json!({"size": 1}))).is_empty());
        // Built once per kind and schema: the same whole schema comes back.
        assert!(Arc::ptr_eq(&object_schema(&first), &object_schema(&first)));
    }

    #[test]
    fn checks_types_with_paths() {
        let spec = widget();
        let errors = schema_errors(&spec, &obj(json!({"size": "big"})));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.size");
        assert_eq!(
            errors[0].body(),
            "Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
        );
        assert!(schema_errors(&spec, &obj(json!({"size": 3}))).is_empty());
        let mut bad_owner = obj(json!({}));
        bad_owner["metadata"]["ownerReferences"][0] = json!({"kind": "K"});
        let fields: Vec<String> = schema_errors(&spec, &bad_owner)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert!(
            fields.contains(&"metadata.ownerReferences[0].uid".to_string()),
            "{fields:?}"
        );
    }
}
