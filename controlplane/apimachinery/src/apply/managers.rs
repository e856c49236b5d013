//! `metadata.managedFields`: who owns which fields, one entry per manager, operation (`Apply`
//! or `Update`) and subresource, as kube-apiserver encodes them.

use std::cmp::Ordering;

use serde_json::{json, Map, Value};

use super::fieldset::{FieldSet, FieldsV1Error};

/// Most `Update` entries an object keeps; older ones are merged into one `ancient-changes`
/// entry (kube-apiserver's cap, so clients with ever new user agents cannot grow an object).
pub const MAX_UPDATE_MANAGERS: usize = 10;
/// The manager the oldest updates are merged into.
pub const ANCIENT_CHANGES: &str = "ancient-changes";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    /// RFC 3339, seconds; the last time this manager changed the object.
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Entry {
    /// Whether two entries are the same manager's (kube's manager identifier: apply entries
    /// are not told apart by apiVersion).
    pub fn same_manager(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }
}

/// Why a client's `managedFields` were not taken (the stored ones are kept instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagedFieldsError {
    #[error("managedFields must be a list of objects")]
    NotAList,
    #[error("managedFields[{0}].{1} is missing or not a string")]
    BadString(usize, &'static str),
    #[error("managedFields[{0}].operation must be `Apply` or `Update`")]
    BadOperation(usize),
    #[error("managedFields[{0}].fieldsType must be `FieldsV1`")]
    BadFieldsType(usize),
    #[error("managedFields[{0}].fieldsV1: {1}")]
    BadFields(usize, FieldsV1Error),
}

/// The entries of an object's `metadata.managedFields` (none when absent); entries of the same
/// manager are merged.
pub fn decode(object: &Value) -> Result<Vec<Entry>, ManagedFieldsError> {
    let Some(list) = object.pointer("/metadata/managedFields") else {
        return Ok(Vec::new());
    };
    let list = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => return Err(ManagedFieldsError::NotAList),
    };
    let mut entries: Vec<Entry> = Vec::with_capacity(list.len());
    for (index, item) in list.iter().enumerate() {
        let entry = decode_entry(index, item)?;
        match entries.iter_mut().find(|e| e.same_manager(&entry)) {
            Some(existing) => {
                existing.fields = existing.fields.union(&entry.fields);
                existing.time = existing.time.take().max(entry.time);
            }
            None => entries.push(entry),
        }
    }
    Ok(entries)
}

fn decode_entry(index: usize, item: &Value) -> Result<Entry, ManagedFieldsError> {
    let map = item.as_object().ok_or(ManagedFieldsError::NotAList)?;
    let text = |key: &'static str, required: bool| match map.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        _ => Err(ManagedFieldsError::BadString(index, key)),
    };
    let operation = match text("operation", true)?.as_deref() {
        Some("Apply") => Operation::Apply,
        Some("Update") => Operation::Update,
        _ => return Err(ManagedFieldsError::BadOperation(index)),
    };
    if !matches!(
        text("fieldsType", false)?.as_deref(),
        None | Some("FieldsV1")
    ) {
        return Err(ManagedFieldsError::BadFieldsType(index));
    }
    let fields = match map.get("fieldsV1") {
        None | Some(Value::Null) => FieldSet::default(),
        Some(document) => FieldSet::from_fields_v1(document)
            .map_err(|error| ManagedFieldsError::BadFields(index, error))?,
    };
    let time = text("time", false)?;
    if time
        .as_deref()
        .is_some_and(|t| crate::timestamp::parse_rfc3339(t).is_none())
    {
        return Err(ManagedFieldsError::BadString(index, "time"));
    }
    Ok(Entry {
        manager: text("manager", false)?.unwrap_or_default(),
        operation,
        api_version: text("apiVersion", false)?.unwrap_or_default(),
        time,
        subresource: text("subresource", false)?.filter(|s| !s.is_empty()),
        fields,
    })
}

/// kube's order: Apply before Update, then by time, manager, apiVersion, subresource.
fn order(a: &Entry, b: &Entry) -> Ordering {
    a.operation
        .cmp(&b.operation)
        .then_with(|| a.time.cmp(&b.time))
        .then_with(|| a.manager.cmp(&b.manager))
        .then_with(|| a.api_version.cmp(&b.api_version))
        .then_with(|| a.subresource.cmp(&b.subresource))
}

/// Drops entries that own nothing, caps the updates, sorts, and encodes.
pub fn encode(mut entries: Vec<Entry>) -> Value {
    entries.retain(|entry| !entry.fields.is_empty());
    cap_updates(&mut entries);
    entries.sort_by(order);
    let list = entries
        .iter()
        .map(|entry| {
            let mut map = Map::new();
            map.insert("manager".into(), json!(entry.manager));
            map.insert("operation".into(), json!(entry.operation.as_str()));
            map.insert("apiVersion".into(), json!(entry.api_version));
            if let Some(time) = &entry.time {
                map.insert("time".into(), json!(time));
            }
            map.insert("fieldsType".into(), json!("FieldsV1"));
            map.insert("fieldsV1".into(), entry.fields.to_fields_v1());
            if let Some(subresource) = &entry.subresource {
                map.insert("subresource".into(), json!(subresource));
            }
            Value::Object(map)
        })
        .collect();
    Value::Array(list)
}

