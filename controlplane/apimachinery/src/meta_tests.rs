use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::*;
use crate::kind::tests::widget;
use crate::status::StatusReason;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

fn new_widget(name: &str) -> Value {
    json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
           "metadata": {"name": name, "resourceVersion": "9", "labels": {"app": "x"}},
           "spec": {"size": 1}, "status": {"ready": true}})
}

fn stored(name: &str) -> Value {
    let mut obj = prepare_create(&widget(), new_widget(name), Some("default"), at(0), "uid-1")
        .expect("valid");
    set_resource_version(&mut obj, 5);
    obj
}

#[test]
fn create_sets_server_fields_and_drops_status() {
    let obj = stored("a");
    assert_eq!(obj["metadata"]["uid"], "uid-1");
    assert_eq!(obj["metadata"]["namespace"], "default");
    assert_eq!(obj["metadata"]["generation"], 1);
    assert_eq!(obj["metadata"]["creationTimestamp"], "1970-01-01T00:00:00Z");
    assert_eq!(obj["metadata"]["resourceVersion"], "5");
    assert!(obj.get("status").is_none());
}

#[test]
fn create_refuses_bad_names_types_and_namespaces() {
    let spec = widget();
    let bad_name = prepare_create(&spec, new_widget("Bad_Name"), Some("default"), at(0), "u");
    let error = bad_name.expect_err("invalid name");
    assert_eq!(error.reason, StatusReason::Invalid);
    assert!(error.message.starts_with("Widget.tests.sluice.dev \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"));
    let mut wrong_kind = new_widget("a");
    wrong_kind["kind"] = json!("Gadget");
    let error = prepare_create(&spec, wrong_kind, Some("default"), at(0), "u").expect_err("kind");
    assert_eq!(error.code, 400);
    let mut other_ns = new_widget("a");
    other_ns["metadata"]["namespace"] = json!("other");
    let error = prepare_create(&spec, other_ns, Some("default"), at(0), "u").expect_err("ns");
    assert_eq!(error.code, 400);
    let error = prepare_create(&spec, new_widget("a"), None, at(0), "u").expect_err("no ns");
    assert_eq!(error.code, 422);
    let mut bad_label = new_widget("a");
    bad_label["metadata"]["labels"] = json!({"a b": "c"});
    let error = prepare_create(&spec, bad_label, Some("default"), at(0), "u").expect_err("label");
    assert_eq!(
        error.details.expect("details").causes[0].field,
        "metadata.labels"
    );
}

#[test]
fn create_generates_names_and_clears_namespace_of_cluster_kinds() {
    let mut spec = widget();
    spec.namespaced = false;
    let mut obj = new_widget("");
    obj["metadata"]["generateName"] = json!("w-");
    obj["metadata"]["namespace"] = json!("ignored");
    let created = prepare_create(&spec, obj, None, at(0), "uid-7").expect("valid");
    let name = object_name(&created);
    assert!(name.starts_with("w-") && name.len() == 7, "{name}");
    assert!(created["metadata"].get("namespace").is_none());
    let error = prepare_create(&spec, new_widget(""), None, at(0), "u").expect_err("no name");
    assert_eq!(
        error.details.expect("details").causes[0].reason,
        "FieldValueRequired"
    );
}

#[test]
fn update_keeps_identity_status_and_counts_generation() {
    let spec = widget();
    let old = stored("a");
    let mut new = old.clone();
    new["metadata"]["labels"] = json!({"app": "y"});
    new["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
    new["status"] = json!({"ready": false});
    let updated = prepare_update(&spec, &old, new.clone()).expect("valid");
    assert_eq!(
        updated["metadata"]["generation"], 1,
        "metadata only: no bump"
    );
    assert_eq!(
        updated["metadata"]["creationTimestamp"],
        "1970-01-01T00:00:00Z"
    );
    assert!(updated.get("status").is_none(), "status is a subresource");
    new["spec"]["size"] = json!(2);
    let updated = prepare_update(&spec, &old, new.clone()).expect("valid");
    assert_eq!(updated["metadata"]["generation"], 2);
    new["metadata"]["resourceVersion"] = json!("4");
    assert_eq!(
        prepare_update(&spec, &old, new.clone())
            .expect_err("stale")
            .code,
        409
    );
    new["metadata"]["resourceVersion"] = json!("5");
    new["metadata"]["name"] = json!("b");
    assert_eq!(
        prepare_update(&spec, &old, new.clone())
            .expect_err("rename")
            .code,
        400
    );
    new["metadata"]["name"] = json!("a");
    new["metadata"]["uid"] = json!("other");
    assert_eq!(prepare_update(&spec, &old, new).expect_err("uid").code, 422);
}

#[test]
fn status_update_changes_only_status() {
    let spec = widget();
    let old = stored("a");
    let mut new = old.clone();
    new["spec"]["size"] = json!(99);
    new["status"] = json!({"ready": true});
    let updated = prepare_status_update(&spec, &old, new).expect("valid");
    assert_eq!(updated["spec"]["size"], 1);
    assert_eq!(updated["status"]["ready"], true);
    assert_eq!(updated["metadata"]["generation"], 1);
}

#[test]
fn delete_waits_for_finalizers() {
    let spec = widget();
    let plain = stored("a");
    assert_eq!(begin_delete(&plain, at(10)), DeleteOutcome::DeleteNow);
    let mut held = plain.clone();
    held["metadata"]["finalizers"] = json!(["sluice.dev/cleanup"]);
    let DeleteOutcome::MarkDeleting(marked) = begin_delete(&held, at(10)) else {
        panic!("finalizers hold the object");
    };
    assert_eq!(
        marked["metadata"]["deletionTimestamp"],
        "1970-01-01T00:00:10Z"
    );
    assert_eq!(
        begin_delete(&marked, at(11)),
        DeleteOutcome::AlreadyDeleting
    );
    let mut more = marked.clone();
    more["metadata"]["finalizers"] = json!(["sluice.dev/cleanup", "new"]);
    assert_eq!(
        prepare_update(&spec, &marked, more)
            .expect_err("no new finalizers")
            .code,
        422
    );
    let mut done = marked.clone();
    done["metadata"]["finalizers"] = json!([]);
    let updated = prepare_update(&spec, &marked, done).expect("valid");
    assert!(finalized(&updated));
    assert_eq!(
        updated["metadata"]["deletionTimestamp"],
        "1970-01-01T00:00:10Z"
    );
}

#[test]
fn oversized_annotations_are_invalid_on_create_and_update() {
    let mut big = new_widget("a");
    big["metadata"]["annotations"] = json!({"note": "x".repeat(1400 * 1024)});
    let created = prepare_create(&widget(), big.clone(), Some("default"), at(0), "u");
    let error = created.expect_err("1.4 MiB of annotations");
    assert_eq!((error.code, error.reason), (422, StatusReason::Invalid));
    assert!(
        error
            .message
            .contains("metadata.annotations: Too long: may not be more than 262144 bytes"),
        "{}",
        error.message
    );
    let old = stored("a");
    let mut update = old.clone();
    update["metadata"]["annotations"] = big["metadata"]["annotations"].clone();
    let updated = prepare_update(&widget(), &old, update).expect_err("1.4 MiB on update");
    assert_eq!(updated.code, 422);
}
