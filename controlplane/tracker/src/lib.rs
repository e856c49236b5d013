//! The agent tracker (after kas' `agent_tracker`/`tunnel` registry in Redis): which nodes hold
//! tunnels of which agent.
//!
//! It runs on its own thread with a tokio runtime; data-plane cores talk to it only through
//! channels ([`TrackerHandle`]) and never wait on Redis per request. Redis is written when an
//! agent's first connection arrives on this node and, after `unregister_delay`, when its last one
//! leaves: not per tunnel and not per request. Each node's entry is a hash field whose value
//! carries its own expiry (the key's TTL alone cannot expire one node's field), refreshed every
//! `refresh`; a periodic garbage collection removes fields whose expiry has passed (a node that
//! was killed). Arrivals are published on a pub/sub channel so waiters elsewhere wake at once.

mod arrivals;
mod metrics;
mod records;
mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_channel::oneshot;
use tokio::sync::mpsc;

pub use metrics::TrackerMetrics;
use records::Records;
pub use sluice_locator::{AgentId, Arrivals, ConnectionKey, ConnectionRecord, NodeEntry};
use sluice_locator::{AgentLocator, Answer, EventListener, LocatorError};
use store::Store;
pub use store::{parse_entry, RedisTarget};

/// Why the tracker could not do something.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TrackerError {
    #[error("redis: {0}")]
    Redis(String),
    #[error("the tracker has stopped")]
    Stopped,
    #[error("cannot start the tracker thread: {0}")]
    Thread(String),
}

impl From<TrackerError> for LocatorError {
    fn from(error: TrackerError) -> Self {
        match error {
            TrackerError::Stopped => LocatorError::Stopped,
            other => LocatorError::Store(other.to_string()),
        }
    }
}

impl From<redis::RedisError> for TrackerError {
    fn from(error: redis::RedisError) -> Self {
        TrackerError::Redis(error.to_string())
    }
}

/// Timings and identity of one node's tracker.
#[derive(Debug, Clone)]
pub struct TrackerOptions {
    /// This node's name: its field in every agent's hash.
    pub node_name: String,
    /// Where other nodes reach this node's private endpoint (stored as the field's value).
    pub private_address: String,
    pub key_prefix: String,
    pub ttl: Duration,
    pub refresh: Duration,
    pub gc_interval: Duration,
    pub unregister_delay: Duration,
    /// Most connection records of one agent this node writes (`tunnel.max_connections_per_agent`).
    pub max_connections_per_agent: usize,
}

type LookupResult = Result<Vec<NodeEntry>, TrackerError>;
type LookupReply = oneshot::Sender<Result<Vec<NodeEntry>, LocatorError>>;

enum Command {
    Register(AgentId),
    Unregister(AgentId),
    Lookup(
        AgentId,
        oneshot::Sender<Result<Vec<NodeEntry>, LocatorError>>,
    ),
    ConnectionUp(ConnectionRecord),
    ConnectionDown(AgentId, i64),
    ListConnections(
        Option<ConnectionKey>,
        usize,
        oneshot::Sender<Result<Vec<ConnectionRecord>, LocatorError>>,
    ),
    Withdraw(std::sync::mpsc::Sender<()>),
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// The data plane's side of the tracker: non-blocking sends, answers through oneshot channels
/// that monoio tasks can await.
#[derive(Debug, Clone)]
pub struct TrackerHandle {
    commands: mpsc::UnboundedSender<Command>,
    pub arrivals: Arc<Arrivals>,
}

impl TrackerHandle {
    /// The agent's first connection arrived on this node.
    pub fn register(&self, agent: AgentId) {
        let _ = self.commands.send(Command::Register(agent));
    }

    /// The agent's last connection left this node (removed from Redis after the delay unless it
    /// comes back).
    pub fn unregister(&self, agent: AgentId) {
        let _ = self.commands.send(Command::Unregister(agent));
    }

    /// An agent connection arrived on this node (recorded for ListConnectedAgents).
    pub fn connection_up(&self, record: ConnectionRecord) {
        let _ = self.commands.send(Command::ConnectionUp(record));
    }

    /// An agent connection left this node.
    pub fn connection_down(&self, agent: AgentId, connection_id: i64) {
        let _ = self
            .commands
            .send(Command::ConnectionDown(agent, connection_id));
    }

    /// Up to `limit` unexpired agent connections in the cluster, after `after`.
    pub async fn list_connections(
        &self,
        after: Option<ConnectionKey>,
        limit: usize,
    ) -> Result<Vec<ConnectionRecord>, LocatorError> {
        AgentLocator::list_connections(self, after, limit).await
    }

    /// The nodes holding tunnels of `agent`, unexpired.
    pub async fn lookup(&self, agent: AgentId) -> Result<Vec<NodeEntry>, LocatorError> {
        AgentLocator::lookup(self, agent).await
    }

