use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::*;
use crate::kind::tests::widget;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

fn live() -> Value {
    json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
           "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "3"},
           "spec": {"size": 1}, "status": {"ready": true}})
}

fn config(spec: Value) -> Value {
    json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
           "metadata": {"name": "a"}, "spec": spec})
}

fn managers(object: &Value) -> Vec<(String, String, Value)> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or("").to_string(),
                e["operation"].as_str().unwrap_or("").to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn apply_as(object: &Value, manager: &str, spec: Value, force: bool) -> Result<Value, StatusError> {
    apply(
        &widget(),
        object,
        config(spec),
        manager,
        force,
        Scope::Main,
        at(10),
    )
}

#[test]
fn options_follow_kube() {
    let missing = field_manager(None, Some("kubectl/v1.32"), true).expect_err("required");
    assert_eq!(missing.code, 422);
    assert_eq!(
        missing.message,
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    assert_eq!(
        field_manager(None, Some("kubectl-edit/v1.32.0 (linux/amd64)"), false).ok(),
        Some("kubectl-edit".to_string())
    );
    assert_eq!(
        field_manager(Some("flux"), None, true).ok(),
        Some("flux".into())
    );
    assert_eq!(
        field_manager(Some(&"m".repeat(129)), None, true).map_err(|e| e.code),
        Err(422)
    );
    assert_eq!(
        field_manager(Some("a\nb"), None, false).map_err(|e| e.code),
        Err(422)
    );
    assert_eq!(force(Some("true"), true), Ok(true));
    assert_eq!(force(None, true), Ok(false));
    assert_eq!(force(Some("true"), false).map_err(|e| e.code), Err(422));
}

#[test]
fn config_parses_yaml_and_json_and_refuses_managed_fields() {
    let yaml =
        b"apiVersion: tests.sluice.dev/v1\nkind: Widget\nmetadata:\n  name: a\nspec:\n  size: 2\n";
    assert_eq!(
        parse_config(yaml).ok().map(|c| c["spec"]["size"].clone()),
        Some(json!(2))
    );
    assert!(parse_config(br#"{"spec": {"size": 2}}"#).is_ok());
    assert_eq!(parse_config(b"- 1\n- 2\n").map_err(|e| e.code), Err(400));
    assert_eq!(parse_config(b"a: [").map_err(|e| e.code), Err(400));
    let with_fields = br#"{"metadata": {"managedFields": [{"manager": "x"}]}}"#;
    assert_eq!(
        parse_config(with_fields).map_err(|e| e.message),
        Err("metadata.managedFields must be nil".to_string())
    );
}

#[test]
fn apply_owns_what_it_sets_and_a_repeat_changes_nothing() {
    let first = apply_as(&live(), "kubectl", json!({"size": 2}), false).expect("applies");
    assert_eq!(first["spec"]["size"], 2);
    assert_eq!(
        first["status"],
        json!({"ready": true}),
        "status is not the main resource's"
    );
    assert_eq!(
        managers(&first),
        [(
            "kubectl".into(),
            "Apply".into(),
            json!({"f:spec": {"f:size": {}}})
        )]
    );
    let again = apply(
        &widget(),
        &first,
        config(json!({"size": 2})),
        "kubectl",
        false,
        Scope::Main,
        at(99),
    )
    .expect("again");
    assert_eq!(
        again, first,
        "an unchanged apply keeps even the entry's time"
    );
}

#[test]
fn another_manager_conflicts_unless_forced_and_same_values_share() {
    let first = apply_as(&live(), "kubectl", json!({"size": 2}), false).expect("applies");
    let error = apply_as(&first, "other", json!({"size": 3}), false).expect_err("conflict");
    assert_eq!((error.code, error.reason), (409, StatusReason::Conflict));
    assert_eq!(
        error.message,
        "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.size"
    );
    let causes = &error
        .details
        .as_ref()
        .map(|d| d.causes.clone())
        .unwrap_or_default();
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].field, ".spec.size");
    let shared = apply_as(&first, "other", json!({"size": 2}), false).expect("same value");
    assert_eq!(managers(&shared).len(), 2, "both own .spec.size");
    let forced = apply_as(&first, "other", json!({"size": 3}), true).expect("forced");
    assert_eq!(forced["spec"]["size"], 3);
    assert_eq!(
        managers(&forced),
        [(
            "other".into(),
            "Apply".into(),
            json!({"f:spec": {"f:size": {}}})
        )]
    );
}

#[test]
fn fields_no_longer_applied_are_removed_unless_someone_else_owns_them() {
    let spec = json!({"size": 2});
    let first = apply_as(&live(), "kubectl", spec.clone(), false).expect("applies");
    let mut labelled = first.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    record_update(
        &widget(),
        Some(&first),
        &mut labelled,
        "kubectl-label",
        Scope::Main,
        at(20),
    );
    let fewer = apply(
        &widget(),
        &labelled,
        json!({"apiVersion": "tests.sluice.dev/v1",
        "kind": "Widget", "metadata": {"name": "a"}}),
        "kubectl",
        false,
        Scope::Main,
        at(30),
    )
    .expect("applies");
    assert!(
        fewer["spec"].get("size").is_none(),
        "size was only kubectl's: {fewer}"
    );
    assert_eq!(fewer["metadata"]["labels"], json!({"team": "a"}));
    assert_eq!(fewer["metadata"]["name"], "a");
    assert_eq!(
        managers(&fewer),
        [(
            "kubectl-label".into(),
            "Update".into(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:team": {}}}})
        )]
    );
}

#[test]
fn an_update_takes_fields_so_a_later_apply_conflicts_naming_it() {
    let first = apply_as(&live(), "kubectl", json!({"size": 2}), false).expect("applies");
    let mut edited = first.clone();
    edited["spec"]["size"] = json!(5);
    record_update(
        &widget(),
        Some(&first),
        &mut edited,
        "kubectl-edit",
        Scope::Main,
        at(20),
    );
    let owners = managers(&edited);
    assert_eq!(owners.len(), 1, "the apply lost .spec.size: {owners:?}");
    assert_eq!(owners[0].1, "Update");
    let error = apply_as(&edited, "kubectl", json!({"size": 2}), false).expect_err("conflict");
    assert_eq!(
        error.message,
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using tests.sluice.dev/v1: .spec.size"
    );
}

#[test]
fn updates_record_creates_and_keep_times_when_nothing_changed() {
    let mut created = live();
    record_update(
        &widget(),
        None,
        &mut created,
        "kubectl-create",
        Scope::Main,
        at(1),
    );
    assert_eq!(
        managers(&created),
        [(
            "kubectl-create".into(),
            "Update".into(),
            json!({"f:spec": {".": {}, "f:size": {}}})
        )]
    );
    let mut same = created.clone();
    record_update(
        &widget(),
        Some(&created),
        &mut same,
        "other",
        Scope::Main,
        at(50),
    );
    assert_eq!(
        same, created,
        "a write that changes nothing records nothing"
    );
    let mut status = created.clone();
    status["status"] = json!({"ready": false});
    record_update(
        &widget(),
        Some(&created),
        &mut status,
        "vm-manager",
        Scope::Status,
        at(60),
    );
    let entry = status["metadata"]["managedFields"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["manager"] == "vm-manager"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry["subresource"], "status");
    assert_eq!(entry["fieldsV1"], json!({"f:status": {"f:ready": {}}}));
}

#[test]
fn client_managed_fields_are_taken_reset_or_ignored() {
    let first = apply_as(&live(), "kubectl", json!({"size": 2}), false).expect("applies");
    let mut reset = first.clone();
    reset["metadata"]["managedFields"] = json!([]);
    record_update(
        &widget(),
        Some(&first),
        &mut reset,
        "x",
        Scope::Main,
        at(20),
    );
    assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");
    let mut garbage = first.clone();
    garbage["metadata"]["managedFields"] = json!([{"operation": "Delete"}]);
    record_update(
        &widget(),
        Some(&first),
        &mut garbage,
        "x",
        Scope::Main,
        at(20),
    );
    assert_eq!(
        managers(&garbage),
        managers(&first),
        "the stored entries stay"
    );
    let mut migrated = first.clone();
    migrated["metadata"]["managedFields"] = json!([{"manager": "flux", "operation": "Apply",
        "apiVersion": "tests.sluice.dev/v1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:size": {}}}}]);
    record_update(
        &widget(),
        Some(&first),
        &mut migrated,
        "x",
        Scope::Main,
        at(20),
    );
    assert_eq!(managers(&migrated)[0].0, "flux");
}

