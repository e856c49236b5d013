//! The whole request flow on an example kind, as the server will drive it: create, update,
//! status update, both patches, list with selectors and paging, Table, delete with finalizers,
//! with the JSON shapes checked against kube-apiserver's documented ones.
//!
//! Golden snippets come from kubernetes.io/docs/reference/using-api/api-concepts/ ("Retrieving
//! large results sets in chunks", "Watch bookmarks", "Receiving resources as Tables") and the
//! API conventions' Status example; field names and order follow client-go's
//! `k8s.io/apimachinery/pkg/apis/meta/v1/types.go` (Status, ListMeta, Table, WatchEvent).

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use sluice_apimachinery::discovery::{api_group_list, api_resource_list};
use sluice_apimachinery::list::{
    bookmark_event, list_document, watch_event, ContinueToken, ListPage, WatchEventType,
};
use sluice_apimachinery::meta::{
    begin_delete, finalized, prepare_create, prepare_status_update, prepare_update,
    set_resource_version, DeleteOutcome,
};
use sluice_apimachinery::openapi::{openapi_document, openapi_index};
use sluice_apimachinery::patch::{patch_object, patch_status};
use sluice_apimachinery::schema::FieldValidation;
use sluice_apimachinery::selector::{FieldSelector, LabelSelector};
use sluice_apimachinery::table::{
    negotiate, table_for_list, IncludeObject, ResponseFormat, TableOptions, TableVersion,
};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn, Registry, StatusError};

/// Every server needs an endpoint of the form host:port.
fn validate_widget(obj: &Value) -> Vec<FieldError> {
    let servers = obj
        .pointer("/spec/servers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    servers
        .iter()
        .enumerate()
        .filter_map(|(i, server)| {
            let endpoint = server["endpoint"].as_str().unwrap_or("");
            (!endpoint.contains(':')).then(|| {
                FieldError::invalid(
                    format!("spec.servers[{i}].endpoint"),
                    json!(endpoint),
                    "must be host:port",
                )
            })
        })
        .collect()
}

fn widget_kind() -> KindSpec {
    KindSpec {
        group: "tests.sluice.dev".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
        singular: "widget".into(),
        short_names: vec!["wd".into()],
        namespaced: true,
        status_subresource: true,
        printer_columns: vec![
            PrinterColumn::new("Servers", ".spec.servers", "string", "upstream servers"),
            PrinterColumn::new("Healthy", ".status.healthy", "integer", "healthy servers"),
        ],
        schema: json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["servers"], "properties": {
                "servers": {"type": "array", "items": {"type": "object", "properties": {
                    "endpoint": {"type": "string"}, "weight": {"type": "integer"}}}}}},
            "status": {"type": "object", "properties": {"healthy": {"type": "integer"}}}}}),
        validate: validate_widget,
    }
}

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
}

fn manifest(name: &str, endpoint: &str, labels: Value) -> Value {
    json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
           "metadata": {"name": name, "labels": labels},
           "spec": {"servers": [{"endpoint": endpoint}]}})
}

/// A tiny in-memory "store" standing in for the storage crate: revision counter + objects.
struct Store {
    revision: u64,
    objects: Vec<Value>,
}

impl Store {
    fn write(&mut self, mut obj: Value) -> Value {
        self.revision += 1;
        set_resource_version(&mut obj, self.revision);
        let name = obj["metadata"]["name"].clone();
        self.objects.retain(|o| o["metadata"]["name"] != name);
        self.objects.push(obj.clone());
        self.objects.sort_by(|a, b| {
            a["metadata"]["name"]
                .as_str()
                .cmp(&b["metadata"]["name"].as_str())
        });
        obj
    }
}

