//! What a client sends the control plane's API before any object is read: the method, path and
//! query (`sluice_apiserver::request::parse`, `server::Query`), the list options and selectors
//! in the query, the `Accept` header, a PATCH body applied to an object, a server-side apply
//! configuration merged into one, and `managedFields` as a client sends them. Each refuses bad
//! input with a `Status`, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::UNIX_EPOCH;

use sluice_apimachinery::apply::{self, managers, Scope};
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::patch::{apply_patch, PatchType};
use sluice_apiserver::server::Query;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(4, '\n');
    let (method, path, query, rest) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let _ = sluice_apiserver::request::parse(method, path, query);
    if let Ok(query) = Query::parse(query) {
        let _ = ListOptions::parse(query.pairs());
    }
    let _ = sluice_apimachinery::table::negotiate(Some(rest));
    let object = serde_json::json!({"apiVersion": "v1", "kind": "X",
        "metadata": {"name": "a", "labels": {"k": "v"}}, "spec": {"list": [1, 2]}});
    let _ = apply_patch(&object, PatchType::MergePatch, rest.as_bytes());
    let _ = apply_patch(&object, PatchType::JsonPatch, rest.as_bytes());
    if let Ok(config) = apply::parse_config(rest.as_bytes()) {
        let spec = sluice_apiserver::kinds::upstream_cluster();
        let _ = apply::apply(
            &spec,
            &object,
            config,
            "fuzz",
            false,
            Scope::Main,
            UNIX_EPOCH,
        );
    }
    if let Ok(sent) = serde_json::from_str::<serde_json::Value>(rest) {
        let _ = managers::decode(&serde_json::json!({"metadata": {"managedFields": sent}}));
    }
});
