//! Whatever a client sends, the request path answers with a value or a `StatusError`: no
//! panics on arbitrary JSON bodies, patches, Accept headers or query strings.

use std::time::SystemTime;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use sluice_apimachinery::meta::{
    begin_delete, prepare_create, prepare_status_update, prepare_update,
};
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::patch::{patch_object, patch_status};
use sluice_apimachinery::schema::{prune_unknown_fields, FieldValidation};
use sluice_apimachinery::table::{
    negotiate, table_for_object, IncludeObject, TableOptions, TableVersion,
};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};

fn no_errors(_: &Value) -> Vec<FieldError> {
    Vec::new()
}

fn kind() -> KindSpec {
    KindSpec {
        group: "tests.sluice.dev".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
        singular: "widget".into(),
        short_names: vec![],
        namespaced: true,
        status_subresource: true,
        printer_columns: vec![PrinterColumn::new(
            "Size",
            ".spec.items[0].size",
            "integer",
            "",
        )],
        schema: json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "object", "required": ["size"],
                      "properties": {"size": {"type": "integer"}}}}}}}}),
        validate: no_errors,
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z:/.-]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("metadata".to_string()),
                    Just("spec".to_string()),
                    Just("status".to_string()),
                    Just("name".to_string()),
                    Just("labels".to_string()),
                    Just("finalizers".to_string()),
                    Just("resourceVersion".to_string()),
                    Just("items".to_string()),
                    "[a-z]{1,5}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn typed(body: Value) -> Value {
    let mut obj = json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget"});
    if let Value::Object(map) = body {
        for (key, value) in map {
            obj[key] = value;
        }
    }
    obj
}

proptest! {
    #[test]
    fn metadata_rules_never_panic(body in json_value(), other in json_value()) {
        let spec = kind();
        let now = SystemTime::UNIX_EPOCH;
        let _ = prepare_create(&spec, body.clone(), Some("default"), now, "uid");
        let _ = prepare_create(&spec, typed(body.clone()), Some("default"), now, "uid");
        let _ = prepare_update(&spec, &typed(body.clone()), typed(other.clone()));
        let _ = prepare_status_update(&spec, &typed(body.clone()), typed(other.clone()));
        let _ = begin_delete(&body, now);
        let _ = FieldValidation::Strict.check(&spec, &typed(body.clone()));
        let mut pruned = typed(body.clone());
        prune_unknown_fields(&spec, &mut pruned);
        let options = TableOptions { version: TableVersion::V1, include_object: IncludeObject::Metadata, now };
        let _ = table_for_object(&spec, &body, &options);
    }

    #[test]
    fn patches_never_panic(old in json_value(), patch in json_value(), raw in ".{0,64}") {
        let spec = kind();
        let old = typed(old);
        let body = patch.to_string();
        for content_type in ["application/merge-patch+json", "application/json-patch+json"] {
            let _ = patch_object(&spec, &old, content_type, body.as_bytes());
            let _ = patch_status(&spec, &old, content_type, raw.as_bytes());
        }
    }

    #[test]
    fn headers_and_queries_never_panic(accept in ".{0,80}", name in ".{0,16}", value in ".{0,32}") {
        let _ = negotiate(Some(&accept));
        let _ = ListOptions::parse([(name.as_str(), value.as_str())]);
    }
}