#[test]
fn a_create_by_apply_owns_everything_it_sets() {
    let bare = json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
                      "metadata": {"name": "a"}});
    let created = apply_as(&bare, "flux", json!({"size": 7}), false).expect("applies");
    assert_eq!(created["spec"]["size"], 7);
    assert_eq!(managers(&created)[0].1, "Apply");
    assert!(created["metadata"]["managedFields"][0]["time"].is_string());
}

#[test]
fn a_status_apply_owns_only_status() {
    let status_config = json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
        "metadata": {"name": "a"}, "spec": {"size": 9}, "status": {"phase": "Up"}});
    let applied = apply(
        &widget(),
        &live(),
        status_config,
        "controller",
        false,
        Scope::Status,
        at(5),
    )
    .expect("applies");
    assert_eq!(applied["status"], json!({"ready": true, "phase": "Up"}));
    assert_eq!(
        applied["spec"]["size"], 1,
        "a status apply leaves the spec alone"
    );
    let entry = &applied["metadata"]["managedFields"][0];
    assert_eq!(entry["subresource"], "status");
    assert_eq!(entry["fieldsV1"], json!({"f:status": {"f:phase": {}}}));
}

mod properties {
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    use super::*;

    /// Small JSON trees: scalars, lists and maps over a few keys, so configurations overlap.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::Bool),
            (0i64..4).prop_map(|n| json!(n)),
            "[ab]{0,2}".prop_map(Value::String),
            Just(Value::Null),
        ];
        leaf.prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[xyz]", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    proptest! {
        /// Applying the same configuration twice changes nothing the second time, and the
        /// applier's stored entry always decodes back to the fields it applied.
        #[test]
        fn apply_is_idempotent_and_its_fields_round_trip(
            live_spec in value(), config_spec in value(),
        ) {
            let mut stored = live();
            stored["spec"] = live_spec;
            let once = apply_as(&stored, "a", config_spec.clone(), true);
            prop_assume!(once.is_ok());
            let once = once.unwrap_or_default();
            let twice = apply_as(&once, "a", config_spec, false);
            prop_assert_eq!(twice.as_ref().ok(), Some(&once));
            let decoded = managers::decode(&once);
            prop_assert!(decoded.is_ok());
            for entry in decoded.unwrap_or_default() {
                let encoded = entry.fields.to_fields_v1();
                prop_assert_eq!(fieldset::FieldSet::from_fields_v1(&encoded).ok(), Some(entry.fields));
            }
        }

        /// A second manager's forced apply leaves the first owning nothing it changed.
        #[test]
        fn a_forced_apply_takes_every_changed_field(first in value(), second in value()) {
            let Ok(applied) = apply_as(&live(), "a", first, false) else {
                return Ok(());
            };
            let Ok(forced) = apply_as(&applied, "b", second.clone(), true) else {
                return Ok(());
            };
            prop_assert!(apply_as(&forced, "b", second, false).is_ok());
        }
    }
}
