//! The tracker thread: what it holds (the agents this node registered, their connection
//! records, writes still owed to Redis) and what each event does to it. One select loop feeds
//! the events; each handler below is one of its arms.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::records::Records;
use crate::store::{RedisTarget, Store};
use crate::{arrivals, Command, LookupReply, LookupResult, TrackerMetrics, TrackerOptions};
use sluice_locator::{AgentId, Arrivals, ConnectionRecord, LocatorError};

/// Arrivals taken from the queue at once, at most: a node restarting gets thousands in a
/// burst, and each batch costs a round trip or two however large it is.
const ARRIVALS_PER_BATCH: usize = 1_000;

/// Agents and connections that arrived, in the order the node sent them.
#[derive(Debug, Default, PartialEq)]
struct Arrived {
    agents: Vec<AgentId>,
    records: Vec<ConnectionRecord>,
}

/// `first` and the arrivals queued right behind it, up to [`ARRIVALS_PER_BATCH`]; returns the
/// first other command it met (to run after the batch, so the order holds) or `first` when it
/// is not an arrival.
fn gather_arrivals(
    first: Command,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> (Arrived, Option<Command>) {
    let mut arrived = Arrived::default();
    let mut command = first;
    for _ in 0..ARRIVALS_PER_BATCH {
        match command {
            Command::Register(agent) => arrived.agents.push(agent),
            Command::ConnectionUp(record) => arrived.records.push(record),
            other => return (arrived, Some(other)),
        }
        match commands.try_recv() {
            Ok(next) => command = next,
            Err(_) => return (arrived, None),
        }
    }
    (arrived, Some(command))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Registered,
    /// Leaving: remove from Redis at this instant unless the agent comes back.
    Leaving(Instant),
}

struct Tracker {
    store: Arc<Store>,
    metrics: TrackerMetrics,
    unregister_delay: Duration,
    /// Lookups in flight, by agent: later askers share the first one's Redis call.
    lookups: HashMap<AgentId, Vec<LookupReply>>,
    looked_up_tx: mpsc::UnboundedSender<(AgentId, LookupResult)>,
    held: HashMap<AgentId, Held>,
    connections: Records,
    /// Agents whose registration did not reach Redis; retried on every tick.
    unwritten: Vec<AgentId>,
    /// Set by a drain: entries removed, nothing written any more, lookups still answered.
    withdrawn: bool,
}

pub(crate) async fn run(
    target: RedisTarget,
    options: TrackerOptions,
    metrics: TrackerMetrics,
    mut commands: mpsc::UnboundedReceiver<Command>,
    arrivals: Arc<Arrivals>,
) {
    let store = Arc::new(Store::new(target.clone(), options.clone(), metrics.clone()));
    let (resubscribed_tx, mut resubscribed) = mpsc::unbounded_channel();
    let (looked_up_tx, mut looked_up) = mpsc::unbounded_channel::<(AgentId, LookupResult)>();
    tokio::spawn(arrivals::listen(
        target,
        options.key_prefix.clone(),
        arrivals,
        resubscribed_tx,
    ));
    let mut tracker = Tracker::new(store, &options, metrics, looked_up_tx);
    let mut refresh = tokio::time::interval(options.refresh);
    let mut gc = tokio::time::interval(options.gc_interval);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    refresh.tick().await;
    gc.tick().await;
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                let (arrived, next) = gather_arrivals(command, &mut commands);
                tracker.arrive(arrived).await;
                if let Some(command) = next {
                    if tracker.on_command(command).await.is_break() {
                        return;
                    }
                }
            }
            Some((agent, result)) = looked_up.recv() => tracker.answer_lookups(agent, result),
            Some(()) = resubscribed.recv() => tracker.rewrite_all().await,
            _ = tick.tick() => tracker.retry_owed_writes().await,
            _ = refresh.tick() => tracker.refresh().await,
            _ = gc.tick() => tracker.collect_garbage().await,
        }
    }
}

impl Tracker {
    fn new(
        store: Arc<Store>,
        options: &TrackerOptions,
        metrics: TrackerMetrics,
        looked_up_tx: mpsc::UnboundedSender<(AgentId, LookupResult)>,
    ) -> Self {
        Tracker {
            store,
            metrics,
            unregister_delay: options.unregister_delay,
            lookups: HashMap::new(),
            looked_up_tx,
            held: HashMap::new(),
            connections: Records::new(options.max_connections_per_agent),
            unwritten: Vec::new(),
            withdrawn: false,
        }
    }

