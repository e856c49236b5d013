//! What a role reports back into the objects it was pushed: a gateway the health of each
//! cluster's servers (`UpstreamCluster.status.gateways.<gateway>`), a node whether it holds
//! an agent's tunnels (`Agent.status.nodes.<node>`). Merge patches of the role's own entry,
//! so roles never overwrite each other; sent when the view changes, checked every
//! [`INTERVAL`]. A failed report is retried at the next check; the data plane never waits on it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use sluice_gateway_proxy::Gateway;
use sluice_tunnel::node::NodeShared;
use sluice_watch_client::{same_desired_state, Objects, Snapshot, Transport, WatchError};
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
        last.changed(&held, &snapshot.objects)
            .then(|| node_view(&me, &held, &snapshot))
    };
    report(transport, view, stopping).await;
}

/// What a node's view was last built from. A node holding 100,000 agents would otherwise
/// build a patch per Agent object every [`INTERVAL`] while nothing moves (issue 36); now an
/// idle node only reads and compares its held agents' ids at each check. Status writes (its
/// own coming back through the watch, other nodes') change no view: the Agent objects are
/// compared without `status`, and only where the snapshots differ.
#[derive(Debug, Default)]
struct LastInputs(Option<(Vec<i64>, Objects)>);

impl LastInputs {
    /// Whether the held agents or the Agent objects (status aside) changed since the last
    /// call; records them.
    fn changed(&mut self, held: &[i64], objects: &Objects) -> bool {
        let same = self.0.as_ref().is_some_and(|(last_held, last_objects)| {
            last_held.as_slice() == held && same_desired_state(last_objects, objects)
        });
        // The newest objects are kept even when they are the same but for status: the next
        // comparison then walks only what changed since, and no older copy of a rewritten
        // object stays alive (a clone shares the map's nodes).
        match &mut self.0 {
            Some((_, last_objects)) if same => *last_objects = objects.clone(),
            _ => self.0 = Some((held.to_vec(), objects.clone())),
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

/// Where reports go: the control plane's API. A trait so a round is tested without one.
trait StatusSink {
    async fn merge_patch(&self, path: &str, body: Bytes) -> Result<(), WatchError>;
}

impl StatusSink for Transport {
    async fn merge_patch(&self, path: &str, body: Bytes) -> Result<(), WatchError> {
        Transport::merge_patch(self, path, body, ANSWER_LIMIT)
            .await
            .map(drop)
    }
}

/// Sends the patches of `view` whose content changed since they were last sent successfully,
/// every [`INTERVAL`]. `view` answers `None` when its inputs did not change since its last
/// answer; the last view is then sent again only if part of it was left unsent.
async fn report(
    sink: impl StatusSink,
    mut view: impl FnMut() -> Option<BTreeMap<String, Value>>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut reported: BTreeMap<String, Value> = BTreeMap::new();
    let mut current: BTreeMap<String, Value> = BTreeMap::new();
    let mut unsent = false;
    let mut paused = false;
    let mut resume_after: Option<String> = None;
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
        let round = send_changed(&sink, &current, &mut reported, resume_after.as_deref()).await;
        unsent = round.unsent > 0;
        match (&round.stopped_by, paused) {
            (Some(error), false) => tracing::warn!(
                %error,
                unsent = round.unsent,
                "status reports paused: the control plane refuses them for now; the rest is \
                 sent from the next check on"
            ),
            (None, true) => tracing::info!("status reports resumed"),
            _ => {}
        }
        paused = round.stopped_by.is_some();
        resume_after = round.stopped_at;
        reported.retain(|path, _| current.contains_key(path));
    }
}

/// What a round of [`send_changed`] left.
#[derive(Debug)]
struct Round {
    /// Patches not sent successfully this round.
    unsent: usize,
    /// The error that ended the round before its last patch.
    stopped_by: Option<WatchError>,
    /// The patch's path that met it: the next round starts after it.
    stopped_at: Option<String>,
}

/// Sends each patch of `current` that differs from what `reported` holds for its path, and
/// records what was sent. A refusal about one object (a deleted Agent: 404) moves on to the
/// next; an error the server would give every request (429 of the write budget, 5xx, an
/// unreachable control plane) ends the round, and the rest waits for the next check. A node
/// that restarts holding 100,000 agents would otherwise send every patch past its write
/// budget's burst into a 429, every round, until all got through (issue 36).
///
/// The round starts after `resume_after`, the path the last round stopped at, and wraps
/// around: an object the server fails on every time (a 500 for a stored object it cannot
/// parse) then costs one request per round instead of holding back every path after it.
async fn send_changed(
    sink: &impl StatusSink,
    current: &BTreeMap<String, Value>,
    reported: &mut BTreeMap<String, Value>,
    resume_after: Option<&str>,
) -> Round {
    let mut round = Round {
        unsent: 0,
        stopped_by: None,
        stopped_at: None,
    };
    let in_order: Box<dyn Iterator<Item = (&String, &Value)> + Send> = match resume_after {
        Some(after) => Box::new(
            current
                .range::<str, _>((Bound::Excluded(after), Bound::Unbounded))
                .chain(current.range::<str, _>((Bound::Unbounded, Bound::Included(after)))),
        ),
        None => Box::new(current.iter()),
    };
    for (path, patch) in in_order {
        if reported.get(path) == Some(patch) {
            continue;
        }
        if round.stopped_by.is_some() {
            round.unsent += 1;
            continue;
        }
        // Removing an entry never reported: nothing to send.
        if !reported.contains_key(path) && only_nulls(patch) {
            reported.insert(path.clone(), patch.clone());
            continue;
        }
        let body = Bytes::from(patch.to_string());
        match sink.merge_patch(path, body).await {
            Ok(()) => {
                reported.insert(path.clone(), patch.clone());
            }
            Err(error) => {
                round.unsent += 1;
                if error.refuses_every_request() {
                    round.stopped_by = Some(error);
                    round.stopped_at = Some(path.clone());
                } else {
                    tracing::debug!(%path, %error, "status report not sent");
                }
            }
        }
    }
    round
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
    use std::cell::RefCell;

    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn a_node_view_is_built_again_only_when_its_inputs_change() {
        let agent = |id: i64, status: Value| {
            Arc::new(
                json!({"metadata": {"name": format!("agent-{id}")}, "spec": {"id": id}, "status": status}),
            )
        };
        let key = |id: i64| sluice_watch_client::ObjectKey::new("", format!("agent-{id}"));
        let one: Objects = [(key(1), agent(1, json!({}))), (key(2), agent(2, json!({})))]
            .into_iter()
            .collect();
        let mut last = LastInputs::default();
        assert!(last.changed(&[1, 2], &one), "the first view is built");
        assert!(!last.changed(&[1, 2], &one), "nothing moved: no view");
        assert!(last.changed(&[1, 2, 3], &one), "an agent came");
        let reported = one.update(
            key(1),
            agent(1, json!({"nodes": {"node-1": {"connected": true}}})),
        );
        assert!(
            !last.changed(&[1, 2, 3], &reported),
            "a status write (the node's own report coming back) builds no view"
        );
        let kept = |last: &LastInputs| last.0.as_ref().map(|(_, objects)| objects.clone());
        assert!(
            kept(&last).is_some_and(|kept| kept.ptr_eq(&reported)),
            "the newest objects are kept, so the next check compares only what changed since"
        );
        let added = reported.update(key(3), agent(3, json!({})));
        assert!(last.changed(&[1, 2, 3], &added), "an Agent object came");
        assert!(!last.changed(&[1, 2, 3], &added));
        assert!(last.changed(&[2, 3], &added), "an agent left");
    }

    /// How a test's sink answers a patch: given its path and how many were sent before it.
    type Answer = Box<dyn Fn(&str, usize) -> Result<(), WatchError>>;

    /// Answers each patch as its [`Answer`] says.
    struct Sink {
        sent: RefCell<Vec<String>>,
        answer: Answer,
    }

    impl Sink {
        /// Accepts the first `accept` patches and answers each one after with `refusal`.
        fn new(accept: usize, refusal: fn() -> WatchError) -> Self {
            Self::answering(move |_, before| {
                if before < accept {
                    Ok(())
                } else {
                    Err(refusal())
                }
            })
        }

        fn answering(answer: impl Fn(&str, usize) -> Result<(), WatchError> + 'static) -> Self {
            Self {
                sent: RefCell::default(),
                answer: Box::new(answer),
            }
        }
    }

    impl StatusSink for Sink {
        async fn merge_patch(&self, path: &str, _body: Bytes) -> Result<(), WatchError> {
            let before = self.sent.borrow().len();
            self.sent.borrow_mut().push(path.to_owned());
            (self.answer)(path, before)
        }
    }

    fn status(status: u16) -> WatchError {
        WatchError::Status {
            status,
            message: String::new(),
        }
    }

    fn view(agents: usize) -> BTreeMap<String, Value> {
        (0..agents)
            .map(|agent| {
                let path =
                    format!("/apis/tunnel.sluice.dev/v1alpha1/agents/agent-{agent:03}/status");
                (
                    path,
                    json!({"status": {"nodes": {"node-1": {"connected": true}}}}),
                )
            })
            .collect()
    }

    fn round(
        sink: &Sink,
        current: &BTreeMap<String, Value>,
        reported: &mut BTreeMap<String, Value>,
    ) -> Round {
        round_after(sink, current, reported, None)
    }

    fn round_after(
        sink: &Sink,
        current: &BTreeMap<String, Value>,
        reported: &mut BTreeMap<String, Value>,
        resume_after: Option<&str>,
    ) -> Round {
        send_changed(sink, current, reported, resume_after)
            .now_or_never()
            .expect("the sink answers at once")
    }

    #[test]
    fn an_object_the_server_always_fails_on_holds_back_no_other() {
        let current = view(10);
        let broken = current.keys().next().unwrap().clone();
        let mut reported = BTreeMap::new();
        let sink = Sink::answering({
            let broken = broken.clone();
            move |path, _| {
                if path == broken {
                    Err(status(500))
                } else {
                    Ok(())
                }
            }
        });
        let first = round(&sink, &current, &mut reported);
        assert_eq!(first.stopped_at.as_deref(), Some(broken.as_str()));
        let second = round_after(&sink, &current, &mut reported, first.stopped_at.as_deref());
        assert_eq!(
            (second.unsent, reported.len()),
            (1, 9),
            "every other entry went out in the round after"
        );
        let sent = sink.sent.borrow();
        assert_eq!(sent.len(), 11);
        assert_eq!(sent.last(), Some(&broken), "the broken one comes last");
    }

    #[test]
    fn a_throttled_round_stops_at_the_first_refusal_and_the_next_sends_the_rest() {
        let current = view(100);
        let mut reported = BTreeMap::new();
        let throttled = Sink::new(30, || status(429));
        let first = round(&throttled, &current, &mut reported);
        assert_eq!(
            throttled.sent.borrow().len(),
            31,
            "30 accepted, then one 429: no more"
        );
        assert_eq!(first.unsent, 70);
        assert!(matches!(
            first.stopped_by,
            Some(WatchError::Status { status: 429, .. })
        ));
        assert_eq!(reported.len(), 30);

        let open = Sink::new(usize::MAX, || status(429));
        let second = round(&open, &current, &mut reported);
        assert_eq!(
            open.sent.borrow().len(),
            70,
            "only what the first round left"
        );
        assert_eq!((second.unsent, second.stopped_by.is_none()), (0, true));
        assert_eq!(reported, current);
    }

    #[test]
    fn an_unreachable_control_plane_ends_the_round_at_its_first_patch() {
        let current = view(50);
        let mut reported = BTreeMap::new();
        let down = Sink::new(0, || WatchError::Connect {
            address: "127.0.0.1:1".into(),
            reason: "connection refused".into(),
        });
        let left = round(&down, &current, &mut reported);
        assert_eq!(down.sent.borrow().len(), 1);
        assert_eq!(left.unsent, 50);
    }

    #[test]
    fn a_refusal_about_one_object_moves_on_to_the_next() {
        let current = view(20);
        let mut reported = BTreeMap::new();
        let gone = Sink::new(5, || status(404));
        let left = round(&gone, &current, &mut reported);
        assert_eq!(gone.sent.borrow().len(), 20, "every patch is tried");
        assert_eq!((left.unsent, left.stopped_by.is_none()), (15, true));
    }

    #[test]
    fn removing_an_entry_never_reported_sends_nothing() {
        let mut current = view(3);
        for patch in current.values_mut() {
            *patch = json!({"status": {"nodes": {"node-1": null}}});
        }
        let mut reported = BTreeMap::new();
        let sink = Sink::new(usize::MAX, || status(429));
        let left = round(&sink, &current, &mut reported);
        assert!(sink.sent.borrow().is_empty());
        assert_eq!((left.unsent, reported.len()), (0, 3));
    }

    #[test]
    fn removals_are_told_from_reports() {
        assert!(only_nulls(&json!({"status": {"nodes": {"node-1": null}}})));
        assert!(!only_nulls(
            &json!({"status": {"nodes": {"node-1": {"connected": true}}}})
        ));
    }
}