#[test]
fn discovery_and_openapi_describe_the_kind() {
    let registry = Registry::new().with(widget_kind()).expect("registry");
    assert_eq!(
        api_group_list(&registry, &[])["groups"][0]["name"],
        "tests.sluice.dev"
    );
    let resources = api_resource_list(&registry, "tests.sluice.dev", "v1").expect("served");
    assert_eq!(resources["resources"][0]["kind"], "Widget");
    let index = openapi_index(&registry);
    assert!(
        index["paths"]["apis/tests.sluice.dev/v1"]["serverRelativeURL"]
            .as_str()
            .expect("url")
            .contains("?hash=")
    );
    let doc = openapi_document(&registry, "tests.sluice.dev", "v1").expect("served");
    let patch =
        &doc["paths"]["/apis/tests.sluice.dev/v1/namespaces/{namespace}/widgets/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "tests.sluice.dev", "version": "v1", "kind": "Widget"})
    );
    assert!(patch["parameters"]
        .as_array()
        .expect("params")
        .iter()
        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
}

#[test]
fn whole_flow_on_the_example_kind() {
    let spec = widget_kind();
    let mut store = Store {
        revision: 10,
        objects: Vec::new(),
    };
    let created = create_widgets(&spec, &mut store);
    let patched = update_and_patch(&spec, &mut store, created);
    list_table_and_watch(&spec, &store, &patched);
    delete_with_finalizers(&spec, &mut store, patched);
}

fn create_widgets(spec: &KindSpec, store: &mut Store) -> Value {
    // create: server fields set, client status dropped, invalid endpoint refused with its path.
    let invalid = prepare_create(
        spec,
        manifest("w0", "nope", json!({})),
        Some("default"),
        at(0),
        "u0",
    )
    .expect_err("invalid endpoint");
    let status = invalid.to_json();
    assert_eq!(status["code"], 422);
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.servers[0].endpoint"
    );
    let mut typo = manifest("w0", "a:1", json!({}));
    typo["spec"]["servres"] = json!([]);
    assert_eq!(
        FieldValidation::Strict
            .check(spec, &typo)
            .expect_err("strict")
            .code,
        400
    );

    let mut first = manifest("w1", "a:1", json!({"app": "web"}));
    first["status"] = json!({"healthy": 9});
    let created =
        store.write(prepare_create(spec, first, Some("default"), at(0), "u1").expect("valid"));
    assert_eq!(created["metadata"]["resourceVersion"], "11");
    assert!(created.get("status").is_none());
    for (name, app) in [("w2", "web"), ("w3", "db")] {
        let obj = prepare_create(
            spec,
            manifest(name, "b:2", json!({"app": app})),
            Some("default"),
            at(1),
            name,
        )
        .expect("valid");
        store.write(obj);
    }
    created
}

fn update_and_patch(spec: &KindSpec, store: &mut Store, created: Value) -> Value {
    // update: stale resourceVersion is 409, a spec change bumps generation, status is kept.
    let mut stale = created.clone();
    stale["metadata"]["resourceVersion"] = json!("10");
    assert_eq!(
        prepare_update(spec, &created, stale)
            .expect_err("stale")
            .code,
        409
    );
    let mut changed = created.clone();
    changed["spec"]["servers"][0]["endpoint"] = json!("a:2");
    let updated = store.write(prepare_update(spec, &created, changed).expect("valid"));
    assert_eq!(updated["metadata"]["generation"], 2);

    // status update, then both patch kinds through the same rules.
    let mut reported = updated.clone();
    reported["status"] = json!({"healthy": 1});
    let with_status = store.write(prepare_status_update(spec, &updated, reported).expect("valid"));
    assert_eq!(with_status["status"]["healthy"], 1);
    let merge = br#"{"metadata": {"labels": {"tier": "edge"}}, "status": {"healthy": 0}}"#;
    let merged = store.write(
        patch_object(spec, &with_status, "application/merge-patch+json", merge).expect("merge"),
    );
    assert_eq!(
        merged["metadata"]["labels"],
        json!({"app": "web", "tier": "edge"})
    );
    assert_eq!(
        merged["status"]["healthy"], 1,
        "main resource cannot change status"
    );
    assert_eq!(merged["metadata"]["generation"], 2, "labels only");
    let json_patch = br#"[{"op": "add", "path": "/spec/servers/-", "value": {"endpoint": "c:3"}}]"#;
    let patched = store.write(
        patch_object(spec, &merged, "application/json-patch+json", json_patch).expect("json patch"),
    );
    assert_eq!(patched["metadata"]["generation"], 3);
    let status_patch = br#"{"status": {"healthy": 2}}"#;
    let patched = store.write(
        patch_status(spec, &patched, "application/merge-patch+json", status_patch).expect("status"),
    );
    assert_eq!(patched["status"]["healthy"], 2);
    let bad = br#"[{"op": "replace", "path": "/spec/servers/0/endpoint", "value": "x"}]"#;
    let error =
        patch_object(spec, &patched, "application/json-patch+json", bad).expect_err("invalid");
    assert_eq!(
        error.to_json()["details"]["causes"][0]["field"],
        "spec.servers[0].endpoint"
    );
    patched
}