    /// Removes everything this node wrote from Redis and writes nothing more, while lookups go
    /// on: called when a drain starts, so peers stop routing calls here while this node's
    /// in-flight calls (which may still need lookups) finish. Blocks up to `timeout`.
    pub fn withdraw(&self, timeout: Duration) -> bool {
        let (reply, done) = std::sync::mpsc::channel();
        self.commands.send(Command::Withdraw(reply)).is_ok() && done.recv_timeout(timeout).is_ok()
    }

    /// Removes everything this node wrote and stops the tracker (graceful shutdown).
    /// Blocks the calling (non-async) thread up to `timeout`.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let (reply, done) = std::sync::mpsc::channel();
        self.commands.send(Command::Shutdown(reply)).is_ok() && done.recv_timeout(timeout).is_ok()
    }
}

/// The tracker as the tunnel node sees it: answers come from the tracker thread through oneshot
/// channels, so a monoio core awaits them without a tokio runtime.
impl AgentLocator for TrackerHandle {
    fn register(&self, agent: AgentId) {
        TrackerHandle::register(self, agent);
    }

    fn unregister(&self, agent: AgentId) {
        TrackerHandle::unregister(self, agent);
    }

    fn connection_up(&self, record: ConnectionRecord) {
        TrackerHandle::connection_up(self, record);
    }

    fn connection_down(&self, agent: AgentId, connection_id: i64) {
        TrackerHandle::connection_down(self, agent, connection_id);
    }

    fn lookup(&self, agent: AgentId) -> Answer<Vec<NodeEntry>> {
        let (reply, answer) = Answer::channel();
        // A refused send drops the reply, which the answer reads as `Stopped`.
        let _ = self.commands.send(Command::Lookup(agent, reply));
        answer
    }

    fn list_connections(
        &self,
        after: Option<ConnectionKey>,
        limit: usize,
    ) -> Answer<Vec<ConnectionRecord>> {
        let (reply, answer) = Answer::channel();
        let _ = self
            .commands
            .send(Command::ListConnections(after, limit, reply));
        answer
    }

    fn listen(&self, agent: AgentId) -> EventListener {
        self.arrivals.listen(agent)
    }
}

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Starts the tracker thread. Connection problems are not fatal: the tracker keeps what it
/// holds, retries, and re-registers everything once Redis is back.
pub fn spawn(
    target: RedisTarget,
    options: TrackerOptions,
    metrics: TrackerMetrics,
) -> Result<TrackerHandle, TrackerError> {
    let (commands, receiver) = mpsc::unbounded_channel();
    let arrivals = Arc::new(Arrivals::default());
    let handle = TrackerHandle {
        commands,
        arrivals: arrivals.clone(),
    };
    std::thread::Builder::new()
        .name("sluice-tracker".to_string())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "cannot build the tracker's runtime");
                    return;
                }
            };
            runtime.block_on(run(target, options, metrics, receiver, arrivals));
        })
        .map_err(|error| TrackerError::Thread(error.to_string()))?;
    Ok(handle)
}

/// Removes every entry and connection record this node wrote (drain or shutdown); returns how
/// many agents it held.
async fn remove_all(
    store: &Store,
    held: &mut HashMap<AgentId, Held>,
    connections: &mut Records,
) -> usize {
    let keys = connections.drain();
    if let Err(error) = store.remove_connections(&keys).await {
        tracing::warn!(%error, "cannot remove this node's connection records from redis; they expire by TTL");
    }
    let agents: Vec<AgentId> = held.drain().map(|(agent, _)| agent).collect();
    if let Err(error) = store.unregister(&agents).await {
        tracing::warn!(%error, "cannot remove this node's entries from redis; they expire by TTL");
    }
    agents.len()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Registered,
    /// Leaving: remove from Redis at this instant unless the agent comes back.
    Leaving(Instant),
}

