//! The mirrored state handed to consumers, and the pure difference between two states.

use std::collections::btree_map::{self, BTreeMap};
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

/// Where an object lives: its namespace (empty when cluster-scoped) and name. Ordered by
/// namespace, then name, so snapshots iterate as `kubectl get -A` lists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// The objects by key. Values are shared (`Arc`), so a new snapshot costs one pointer copy
/// per object, not a deep copy of the JSON.
pub type Objects = BTreeMap<ObjectKey, Arc<Value>>;

/// An immutable, complete view of the resource at one resourceVersion.
///
/// Consumers get it whole: a snapshot is never a half-applied LIST, and a re-list after 410
/// replaces the previous one in a single swap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Every object, by namespace and name.
    pub objects: Objects,
    /// The resourceVersion this state is complete at ("" before the first LIST).
    pub resource_version: String,
    /// Whether a LIST has completed: before that the snapshot is empty because nothing is
    /// known yet, not because the resource has no objects. Stays true while the server is
    /// unreachable (the last state is kept).
    pub synced: bool,
    /// Counts published snapshots (0: the initial empty one); tells two states apart cheaply.
    pub generation: u64,
}

impl Snapshot {
    /// The object at `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }

    /// What changed from `older` to `self`: the net difference, whatever number of events or
    /// re-lists lie between them. A consumer that keeps the previous snapshot gets its
    /// deletes from this even when intermediate snapshots were coalesced.
    pub fn changes_since(&self, older: &Snapshot) -> Vec<Change> {
        diff(&older.objects, &self.objects)
    }
}

/// One object's net change between two states.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Added {
        key: ObjectKey,
        object: Arc<Value>,
    },
    Modified {
        key: ObjectKey,
        old: Arc<Value>,
        new: Arc<Value>,
    },
    Deleted {
        key: ObjectKey,
        old: Arc<Value>,
    },
}

impl Change {
    /// The object the change is about.
    pub fn key(&self) -> &ObjectKey {
        match self {
            Self::Added { key, .. } | Self::Modified { key, .. } | Self::Deleted { key, .. } => key,
        }
    }
}

/// The net difference from `old` to `new`, in key order: one merge walk over both sorted maps.
/// Objects are compared by content (pointer equality first), so an object a re-list returns
/// unchanged is not reported.
pub fn diff(old: &Objects, new: &Objects) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut old_iter = old.iter().peekable();
    let mut new_iter = new.iter().peekable();
    loop {
        let order = match (old_iter.peek(), new_iter.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((old_key, _)), Some((new_key, _))) => old_key.cmp(new_key),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some((key, old)) = old_iter.next() {
                    changes.push(Change::Deleted {
                        key: key.clone(),
                        old: old.clone(),
                    });
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some((key, object)) = new_iter.next() {
                    changes.push(Change::Added {
                        key: key.clone(),
                        object: object.clone(),
                    });
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some((key, old)), Some((_, new))) = (old_iter.next(), new_iter.next()) {
                    if !same(old, new) {
                        changes.push(Change::Modified {
                            key: key.clone(),
                            old: old.clone(),
                            new: new.clone(),
                        });
                    }
                }
            }
        }
    }
    changes
}

fn same(a: &Arc<Value>, b: &Arc<Value>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// Inserts or replaces `key`; false when the stored object is already equal (a replayed
/// event), so the caller need not publish.
pub fn upsert(objects: &mut Objects, key: ObjectKey, object: Value) -> bool {
    match objects.entry(key) {
        btree_map::Entry::Occupied(mut entry) => {
            if **entry.get() == object {
                false
            } else {
                entry.insert(Arc::new(object));
                true
            }
        }
        btree_map::Entry::Vacant(entry) => {
            entry.insert(Arc::new(object));
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objects(items: &[(&str, &str, i64)]) -> Objects {
        items
            .iter()
            .map(|(ns, name, spec)| (ObjectKey::new(*ns, *name), Arc::new(json!({"spec": spec}))))
            .collect()
    }

    #[test]
    fn diff_reports_net_adds_updates_and_deletes_once() {
        let old = objects(&[("", "a", 1), ("", "b", 1), ("n", "c", 1), ("n", "d", 1)]);
        let new = objects(&[("", "b", 2), ("n", "c", 1), ("n", "e", 1), ("z", "a", 1)]);
        let changes = diff(&old, &new);
        let summary: Vec<String> = changes
            .iter()
            .map(|change| match change {
                Change::Added { key, .. } => format!("+{key}"),
                Change::Modified { key, old, new } => {
                    format!("~{key}:{}->{}", old["spec"], new["spec"])
                }
                Change::Deleted { key, .. } => format!("-{key}"),
            })
            .collect();
        assert_eq!(summary, ["-a", "~b:1->2", "-n/d", "+n/e", "+z/a"]);
        assert!(diff(&new, &new).is_empty());
        assert_eq!(diff(&Objects::new(), &new).len(), 4);
        assert_eq!(diff(&old, &Objects::new()).len(), 4);
    }

    #[test]
    fn equal_content_is_not_a_change() {
        let old = objects(&[("", "a", 1)]);
        let new = objects(&[("", "a", 1)]);
        assert!(!Arc::ptr_eq(
            &old[&ObjectKey::new("", "a")],
            &new[&ObjectKey::new("", "a")]
        ));
        assert!(diff(&old, &new).is_empty());
    }

    #[test]
    fn upsert_ignores_replays() {
        let mut map = Objects::new();
        assert!(upsert(&mut map, ObjectKey::new("", "a"), json!(1)));
        assert!(!upsert(&mut map, ObjectKey::new("", "a"), json!(1)));
        assert!(upsert(&mut map, ObjectKey::new("", "a"), json!(2)));
    }

    #[test]
    fn snapshots_diff_and_keys_display() {
        let older = Snapshot::default();
        let newer = Snapshot {
            objects: objects(&[("ns", "x", 1)]),
            resource_version: "3".into(),
            synced: true,
            generation: 1,
        };
        let changes = newer.changes_since(&older);
        assert_eq!(changes[0].key().to_string(), "ns/x");
        assert!(newer.get(&ObjectKey::new("ns", "x")).is_some());
    }
}
