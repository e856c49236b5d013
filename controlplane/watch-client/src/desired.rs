//! Whether two states differ in what a role acts on. Every gateway's health report is a status
//! write, and each write reaches every watcher as a new snapshot: without this check, N
//! reporting gateways made each other re-validate and reinstall all their clusters N times per
//! round (issue 36). A role compares the snapshot it last applied with the new one and skips
//! the apply when only status or server-managed metadata moved.

use std::sync::Arc;

use imbl::ordmap::DiffItem;
use serde_json::{Map, Value};

use crate::snapshot::Objects;

/// Metadata the server writes on every change, status-only ones included: it says nothing
/// about what the object asks for.
const SERVER_MANAGED: [&str; 2] = ["resourceVersion", "managedFields"];

/// Whether `a` and `b` hold the same objects with the same content, ignoring each object's
/// `status` and server-managed metadata. Only the objects that differ are looked at: two
/// snapshots of one mirror share the rest, so a status write costs its own object, not every
/// object of the resource (issue 36).
pub fn same_desired_state(a: &Objects, b: &Objects) -> bool {
    a.diff(b).all(|item| match item {
        DiffItem::Update {
            old: (_, a),
            new: (_, b),
        } => same_desired_object(a, b),
        DiffItem::Add(..) | DiffItem::Remove(..) => false,
    })
}

fn same_desired_object(a: &Arc<Value>, b: &Arc<Value>) -> bool {
    #[cfg(test)]
    tests::COMPARED.with(|compared| compared.set(compared.get() + 1));
    if Arc::ptr_eq(a, b) {
        return true;
    }
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => same_fields(
            a,
            b,
            |field| field == "status",
            |field, a, b| {
                if field == "metadata" {
                    match (a.as_object(), b.as_object()) {
                        (Some(a), Some(b)) => same_fields(
                            a,
                            b,
                            |field| SERVER_MANAGED.contains(&field),
                            |_, a, b| a == b,
                        ),
                        _ => a == b,
                    }
                } else {
                    a == b
                }
            },
        ),
        _ => a == b,
    }
}

/// Whether the two maps agree on every field `ignored` does not name, each pair compared by
/// `same`.
fn same_fields(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    ignored: impl Fn(&str) -> bool,
    same: impl Fn(&str, &Value, &Value) -> bool,
) -> bool {
    let counted = |map: &Map<String, Value>| map.keys().filter(|key| !ignored(key)).count();
    counted(a) == counted(b)
        && a.iter()
            .filter(|(key, _)| !ignored(key))
            .all(|(key, value)| b.get(key).is_some_and(|other| same(key, value, other)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::ObjectKey;
    use serde_json::json;

    thread_local! {
        /// Objects `same_desired_object` looked at on this thread.
        pub(super) static COMPARED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn state(objects: &[Value]) -> Objects {
        objects
            .iter()
            .map(|object| {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                (ObjectKey::new("ns", name), Arc::new(object.clone()))
            })
            .collect()
    }

    fn cluster(rv: &str, replicas: u32, health: &str) -> Value {
        json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "UpstreamCluster",
            "metadata": {"name": "a", "resourceVersion": rv, "labels": {"team": "x"},
                         "managedFields": [{"manager": rv}]},
            "spec": {"servers": replicas},
            "status": {"gateways": [{"name": "g1", "health": health}]}
        })
    }

    #[test]
    fn a_status_write_is_not_a_desired_change() {
        let before = state(&[cluster("5", 2, "ok")]);
        let after = state(&[cluster("6", 2, "degraded")]);
        assert!(same_desired_state(&before, &after));
        assert!(same_desired_state(&before, &before));
    }

    #[test]
    fn spec_metadata_and_membership_changes_are() {
        let before = state(&[cluster("5", 2, "ok")]);
        assert!(!same_desired_state(
            &before,
            &state(&[cluster("6", 3, "ok")])
        ));
        let mut relabelled = cluster("6", 2, "ok");
        relabelled["metadata"]["labels"]["team"] = json!("y");
        assert!(!same_desired_state(&before, &state(&[relabelled])));
        let mut second = cluster("7", 2, "ok");
        second["metadata"]["name"] = json!("b");
        assert!(!same_desired_state(
            &before,
            &state(&[cluster("5", 2, "ok"), second])
        ));
        assert!(!same_desired_state(&before, &Objects::new()));
        let mut no_status = cluster("5", 2, "ok");
        no_status
            .as_object_mut()
            .map(|object| object.remove("spec"));
        assert!(!same_desired_state(&before, &state(&[no_status])));
    }

    #[test]
    fn a_status_write_to_one_of_many_objects_compares_that_object_alone() {
        let before: Objects = (0..10_000)
            .map(|index| {
                let mut object = cluster("5", 2, "ok");
                object["metadata"]["name"] = json!(format!("c{index:05}"));
                (
                    ObjectKey::new("ns", format!("c{index:05}")),
                    Arc::new(object),
                )
            })
            .collect();
        let mut after = before.clone();
        let mut written = cluster("6", 2, "degraded");
        written["metadata"]["name"] = json!("c04321");
        after.insert(ObjectKey::new("ns", "c04321"), Arc::new(written));
        COMPARED.with(|compared| compared.set(0));
        crate::snapshot::KEYS_COMPARED.with(|compared| compared.set(0));
        assert!(same_desired_state(&before, &after));
        assert_eq!(COMPARED.with(std::cell::Cell::get), 1);
        // The walk skips the subtrees both snapshots share: 9 keys ordered here (2026-12-01),
        // where a walk through every entry orders about 10,000.
        let keys = crate::snapshot::KEYS_COMPARED.with(std::cell::Cell::get);
        assert!(
            keys < 100,
            "the diff ordered {keys} keys for one changed object"
        );
    }
}
