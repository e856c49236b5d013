//! What a role reports back into the objects it was pushed: a gateway the health of each
//! cluster's servers (`UpstreamCluster.status.gateways.<gateway>`), a node whether it holds
//! an agent's tunnels (`Agent.status.nodes.<node>`). Merge patches of the role's own entry,
//! so roles never overwrite each other; sent when the view changes, checked every
//! [`INTERVAL`]. A failed report is retried at the next check; the data plane never waits on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_gateway_proxy::Gateway;
use sluice_tunnel::node::NodeShared;
use sluice_watch_client::{Snapshot, Transport};
use tokio::sync::watch;

/// How often the view is compared with what was last reported.
const INTERVAL: Duration = Duration::from_secs(2);
/// The control plane's answer to a status patch is read up to this size, then dropped.
const ANSWER_LIMIT: usize = 4 << 20;

/// Reports a gateway's server health per cluster until `stopping`.
pub async fn report_gateway(
    transport: Transport,
    gateway: Arc<Gateway>,
    me: String,
    stopping: watch::Receiver<bool>,
) {
    // A gateway's clusters are few: its view is built at every check.
    let view = move || {
        let generation = gateway.current();
        let view = generation
            .snapshot
            .clusters()
            .iter()
            .zip(generation.clusters.iter())
            .map(|(cluster, runtime)| {
                let servers: Vec<Value> = cluster
                    .servers
                    .iter()
                    .zip(runtime.health.iter())
                    .map(|(server, health)| {
                        json!({"endpoint": &*server.endpoint, "healthy": health.is_healthy()})
                    })
                    .collect();
                let path = format!(
                    "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters/{}/status",
                    cluster.name
                );
                (
                    path,
                    json!({"status": {"gateways": {&me: {"servers": servers}}}}),
                )
            })
            .collect();
        Some(view)
    };
    report(transport, view, stopping).await;
}

/// Reports which agents a node holds until `stopping`: its entry in each held Agent's
/// `status.nodes`, removed (`null` in the merge patch) when it holds the agent no more.
pub async fn report_node(
    transport: Transport,
    node: Arc<NodeShared>,
    agents: watch::Receiver<Arc<Snapshot>>,
    stopping: watch::Receiver<bool>,
) {
    let me = node.node_name.clone();
    let mut last = LastInputs::default();
    let view = move || {
        let held = node.held_agents();
        let snapshot = agents.borrow().clone();
        last.changed(&held, snapshot.generation)
            .then(|| node_view(&me, &held, &snapshot))
    };
    report(transport, view, stopping).await;
}

/// What a node's view was last built from. A node holding 100,000 agents would otherwise
/// build a patch per Agent object every [`INTERVAL`] while nothing moves (issue 36); now an
/// idle node only reads and compares its held agents' ids at each check.
#[derive(Debug, Default)]
struct LastInputs(Option<(Vec<i64>, u64)>);

impl LastInputs {
    /// Whether the held agents or the Agent objects (by snapshot generation) changed since the
    /// last call; records them.
    fn changed(&mut self, held: &[i64], generation: u64) -> bool {
        let same = self.0.as_ref().is_some_and(|(last_held, last_generation)| {
            *last_generation == generation && last_held.as_slice() == held
        });
        if !same {
            self.0 = Some((held.to_vec(), generation));
        }
        !same
    }
}

/// The node's entry for every Agent object: connected when `held` (sorted) has its id.
fn node_view(me: &str, held: &[i64], snapshot: &Snapshot) -> BTreeMap<String, Value> {
    snapshot
        .objects
        .iter()
        .filter_map(|(key, object)| {
            let id = object.pointer("/spec/id")?.as_i64()?;
            let entry = match held.binary_search(&id) {
                Ok(_) => json!({"connected": true}),
                Err(_) => Value::Null,
            };
            let path = format!(
                "/apis/tunnel.sluice.dev/v1alpha1/agents/{}/status",
                key.name
            );
            Some((path, json!({"status": {"nodes": {me: entry}}})))
        })
        .collect()
}

/// Sends each patch of `view` whose content changed since it was last sent successfully.
/// `view` answers `None` when its inputs did not change since its last answer; the last view
/// is then sent again only if part of it failed to send.
async fn report(
    transport: Transport,
    mut view: impl FnMut() -> Option<BTreeMap<String, Value>>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut reported: BTreeMap<String, Value> = BTreeMap::new();
    let mut current: BTreeMap<String, Value> = BTreeMap::new();
    let mut unsent = false;
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopping.wait_for(|stopped| *stopped) => return,
        }
        match view() {
            Some(now) => current = now,
            None if !unsent => continue,
            None => {}
        }
        unsent = false;
        for (path, patch) in &current {
            if reported.get(path) == Some(patch) {
                continue;
            }
            // Removing an entry never reported: nothing to send.
            if !reported.contains_key(path) && only_nulls(patch) {
                reported.insert(path.clone(), patch.clone());
                continue;
            }
            let body = Bytes::from(patch.to_string());
            match transport.merge_patch(path, body, ANSWER_LIMIT).await {
                Ok(_) => {
                    reported.insert(path.clone(), patch.clone());
                }
                // A deleted object, an unreachable control plane: tried again next time.
                Err(error) => {
                    unsent = true;
                    tracing::debug!(%path, %error, "status report not sent");
                }
            }
        }
        reported.retain(|path, _| current.contains_key(path));
    }
}

/// Whether every leaf of `patch` is `null` (it only removes entries).
fn only_nulls(patch: &Value) -> bool {
    match patch {
        Value::Null => true,
        Value::Object(map) => map.values().all(only_nulls),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_view_is_built_again_only_when_its_inputs_change() {
        let mut last = LastInputs::default();
        assert!(last.changed(&[1, 2], 1), "the first view is built");
        assert!(!last.changed(&[1, 2], 1), "nothing moved: no view");
        assert!(last.changed(&[1, 2, 3], 1), "an agent came");
        assert!(last.changed(&[1, 2, 3], 2), "the Agent objects changed");
        assert!(!last.changed(&[1, 2, 3], 2));
        assert!(last.changed(&[2, 3], 2), "an agent left");
    }

    #[test]
    fn removals_are_told_from_reports() {
        assert!(only_nulls(&json!({"status": {"nodes": {"node-1": null}}})));
        assert!(!only_nulls(
            &json!({"status": {"nodes": {"node-1": {"connected": true}}}})
        ));
    }
}
