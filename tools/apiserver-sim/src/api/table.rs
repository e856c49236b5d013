//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for.

use std::time::SystemTime;

use serde_json::{json, Value};

use super::text;

/// A `meta.k8s.io/v1` Table, which kubectl asks for (`as=Table`) to print server-side columns.
pub(super) fn table_of(resource: &str, objects: &[Value], resource_version: &str) -> Value {
    let second_column = if resource == "pods" { "Status" } else { "Data" };
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let second = if resource == "pods" {
                json!(text(&object["status"]["phase"]))
            } else {
                json!(object["data"].as_object().map_or(0, |data| data.len()))
            };
            json!({
                "cells": [text(&object["metadata"]["name"]), second, age(&object["metadata"]["creationTimestamp"])],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object["metadata"],
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
            {"name": second_column, "type": "string", "format": "", "description": second_column, "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0},
        ],
        "rows": rows,
    })
}

pub(super) fn age(timestamp: &Value) -> String {
    humantime::parse_rfc3339(text(timestamp))
        .ok()
        .and_then(|created| SystemTime::now().duration_since(created).ok())
        .map_or_else(|| "<unknown>".into(), |age| format!("{}s", age.as_secs()))
}
