//! What a watch chunk costs the reflector and its consumers when the resource is large: a
//! status write to one of 20,000 objects is applied, published as a snapshot, and compared
//! with the snapshot a consumer applied before. Counted in allocations, which a copy of the
//! objects' map (one key per object) makes by the tens of thousands (issue 36: 32 ms per chunk
//! at 100,000 Agents, on every node).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use serde_json::{json, Value};
use sluice_watch_client::{same_desired_state, Mirror, ObjectKey, Objects, WatchEvent};
use test_support::thread_allocations::{counted, HookedAllocator, THREAD_ALLOCATIONS};

#[global_allocator]
static GLOBAL: HookedAllocator = THREAD_ALLOCATIONS;

const OBJECTS: usize = 20_000;

fn agent(id: usize, status: Value) -> Value {
    json!({
        "metadata": {"name": format!("agent-{id:05}"), "resourceVersion": "1"},
        "spec": {"id": id, "tokenSha256": "ab".repeat(32)},
        "status": status,
    })
}

fn status_write(id: usize, resource_version: &str) -> WatchEvent {
    WatchEvent::Upsert {
        added: false,
        key: ObjectKey::new("", format!("agent-{id:05}")),
        resource_version: resource_version.into(),
        object: agent(id, json!({"nodes": {"node-a": {"connected": true}}})),
    }
}

#[test]
fn a_chunk_costs_what_it_changed_not_the_size_of_the_resource() {
    let (mut mirror, snapshots) = Mirror::new();
    let listed: Objects = (0..OBJECTS)
        .map(|id| {
            let object = agent(id, json!({}));
            (
                ObjectKey::new("", format!("agent-{id:05}")),
                Arc::new(object),
            )
        })
        .collect();
    mirror.replace(listed, "1".into());
    mirror.publish();
    let applied = snapshots.borrow().clone();
    assert_eq!(applied.objects.len(), OBJECTS);

    let event = status_write(OBJECTS / 2, "2");
    let ((same, changes), allocations) = counted(|| {
        mirror.apply(event);
        mirror.publish();
        let published = snapshots.borrow().clone();
        let same = same_desired_state(&applied.objects, &published.objects);
        (same, published.changes_since(&applied))
    });
    assert!(same, "a status write changes no desired state");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key().name, format!("agent-{:05}", OBJECTS / 2));
    // A copy of the map allocates at least a key per object (20,000); the persistent map
    // copies the path to the one changed object, a few nodes.
    assert!(
        allocations > 0,
        "counting is on: the event's object is stored"
    );
    assert!(
        allocations < 200,
        "{allocations} allocations for one status write to one of {OBJECTS} objects"
    );

    // A spec change is still seen, among as many objects.
    let mut changed = agent(7, json!({}));
    changed["spec"]["tokenSha256"] = json!("cd".repeat(32));
    mirror.apply(WatchEvent::Upsert {
        added: false,
        key: ObjectKey::new("", "agent-00007"),
        resource_version: "3".into(),
        object: changed,
    });
    mirror.publish();
    let published = snapshots.borrow().clone();
    assert!(!same_desired_state(&applied.objects, &published.objects));
}

#[test]
fn a_relist_that_changes_one_object_shares_the_rest() {
    let (mut mirror, snapshots) = Mirror::new();
    let list = |changed: Option<usize>| -> Objects {
        (0..OBJECTS)
            .map(|id| {
                let status = if Some(id) == changed {
                    json!({"nodes": {"node-b": {"connected": true}}})
                } else {
                    json!({})
                };
                (
                    ObjectKey::new("", format!("agent-{id:05}")),
                    Arc::new(agent(id, status)),
                )
            })
            .collect()
    };
    mirror.replace(list(None), "1".into());
    mirror.publish();
    let applied = snapshots.borrow().clone();
    let relisted = list(Some(3));
    let outcome = mirror.replace(relisted, "9".into());
    assert_eq!(
        (outcome.added, outcome.modified, outcome.deleted),
        (0, 1, 0)
    );
    mirror.publish();
    let published = snapshots.borrow().clone();
    // The LIST itself is read whole, but what consumers compare afterwards is one object.
    let (changes, allocations) = counted(|| published.changes_since(&applied));
    assert_eq!(changes.len(), 1);
    assert!(allocations < 200, "{allocations} allocations to compare");
}
