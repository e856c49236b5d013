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
                if tracker.on_command(command).await.is_break() {
                    return;
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
            // A withdrawn (draining) node advertises nothing more.
            Command::Register(_) | Command::ConnectionUp(_) if self.withdrawn => {}
            Command::Register(agent) => self.register(agent).await,
            Command::Unregister(agent) => {
                if let Some(state) = self.held.get_mut(&agent) {
                    *state = Held::Leaving(Instant::now() + self.unregister_delay);
                }
            }
            Command::Lookup(agent, reply) => self.lookup(agent, reply),
            Command::ConnectionUp(record) => self.connection_up(record).await,
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

    async fn register(&mut self, agent: AgentId) {
        if self.held.insert(agent, Held::Registered).is_none() {
            if let Err(error) = self.store.register(&[agent]).await {
                tracing::warn!(agent, %error, "cannot register agent in redis; will retry");
                self.unwritten.push(agent);
            }
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

    async fn connection_up(&mut self, record: ConnectionRecord) {
        // Over the agent's bound nothing is written (the node refuses such connections first;
        // this holds whatever it sends).
        if !self.connections.insert(record.clone()) {
            self.metrics.records_refused.inc(0);
            tracing::warn!(
                agent = record.agent,
                "agent over its connection records in the tracker; not written to redis"
            );
        } else if let Err(error) = self
            .store
            .write_connections(std::slice::from_ref(&record))
            .await
        {
            tracing::warn!(%error, "cannot record an agent connection in redis; the next refresh retries");
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
