use std::time::{Duration, SystemTime};

use serde_json::json;

use super::*;
use crate::kind::tests::widget;

const KUBECTL_GET_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn options(include_object: IncludeObject) -> TableOptions {
    TableOptions {
        version: TableVersion::V1,
        include_object,
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(300),
    }
}

fn object() -> Value {
    json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
           "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "4",
                        "creationTimestamp": "1970-01-01T00:00:00Z"},
           "spec": {"size": 3, "list": [1, 2]}})
}

#[test]
fn negotiates_kubectl_accept_headers() {
    assert_eq!(
        negotiate(Some(KUBECTL_GET_ACCEPT)),
        Ok(ResponseFormat::Table(TableVersion::V1))
    );
    assert_eq!(negotiate(None), Ok(ResponseFormat::Object));
    assert_eq!(negotiate(Some("*/*")), Ok(ResponseFormat::Object));
    assert_eq!(
        negotiate(Some("application/json")),
        Ok(ResponseFormat::Object)
    );
    let beta = "application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json";
    assert_eq!(
        negotiate(Some(beta)),
        Ok(ResponseFormat::Table(TableVersion::V1beta1))
    );
    let metadata_only =
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json";
    assert_eq!(negotiate(Some(metadata_only)), Ok(ResponseFormat::Object));
    let error = negotiate(Some("application/vnd.kubernetes.protobuf")).expect_err("406");
    assert_eq!((error.code, error.reason.as_str()), (406, "NotAcceptable"));
}

#[test]
fn table_of_one_object() {
    let table = table_for_object(&widget(), &object(), &options(IncludeObject::Metadata));
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["Name", "Size", "Age"]);
    assert_eq!(table["rows"][0]["cells"], json!(["a", 3, "5m"]));
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(table["rows"][0]["object"]["metadata"]["namespace"], "ns");
    assert_eq!(table["metadata"]["resourceVersion"], "4");
}

#[test]
fn include_object_and_paths() {
    assert_eq!(
        IncludeObject::parse(Some("Object")),
        Ok(IncludeObject::Object)
    );
    assert_eq!(IncludeObject::parse(None), Ok(IncludeObject::Metadata));
    assert_eq!(
        IncludeObject::parse(Some("All")).expect_err("bad").code,
        400
    );
    let full = table_for_object(&widget(), &object(), &options(IncludeObject::Object));
    assert_eq!(full["rows"][0]["object"]["spec"]["size"], 3);
    let none = table_for_object(&widget(), &object(), &options(IncludeObject::None));
    assert!(none["rows"][0].get("object").is_none());
    assert_eq!(lookup_path(&object(), ".spec.list[1]"), Some(&json!(2)));
    assert_eq!(lookup_path(&object(), ".spec.missing"), None);
}

#[test]
fn watch_tables_carry_columns_once() {
    let spec = widget();
    let first = table_watch_event(
        &spec,
        WatchEventType::Added,
        &object(),
        &options(IncludeObject::Metadata),
        true,
    );
    assert_eq!(first["type"], "ADDED");
    assert!(first["object"]["columnDefinitions"].is_array());
    let next = table_watch_event(
        &spec,
        WatchEventType::Modified,
        &object(),
        &options(IncludeObject::Metadata),
        false,
    );
    assert!(next["object"].get("columnDefinitions").is_none());
    assert_eq!(next["object"]["rows"][0]["cells"][0], "a");
}
