//! What one watch chunk costs a data-plane role whose resource is large (issue 36): a node
//! mirrors every Agent, and each node's status write about an agent (connected here, gone
//! there) reaches every node as a chunk. Per chunk the watch client applies the event,
//! publishes a snapshot, and the node's feed compares it with the snapshot it last applied
//! (`sluice/src/daemon/feeds.rs`). Measured at 1,000, 10,000 and 100,000 Agents.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};
use sluice_watch_client::{same_desired_state, Mirror, ObjectKey, Objects, WatchEvent};

fn agent(id: usize, connected: bool) -> Value {
    json!({
        "apiVersion": "tunnel.sluice.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": format!("agent-{id:06}"), "resourceVersion": "1"},
        "spec": {"id": id, "tokenSha256": "ab".repeat(32)},
        "status": {"nodes": {"node-a": {"connected": connected}}},
    })
}

/// `advance`: the feed compares each chunk with the one before it (a status write becomes the
/// base, as `feeds.rs` does now); otherwise with the first, as it did while only a desired
/// change moved its base.
fn bench_chunks(c: &mut Criterion, advance: bool) {
    for agents in [1_000, 10_000, 100_000] {
        let (mut mirror, snapshots) = Mirror::new();
        let listed: Objects = (0..agents)
            .map(|id| {
                let key = ObjectKey::new("", format!("agent-{id:06}"));
                (key, Arc::new(agent(id, false)))
            })
            .collect();
        mirror.replace(listed, "1".into());
        mirror.publish();
        let mut applied = snapshots.borrow().clone();
        let mut revision = 1u64;
        let base = if advance { "last chunk" } else { "first chunk" };
        c.bench_function(
            &format!("status write, {agents} agents, base {base}"),
            |b| {
                b.iter(|| {
                    revision += 1;
                    let id = (revision as usize * 7919) % agents;
                    mirror.apply(WatchEvent::Upsert {
                        added: false,
                        key: ObjectKey::new("", format!("agent-{id:06}")),
                        resource_version: revision.to_string(),
                        object: agent(id, revision.is_multiple_of(2)),
                    });
                    mirror.publish();
                    let published = snapshots.borrow().clone();
                    let same = same_desired_state(&applied.objects, &published.objects);
                    if advance {
                        applied = published;
                    }
                    black_box(same)
                })
            },
        );
    }
}

fn chunks_against_the_last(c: &mut Criterion) {
    bench_chunks(c, true);
}

fn chunks_against_the_first(c: &mut Criterion) {
    bench_chunks(c, false);
}

criterion_group!(benches, chunks_against_the_last, chunks_against_the_first);
criterion_main!(benches);