async fn run(
    target: RedisTarget,
    options: TrackerOptions,
    metrics: TrackerMetrics,
    mut commands: mpsc::UnboundedReceiver<Command>,
    arrivals: Arc<Arrivals>,
) {
    let store = Arc::new(Store::new(target.clone(), options.clone(), metrics.clone()));
    let (resubscribed_tx, mut resubscribed) = mpsc::unbounded_channel();
    // Lookups in flight, by agent: later askers share the first one's Redis call.
    let mut lookups: HashMap<AgentId, Vec<LookupReply>> = HashMap::new();
    let (looked_up_tx, mut looked_up) = mpsc::unbounded_channel::<(AgentId, LookupResult)>();
    tokio::spawn(arrivals::listen(
        target,
        options.key_prefix.clone(),
        arrivals,
        resubscribed_tx,
    ));
    let mut held: HashMap<AgentId, Held> = HashMap::new();
    let mut connections = Records::new(options.max_connections_per_agent);
    // Agents whose registration did not reach Redis; retried on every tick.
    let mut unwritten: Vec<AgentId> = Vec::new();
    // Set by a drain: entries removed, nothing written any more, lookups still answered.
    let mut withdrawn = false;
    let mut refresh = tokio::time::interval(options.refresh);
    let mut gc = tokio::time::interval(options.gc_interval);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    refresh.tick().await;
    gc.tick().await;
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                // A withdrawn (draining) node advertises nothing more.
                Some(Command::Register(_)) if withdrawn => {}
                Some(Command::ConnectionUp(_)) if withdrawn => {}
                Some(Command::Register(agent)) => {
                    if held.insert(agent, Held::Registered).is_none() {
                        if let Err(error) = store.register(&[agent]).await {
                            tracing::warn!(agent, %error, "cannot register agent in redis; will retry");
                            unwritten.push(agent);
                        }
                    }
                }
                Some(Command::Unregister(agent)) => {
                    if let Some(state) = held.get_mut(&agent) {
                        *state = Held::Leaving(Instant::now() + options.unregister_delay);
                    }
                }
                Some(Command::Lookup(agent, reply)) => {
                    let waiting = lookups.entry(agent).or_default();
                    waiting.push(reply);
                    if waiting.len() == 1 {
                        let store = store.clone();
                        let looked_up_tx = looked_up_tx.clone();
                        tokio::spawn(async move {
                            let _ = looked_up_tx.send((agent, store.lookup(agent).await));
                        });
                    }
                }
                Some(Command::ConnectionUp(record)) => {
                    // Over the agent's bound nothing is written (the node refuses such
                    // connections first; this holds whatever it sends).
                    if !connections.insert(record.clone()) {
                        metrics.records_refused.inc(0);
                        tracing::warn!(agent = record.agent, "agent over its connection records in the tracker; not written to redis");
                    } else if let Err(error) = store.write_connections(std::slice::from_ref(&record)).await {
                        tracing::warn!(%error, "cannot record an agent connection in redis; the next refresh retries");
                    }
                }
                Some(Command::ConnectionDown(agent, connection_id)) => {
                    if connections.remove(agent, connection_id) {
                        if let Err(error) = store.remove_connections(&[(agent, connection_id)]).await {
                            tracing::warn!(%error, "cannot remove an agent connection from redis; it expires by TTL");
                        }
                    }
                }
                Some(Command::ListConnections(after, limit, reply)) => {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let listed = store.list_connections(after.as_ref(), limit).await;
                        let _ = reply.send(listed.map_err(LocatorError::from));
                    });
                }
                Some(Command::Withdraw(reply)) => {
                    let agents = remove_all(&store, &mut held, &mut connections).await;
                    unwritten.clear();
                    let withdrawn_before = std::mem::replace(&mut withdrawn, true);
                    if !withdrawn_before { metrics.withdrawn.inc(0); }
                    tracing::info!(agents, "draining: removed this node's agents from redis; peers stop routing here");
                    let _ = reply.send(());
                }
                Some(Command::Shutdown(reply)) => {
                    remove_all(&store, &mut held, &mut connections).await;
                    let _ = reply.send(());
                    return;
                }
                None => return,
            },
            Some((agent, result)) = looked_up.recv() => {
                for reply in lookups.remove(&agent).unwrap_or_default() {
                    let _ = reply.send(result.clone().map_err(LocatorError::from));
                }
            }
            Some(()) = resubscribed.recv() => {
                // Redis was away, maybe restarted empty: write everything we hold again.
                let records = connections.all();
                let _ = store.write_connections(&records).await;
                let agents: Vec<AgentId> = held.keys().copied().collect();
                tracing::info!(agents = agents.len(), "redis is back; re-registering held agents");
                if let Err(error) = store.register(&agents).await {
                    tracing::warn!(%error, "cannot re-register agents; will retry");
                    unwritten = agents;
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                let leaving: Vec<AgentId> = held
                    .iter()
                    .filter_map(|(agent, state)| matches!(state, Held::Leaving(at) if *at <= now).then_some(*agent))
                    .collect();
                if !leaving.is_empty() {
                    match store.unregister(&leaving).await {
                        Ok(()) => {
                            for agent in &leaving {
                                held.remove(agent);
                            }
                        }
                        Err(error) => tracing::warn!(%error, "cannot unregister agents; will retry"),
                    }
                }
                if !unwritten.is_empty() {
                    let pending: Vec<AgentId> = unwritten.iter().copied().filter(|agent| held.contains_key(agent)).collect();
                    match store.register(&pending).await {
                        Ok(()) => {
                            tracing::info!(agents = pending.len(), "re-registered agents in redis");
                            unwritten.clear();
                        }
                        Err(_) => unwritten = pending,
                    }
                }
            }
            _ = refresh.tick() => {
                let records = connections.all();
                if let Err(error) = store.write_connections(&records).await {
                    tracing::warn!(%error, "cannot refresh connection records in redis");
                }
                let agents: Vec<AgentId> = held.keys().copied().collect();
                if let Err(error) = store.register(&agents).await {
                    tracing::warn!(%error, "cannot refresh agents in redis; will retry");
                    unwritten = agents;
                }
            }
            _ = gc.tick() => {
                let agents: Vec<AgentId> = held.keys().copied().collect();
                match store.collect_garbage(&agents).await {
                    Ok(removed) if removed > 0 => tracing::info!(removed, "removed expired tracker entries"),
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "tracker garbage collection failed"),
                }
            }
        }
    }
}