/// Merges the oldest `Update` entries into one `ancient-changes` entry until at most
/// [`MAX_UPDATE_MANAGERS`] remain.
fn cap_updates(entries: &mut Vec<Entry>) {
    let updates = entries
        .iter()
        .filter(|e| e.operation == Operation::Update)
        .count();
    if updates <= MAX_UPDATE_MANAGERS {
        return;
    }
    let (mut olds, rest): (Vec<Entry>, Vec<Entry>) = std::mem::take(entries)
        .into_iter()
        .partition(|e| e.operation == Operation::Update);
    olds.sort_by(order);
    let keep = olds.split_off(updates - MAX_UPDATE_MANAGERS + 1);
    let mut bucket = Entry {
        manager: ANCIENT_CHANGES.into(),
        operation: Operation::Update,
        api_version: olds
            .last()
            .map(|e| e.api_version.clone())
            .unwrap_or_default(),
        time: olds.last().and_then(|e| e.time.clone()),
        subresource: None,
        fields: FieldSet::default(),
    };
    for old in &olds {
        bucket.fields = bucket.fields.union(&old.fields);
    }
    *entries = rest;
    entries.extend(keep);
    entries.push(bucket);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fieldset::field;

    fn entry(manager: &str, operation: Operation, time: &str, leaf: &str) -> Entry {
        let mut fields = FieldSet::default();
        fields.insert(&[field("spec"), field(leaf)]);
        Entry {
            manager: manager.into(),
            operation,
            api_version: "x.sluice.dev/v1".into(),
            time: Some(time.into()),
            subresource: None,
            fields,
        }
    }

    #[test]
    fn round_trips_and_sorts_like_kube() {
        let entries = vec![
            entry("b", Operation::Update, "2026-01-01T00:00:02Z", "x"),
            entry("a", Operation::Update, "2026-01-01T00:00:03Z", "y"),
            entry("c", Operation::Apply, "2026-01-01T00:00:09Z", "z"),
        ];
        let encoded = encode(entries);
        let managers: Vec<&str> = encoded
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["manager"].as_str())
            .collect();
        assert_eq!(managers, ["c", "b", "a"]);
        assert_eq!(encoded[0]["fieldsV1"], json!({"f:spec": {"f:z": {}}}));
        assert_eq!(encoded[0]["fieldsType"], "FieldsV1");
        let object = json!({"metadata": {"managedFields": encoded}});
        assert_eq!(decode(&object).map(|d| d.len()), Ok(3));
    }

    #[test]
    fn refuses_malformed_entries() {
        let bad = |entry: Value| decode(&json!({"metadata": {"managedFields": [entry]}}));
        let ok = json!({"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:spec": {}}});
        assert!(bad(ok.clone()).is_ok());
        let mut op = ok.clone();
        op["operation"] = json!("Delete");
        assert_eq!(bad(op), Err(ManagedFieldsError::BadOperation(0)));
        let mut kind = ok.clone();
        kind["fieldsType"] = json!("FieldsV2");
        assert_eq!(bad(kind), Err(ManagedFieldsError::BadFieldsType(0)));
        let mut fields = ok.clone();
        fields["fieldsV1"] = json!({"spec": {}});
        assert!(matches!(
            bad(fields),
            Err(ManagedFieldsError::BadFields(0, _))
        ));
        let mut time = ok;
        time["time"] = json!("yesterday");
        assert_eq!(bad(time), Err(ManagedFieldsError::BadString(0, "time")));
        assert_eq!(
            decode(&json!({"metadata": {"managedFields": {}}})),
            Err(ManagedFieldsError::NotAList)
        );
    }

    #[test]
    fn caps_updates_into_ancient_changes() {
        let mut entries: Vec<Entry> = (0..12)
            .map(|i| {
                let time = format!("2026-01-01T00:00:{i:02}Z");
                entry(
                    &format!("m{i:02}"),
                    Operation::Update,
                    &time,
                    &format!("f{i}"),
                )
            })
            .collect();
        entries.push(entry(
            "applier",
            Operation::Apply,
            "2026-01-01T00:00:00Z",
            "a",
        ));
        let encoded = encode(entries);
        let list = encoded.as_array().cloned().unwrap_or_default();
        let updates = list.iter().filter(|e| e["operation"] == "Update").count();
        assert_eq!(updates, MAX_UPDATE_MANAGERS);
        let bucket = list
            .iter()
            .find(|e| e["manager"] == ANCIENT_CHANGES)
            .cloned()
            .unwrap_or_default();
        // m00, m01 and m02 merged; the bucket carries the newest of their times.
        assert_eq!(
            bucket["fieldsV1"],
            json!({"f:spec": {"f:f0": {}, "f:f1": {}, "f:f2": {}}})
        );
        assert_eq!(bucket["time"], "2026-01-01T00:00:02Z");
        assert!(list.iter().any(|e| e["manager"] == "applier"));
    }
}
