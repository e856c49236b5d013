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
//! Arrivals queued together (a restarted node's agents dialling back) are written together,
//! hundreds per round trip on a single Redis, and so are a drain's removals.

mod arrivals;
mod metrics;
mod records;
mod store;
mod worker;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_channel::oneshot;
use tokio::sync::mpsc;

pub use metrics::TrackerMetrics;
pub use sluice_locator::{AgentId, Arrivals, ConnectionKey, ConnectionRecord, NodeEntry};
use sluice_locator::{AgentLocator, Answer, EventListener, LocatorError};
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
            runtime.block_on(worker::run(target, options, metrics, receiver, arrivals));
        })
        .map_err(|error| TrackerError::Thread(error.to_string()))?;
    Ok(handle)
}
