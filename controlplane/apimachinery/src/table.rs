//! Content negotiation of `Accept` and `meta.k8s.io Table` responses for `kubectl get`.
//!
//! kubectl v1.32 `get` (`pkg/cmd/get/get.go`, `transformRequests`) sends
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json`
//! and `?includeObject=Object` only when sorting; it prints the Table's cells as they come
//! (the server renders Age), and with a plain JSON answer it prints client-side (names only
//! for a kind it does not know).

use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::kind::{KindSpec, PrinterColumn};
use crate::list::WatchEventType;
use crate::status::StatusError;
use crate::timestamp::{human_age, parse_rfc3339};

/// What the response body should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    /// The objects themselves (`application/json`).
    Object,
    /// A Table of the given `meta.k8s.io` version (`v1` or `v1beta1`).
    Table(TableVersion),
}

/// The `meta.k8s.io` version of a Table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableVersion {
    /// `meta.k8s.io/v1`
    V1,
    /// `meta.k8s.io/v1beta1` (same shape)
    V1beta1,
}

impl TableVersion {
    fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "meta.k8s.io/v1",
            Self::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// What the server can answer for resource requests (for 406 messages).
const SERVED: [&str; 1] = ["application/json"];

/// Picks the first `Accept` alternative the server can serve: a Table, or plain JSON (also for
/// `*/*`, `application/*` and a missing header). 406 when none can be served.
pub fn negotiate(accept: Option<&str>) -> Result<ResponseFormat, StatusError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(ResponseFormat::Object);
    };
    for alternative in accept.split(',') {
        let mut parts = alternative.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(
            media_type.as_str(),
            "application/json" | "application/*" | "*/*"
        ) {
            continue;
        }
        let mut params = (None, None, None);
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim() {
                "as" => params.0 = Some(value),
                "v" => params.1 = Some(value),
                "g" => params.2 = Some(value),
                _ => {}
            }
        }
        match params {
            (None, None, None) => return Ok(ResponseFormat::Object),
            (Some("Table"), Some("v1"), Some("meta.k8s.io")) => {
                return Ok(ResponseFormat::Table(TableVersion::V1))
            }
            (Some("Table"), Some("v1beta1"), Some("meta.k8s.io")) => {
                return Ok(ResponseFormat::Table(TableVersion::V1beta1))
            }
            // Other `as=` forms (PartialObjectMetadata, aggregated discovery) are not served.
            _ => continue,
        }
    }
    Err(StatusError::not_acceptable(&SERVED))
}

/// What each Table row carries in `object` (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses `?includeObject=`; 400 for an unknown value.
    pub fn parse(value: Option<&str>) -> Result<Self, StatusError> {
        match value {
            None | Some("") | Some("Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(other) => Err(StatusError::bad_request(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"Metadata\", \"None\", \"Object\""
            ))),
        }
    }
}

/// How to render Tables for one request.
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// The Table version negotiated.
    pub version: TableVersion,
    /// What each row carries.
    pub include_object: IncludeObject,
    /// The clock for the Age column.
    pub now: SystemTime,
}

fn column_definitions(spec: &KindSpec) -> Vec<Value> {
    let mut columns = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace.",
    })];
    for column in &spec.printer_columns {
        columns.push(json!({
            "name": column.name, "type": column.column_type, "format": "", "priority": 0,
            "description": column.description,
        }));
    }
    columns.push(json!({
        "name": "Age", "type": "string", "format": "", "priority": 0,
        "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
    }));
    columns
}

/// Follows a simple path like `.spec.servers` or `.status.conditions[0].type`.
pub fn lookup_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut current = obj;
    for segment in path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        let (field, indexes) = match segment.find('[') {
            Some(at) => (&segment[..at], &segment[at..]),
            None => (segment, ""),
        };
        if !field.is_empty() {
            current = current.get(field)?;
        }
        for index in indexes.split('[').filter(|s| !s.is_empty()) {
            let index: usize = index.trim_end_matches(']').parse().ok()?;
            current = current.get(index)?;
        }
    }
    Some(current)
}

/// A cell as kube's CRD table convertor renders it: strings as is, dates as ages, lists and
/// maps as compact JSON, missing as null (kubectl prints `<none>`).
fn cell(column: &PrinterColumn, obj: &Value, now: SystemTime) -> Value {
    let Some(value) = lookup_path(obj, &column.json_path) else {
        return Value::Null;
    };
    if column.column_type == "date" {
        if let Some(at) = value.as_str().and_then(parse_rfc3339) {
            return json!(human_age(at, now));
        }
    }
    match value {
        Value::Array(_) | Value::Object(_) => json!(value.to_string()),
        other => other.clone(),
    }
}

fn row(spec: &KindSpec, obj: &Value, options: &TableOptions) -> Value {
    let mut cells = vec![json!(crate::meta::object_name(obj))];
    cells.extend(
        spec.printer_columns
            .iter()
            .map(|c| cell(c, obj, options.now)),
    );
    let age = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
        .map(|at| json!(human_age(at, options.now)))
        .unwrap_or(json!("<unknown>"));
    cells.push(age);
    let mut row = json!({"cells": cells});
    match options.include_object {
        IncludeObject::None => {}
        IncludeObject::Object => row["object"] = obj.clone(),
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": options.version.api_version(),
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            })
        }
    }
    row
}

fn table(
    spec: &KindSpec,
    rows: Vec<Value>,
    metadata: Map<String, Value>,
    options: &TableOptions,
    with_columns: bool,
) -> Value {
    let mut table = json!({
        "kind": "Table",
        "apiVersion": options.version.api_version(),
        "metadata": metadata,
        "rows": rows,
    });
    if with_columns {
        table["columnDefinitions"] = json!(column_definitions(spec));
    }
    table
}

/// The Table of one object (GET of a name).
pub fn table_for_object(spec: &KindSpec, obj: &Value, options: &TableOptions) -> Value {
    let mut metadata = Map::new();
    if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
        metadata.insert("resourceVersion".into(), rv.clone());
    }
    table(spec, vec![row(spec, obj, options)], metadata, options, true)
}

/// The Table of a list document built by [`crate::list::list_document`] (its metadata, with
/// continue and resourceVersion, is carried over).
pub fn table_for_list(spec: &KindSpec, list: &Value, options: &TableOptions) -> Value {
    let rows = list["items"]
        .as_array()
        .map(|items| items.iter().map(|obj| row(spec, obj, options)).collect())
        .unwrap_or_default();
    let metadata = list
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    table(spec, rows, metadata, options, true)
}

/// A watch event whose object is a one-row Table. kube sends the column definitions with the
/// first event only; `first` says whether this is it. BOOKMARK and ERROR events are passed
/// through unchanged (their objects are not rows).
pub fn table_watch_event(
    spec: &KindSpec,
    event_type: WatchEventType,
    obj: &Value,
    options: &TableOptions,
    first: bool,
) -> Value {
    if matches!(event_type, WatchEventType::Bookmark | WatchEventType::Error) {
        return crate::list::watch_event(event_type, obj.clone());
    }
    let mut metadata = Map::new();
    if let Some(rv) = obj.pointer("/metadata/resourceVersion") {
        metadata.insert("resourceVersion".into(), rv.clone());
    }
    let table = table(
        spec,
        vec![row(spec, obj, options)],
        metadata,
        options,
        first,
    );
    crate::list::watch_event(event_type, table)
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