fn list_table_and_watch(spec: &KindSpec, store: &Store, patched: &Value) {
    // list with selectors and paging: page size 1 over app=web (w1, w2).
    let labels = LabelSelector::parse("app in (web),tier!=core").expect("selector");
    let fields = FieldSelector::parse("metadata.namespace=default").expect("selector");
    let matching: Vec<Value> = store
        .objects
        .iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
        .cloned()
        .collect();
    assert_eq!(matching.len(), 2);
    let next = ContinueToken::new("/widgets/default/w2", store.revision);
    let page = ListPage {
        resource_version: store.revision,
        continue_token: Some(next.encode()),
        remaining_item_count: Some(1),
    };
    let list = list_document(spec, matching[..1].to_vec(), &page);
    // Shape of the documented chunked list: metadata {resourceVersion, continue, remainingItemCount}.
    assert_eq!(list["kind"], "WidgetList");
    assert_eq!(
        list["metadata"]["resourceVersion"],
        json!(store.revision.to_string())
    );
    assert_eq!(list["metadata"]["remainingItemCount"], 1);
    let token = list["metadata"]["continue"].as_str().expect("token");
    assert_eq!(ContinueToken::decode(token).expect("round trip"), next);

    // Table for kubectl get.
    let format = negotiate(Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"));
    assert_eq!(format, Ok(ResponseFormat::Table(TableVersion::V1)));
    let options = TableOptions {
        version: TableVersion::V1,
        include_object: IncludeObject::Metadata,
        now: at(600),
    };
    let table = table_for_list(spec, &list, &options);
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(table["metadata"]["continue"], list["metadata"]["continue"]);
    let row = &table["rows"][0];
    assert_eq!(
        row["cells"],
        json!(["w1", r#"[{"endpoint":"a:2"},{"endpoint":"c:3"}]"#, 2, "10m"])
    );
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");

    // Watch events: documented BOOKMARK shape (only kind, apiVersion, metadata.resourceVersion).
    assert_eq!(
        bookmark_event(spec, 12746),
        json!({"type": "BOOKMARK", "object": {
        "kind": "Widget", "apiVersion": "tests.sluice.dev/v1", "metadata": {"resourceVersion": "12746"}}})
    );
    assert_eq!(
        watch_event(WatchEventType::Modified, patched.clone())["type"],
        "MODIFIED"
    );
}

fn delete_with_finalizers(spec: &KindSpec, store: &mut Store, patched: Value) {
    // delete with finalizers: marked, finalizer removed, then gone.
    let held = json!({"metadata": {"finalizers": ["sluice.dev/drain"]}});
    let held = store.write(
        patch_object(
            spec,
            &patched,
            "application/merge-patch+json",
            held.to_string().as_bytes(),
        )
        .expect("finalizer"),
    );
    let DeleteOutcome::MarkDeleting(marked) = begin_delete(&held, at(700)) else {
        panic!("held by a finalizer")
    };
    let marked = store.write(marked);
    assert_eq!(
        marked["metadata"]["deletionTimestamp"],
        "2023-11-14T22:25:00Z"
    );
    let release = br#"{"metadata": {"finalizers": null}}"#;
    let released =
        patch_object(spec, &marked, "application/merge-patch+json", release).expect("release");
    assert!(finalized(&released), "the server deletes it now");
    assert_eq!(
        begin_delete(&store.objects[1], at(800)),
        DeleteOutcome::DeleteNow
    );
}

#[test]
fn status_json_matches_the_documented_not_found() {
    // API conventions' example: {"kind":"Status","apiVersion":"v1","metadata":{},
    // "status":"Failure","message":"pods \"grafana\" not found","reason":"NotFound",
    // "details":{"name":"grafana","kind":"pods"},"code":404}; a custom kind adds its group.
    // Compared as values: serde_json sorts keys, and key order means nothing to JSON clients.
    let status = StatusError::not_found(&widget_kind(), "grafana").to_json();
    let expected: Value = serde_json::from_str(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"widgets.tests.sluice.dev \"grafana\" not found","reason":"NotFound","details":{"name":"grafana","group":"tests.sluice.dev","kind":"widgets"},"code":404}"#).expect("golden");
    assert_eq!(status, expected);
}
