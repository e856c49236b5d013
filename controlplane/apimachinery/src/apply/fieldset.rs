//! Sets of field paths and their `FieldsV1` encoding, as `metadata.managedFields` carries them.
//!
//! A set is a tree keyed by FieldsV1 path elements (`f:spec`, and from clients also `k:{..}`,
//! `v:..`, `i:N`); a node is a *member* when the path itself is in the set (encoded as `{}` for
//! a leaf, as a `.` key next to its children otherwise).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// A set of field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

/// Why a `fieldsV1` document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldsV1Error {
    #[error("fieldsV1 must be a JSON object at {0}")]
    NotAnObject(String),
    #[error("fieldsV1 path element {0:?} is not f:, k:, v:, i: or .")]
    BadElement(String),
}

/// The FieldsV1 key of a named field.
pub fn field(name: &str) -> String {
    format!("f:{name}")
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// Adds `path` (FieldsV1 keys from the root) as a member.
    pub fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for element in path {
            node = node.children.entry(element.clone()).or_default();
        }
        node.member = true;
    }

    /// The subtree at `path`, if any part of the set lies there.
    pub fn at(&self, path: &[String]) -> Option<&FieldSet> {
        let mut node = self;
        for element in path {
            node = node.children.get(element)?;
        }
        Some(node)
    }

    /// The set without anything at or under the top-level element `element`.
    pub fn without(&self, element: &[String; 1]) -> FieldSet {
        let mut out = self.clone();
        out.children.remove(&element[0]);
        out
    }

    /// Whether `path` or anything under it is in the set.
    pub fn touches(&self, path: &[String]) -> bool {
        self.at(path).is_some_and(|node| !node.is_empty())
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.member |= other.member;
        for (key, child) in &other.children {
            let merged = match out.children.get(key) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(key.clone(), merged);
        }
        out
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            if let Some(theirs) = other.children.get(key) {
                let both = child.intersection(theirs);
                if !both.is_empty() {
                    out.children.insert(key.clone(), both);
                }
            }
        }
        out
    }

    /// The members of `self` that are not members of `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet {
            member: self.member && !other.member,
            children: BTreeMap::new(),
        };
        for (key, child) in &self.children {
            let rest = match other.children.get(key) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(key.clone(), rest);
            }
        }
        out
    }

    /// Every member path, in order.
    pub fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (key, child) in &self.children {
            prefix.push(key.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    /// The `fieldsV1` document of the set.
    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        if self.member && !self.children.is_empty() {
            map.insert(".".into(), Value::Object(Map::new()));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.to_fields_v1());
        }
        Value::Object(map)
    }

    /// Parses a `fieldsV1` document. The root itself is never a member.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, FieldsV1Error> {
        let mut set = Self::decode(value, "")?;
        set.member = false;
        Ok(set)
    }

    fn decode(value: &Value, at: &str) -> Result<FieldSet, FieldsV1Error> {
        let map = value
            .as_object()
            .ok_or_else(|| FieldsV1Error::NotAnObject(at.to_string()))?;
        let mut set = FieldSet {
            // `{}` is a leaf member; a non-empty node is a member only with its `.` key.
            member: map.is_empty(),
            children: BTreeMap::new(),
        };
        for (key, child) in map {
            if key == "." {
                if child.as_object().is_none_or(|m| !m.is_empty()) {
                    return Err(FieldsV1Error::NotAnObject(format!("{at}.")));
                }
                set.member = true;
                continue;
            }
            if !["f:", "k:", "v:", "i:"].iter().any(|p| key.starts_with(p)) {
                return Err(FieldsV1Error::BadElement(key.clone()));
            }
            let path = format!("{at}{}", render_element(key));
            set.children
                .insert(key.clone(), Self::decode(child, &path)?);
        }
        Ok(set)
    }
}

/// A path as kube prints it in conflicts: `.spec.servers`, `.spec.ports[name="http"]`.
pub fn render_path(path: &[String]) -> String {
    path.iter().map(|element| render_element(element)).collect()
}

fn render_element(element: &str) -> String {
    if let Some(name) = element.strip_prefix("f:") {
        return format!(".{name}");
    }
    if let Some(index) = element.strip_prefix("i:") {
        return format!("[{index}]");
    }
    if let Some(value) = element.strip_prefix("v:") {
        return format!("[={value}]");
    }
    if let Some(keys) = element.strip_prefix("k:") {
        let fields = serde_json::from_str::<Map<String, Value>>(keys)
            .map(|map| {
                map.iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_else(|_| keys.to_string());
        return format!("[{fields}]");
    }
    element.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| field(n)).collect()
    }

    #[test]
    fn encodes_members_and_containers_like_kube() {
        let mut set = FieldSet::default();
        set.insert(&path(&["spec", "x"]));
        set.insert(&path(&["metadata", "labels"]));
        set.insert(&path(&["metadata", "labels", "app"]));
        let encoded = set.to_fields_v1();
        assert_eq!(
            encoded,
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:x": {}}})
        );
        assert_eq!(FieldSet::from_fields_v1(&encoded), Ok(set));
    }

    #[test]
    fn set_algebra_works_on_members() {
        let mut a = FieldSet::default();
        a.insert(&path(&["spec", "x"]));
        a.insert(&path(&["spec", "y"]));
        let mut b = FieldSet::default();
        b.insert(&path(&["spec", "y"]));
        b.insert(&path(&["spec", "z"]));
        assert_eq!(a.intersection(&b).members(), vec![path(&["spec", "y"])]);
        assert_eq!(a.difference(&b).members(), vec![path(&["spec", "x"])]);
        assert_eq!(a.union(&b).members().len(), 3);
        assert!(a.touches(&path(&["spec"])));
        assert!(!a.touches(&path(&["status"])));
        assert!(a.difference(&a).is_empty());
    }

    #[test]
    fn refuses_malformed_documents() {
        assert!(matches!(
            FieldSet::from_fields_v1(&json!({"spec": {}})),
            Err(FieldsV1Error::BadElement(_))
        ));
        assert!(FieldSet::from_fields_v1(&json!({"f:spec": 1})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"f:spec": {".": {"f:x": {}}}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!([])).is_err());
    }

    #[test]
    fn renders_paths_as_kube_prints_them() {
        let keyed = vec![
            field("spec"),
            field("ports"),
            r#"k:{"name":"http"}"#.to_string(),
            field("port"),
        ];
        assert_eq!(render_path(&keyed), r#".spec.ports[name="http"].port"#);
        assert_eq!(render_path(&path(&["spec", "servers"])), ".spec.servers");
    }
}