    /// Breaks after a shutdown.
    async fn on_command(&mut self, command: Command) -> ControlFlow<()> {
        match command {
            Command::Register(agent) => {
                self.arrive(Arrived {
                    agents: vec![agent],
                    records: Vec::new(),
                })
                .await
            }
            Command::Unregister(agent) => {
                if let Some(state) = self.held.get_mut(&agent) {
                    *state = Held::Leaving(Instant::now() + self.unregister_delay);
                }
            }
            Command::Lookup(agent, reply) => self.lookup(agent, reply),
            Command::ConnectionUp(record) => {
                self.arrive(Arrived {
                    agents: Vec::new(),
                    records: vec![record],
                })
                .await
            }
            Command::ConnectionDown(agent, connection_id) => {
                if self.connections.remove(agent, connection_id) {
                    if let Err(error) = self
                        .store
                        .remove_connections(&[(agent, connection_id)])
                        .await
                    {
                        tracing::warn!(%error, "cannot remove an agent connection from redis; it expires by TTL");
                    }
                }
            }
            Command::ListConnections(after, limit, reply) => {
                let store = self.store.clone();
                tokio::spawn(async move {
                    let listed = store.list_connections(after.as_ref(), limit).await;
                    let _ = reply.send(listed.map_err(LocatorError::from));
                });
            }
            Command::Withdraw(reply) => {
                self.withdraw().await;
                let _ = reply.send(());
            }
            Command::Shutdown(reply) => {
                self.remove_all().await;
                let _ = reply.send(());
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// Registers the agents new to this node and writes the connection records, each kind in
    /// as few round trips as the store allows. A withdrawn (draining) node advertises nothing.
    async fn arrive(&mut self, arrived: Arrived) {
        if self.withdrawn {
            return;
        }
        let new: Vec<AgentId> = arrived
            .agents
            .into_iter()
            .filter(|agent| self.held.insert(*agent, Held::Registered).is_none())
            .collect();
        if let Err(error) = self.store.register(&new).await {
            tracing::warn!(agents = new.len(), %error, "cannot register agents in redis; will retry");
            self.unwritten.extend(new);
        }
        let mut accepted = Vec::with_capacity(arrived.records.len());
        for record in arrived.records {
            // Over the agent's bound nothing is written (the node refuses such connections
            // first; this holds whatever it sends).
            if self.connections.insert(record.clone()) {
                accepted.push(record);
            } else {
                self.metrics.records_refused.inc(0);
                tracing::warn!(
                    agent = record.agent,
                    "agent over its connection records in the tracker; not written to redis"
                );
            }
        }
        if let Err(error) = self.store.write_connections(&accepted).await {
            tracing::warn!(%error, "cannot record agent connections in redis; the next refresh retries");
        }
    }

    fn lookup(&mut self, agent: AgentId, reply: LookupReply) {
        let waiting = self.lookups.entry(agent).or_default();
        waiting.push(reply);
        if waiting.len() == 1 {
            let store = self.store.clone();
            let looked_up_tx = self.looked_up_tx.clone();
            tokio::spawn(async move {
                let _ = looked_up_tx.send((agent, store.lookup(agent).await));
            });
        }
    }

    fn answer_lookups(&mut self, agent: AgentId, result: LookupResult) {
        for reply in self.lookups.remove(&agent).unwrap_or_default() {
            let _ = reply.send(result.clone().map_err(LocatorError::from));
        }
    }

    async fn withdraw(&mut self) {
        let agents = self.remove_all().await;
        self.unwritten.clear();
        let withdrawn_before = std::mem::replace(&mut self.withdrawn, true);
        if !withdrawn_before {
            self.metrics.withdrawn.inc(0);
        }
        tracing::info!(
            agents,
            "draining: removed this node's agents from redis; peers stop routing here"
        );
    }

    /// Removes every entry and connection record this node wrote (drain or shutdown); returns
    /// how many agents it held.
    async fn remove_all(&mut self) -> usize {
        let keys = self.connections.drain();
        if let Err(error) = self.store.remove_connections(&keys).await {
            tracing::warn!(%error, "cannot remove this node's connection records from redis; they expire by TTL");
        }
        let agents: Vec<AgentId> = self.held.drain().map(|(agent, _)| agent).collect();
        if let Err(error) = self.store.unregister(&agents).await {
            tracing::warn!(%error, "cannot remove this node's entries from redis; they expire by TTL");
        }
        agents.len()
    }

    /// Redis was away, maybe restarted empty: write everything we hold again.
    async fn rewrite_all(&mut self) {
        let records = self.connections.all();
        let _ = self.store.write_connections(&records).await;
        let agents: Vec<AgentId> = self.held.keys().copied().collect();
        tracing::info!(
            agents = agents.len(),
            "redis is back; re-registering held agents"
        );
        if let Err(error) = self.store.register(&agents).await {
            tracing::warn!(%error, "cannot re-register agents; will retry");
            self.unwritten = agents;
        }
    }

    /// Removals whose delay has passed, and registrations that did not reach Redis.
    async fn retry_owed_writes(&mut self) {
        let now = Instant::now();
        let leaving: Vec<AgentId> = self
            .held
            .iter()
            .filter_map(|(agent, state)| {
                matches!(state, Held::Leaving(at) if *at <= now).then_some(*agent)
            })
            .collect();
        if !leaving.is_empty() {
            match self.store.unregister(&leaving).await {
                Ok(()) => {
                    for agent in &leaving {
                        self.held.remove(agent);
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot unregister agents; will retry"),
            }
        }
        if !self.unwritten.is_empty() {
            let pending: Vec<AgentId> = self
                .unwritten
                .iter()
                .copied()
                .filter(|agent| self.held.contains_key(agent))
                .collect();
            match self.store.register(&pending).await {
                Ok(()) => {
                    tracing::info!(agents = pending.len(), "re-registered agents in redis");
                    self.unwritten.clear();
                }
                Err(_) => self.unwritten = pending,
            }
        }
    }

    /// Renews the expiry of everything this node holds.
    async fn refresh(&mut self) {
        let records = self.connections.all();
        if let Err(error) = self.store.write_connections(&records).await {
            tracing::warn!(%error, "cannot refresh connection records in redis");
        }
        let agents: Vec<AgentId> = self.held.keys().copied().collect();
        if let Err(error) = self.store.register(&agents).await {
            tracing::warn!(%error, "cannot refresh agents in redis; will retry");
            self.unwritten = agents;
        }
    }

    /// Removes expired fields (of any node, e.g. one that was killed) from held agents' hashes.
    async fn collect_garbage(&mut self) {
        let agents: Vec<AgentId> = self.held.keys().copied().collect();
        match self.store.collect_garbage(&agents).await {
            Ok(removed) if removed > 0 => {
                tracing::info!(removed, "removed expired tracker entries")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "tracker garbage collection failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(agent: AgentId) -> ConnectionRecord {
        ConnectionRecord {
            agent,
            connection_id: 1,
            version: String::new(),
            node: "node".to_string(),
            since_unix_ms: 0,
        }
    }

    fn queue(commands: Vec<Command>) -> mpsc::UnboundedReceiver<Command> {
        let (sender, receiver) = mpsc::unbounded_channel();
        for command in commands {
            sender.send(command).unwrap();
        }
        receiver
    }

    #[test]
    fn arrivals_queued_together_are_one_batch_and_the_next_command_waits_its_turn() {
        let mut commands = queue(vec![
            Command::ConnectionUp(record(1)),
            Command::Register(2),
            Command::ConnectionUp(record(2)),
            Command::ConnectionDown(1, 1),
            Command::Register(3),
        ]);
        let (arrived, next) = gather_arrivals(Command::Register(1), &mut commands);
        assert_eq!(arrived.agents, [1, 2]);
        assert_eq!(arrived.records, [record(1), record(2)]);
        assert!(matches!(next, Some(Command::ConnectionDown(1, 1))));
        // What followed the other command is the next batch.
        let first = commands.try_recv().unwrap();
        let (arrived, next) = gather_arrivals(first, &mut commands);
        assert_eq!(arrived.agents, [3]);
        assert!(next.is_none());
    }

    #[test]
    fn a_command_that_is_no_arrival_runs_alone() {
        let mut commands = queue(vec![Command::Register(1)]);
        let (arrived, next) = gather_arrivals(Command::Unregister(7), &mut commands);
        assert_eq!(arrived, Arrived::default());
        assert!(matches!(next, Some(Command::Unregister(7))));
        assert!(matches!(commands.try_recv(), Ok(Command::Register(1))));
    }

    #[test]
    fn a_batch_stops_at_its_bound_and_hands_on_the_arrival_it_reached() {
        let queued = (1..=ARRIVALS_PER_BATCH as AgentId + 5)
            .map(Command::Register)
            .collect();
        let mut commands = queue(queued);
        let (arrived, next) = gather_arrivals(Command::Register(0), &mut commands);
        assert_eq!(arrived.agents.len(), ARRIVALS_PER_BATCH);
        assert!(
            matches!(next, Some(Command::Register(agent)) if agent == ARRIVALS_PER_BATCH as AgentId)
        );
    }
}
