//! Where agents are: the vocabulary shared by the tunnel node (data plane) and the agent tracker
//! (control plane), so neither depends on the other.
//!
//! A node tells its [`AgentLocator`] which agents and agent connections it holds, asks it which
//! other nodes hold an agent, and listens for an agent's arrival anywhere. Answers come back as
//! [`Answer`] futures (a oneshot channel), which any runtime can await: the Redis tracker answers
//! from its own tokio thread while monoio cores wait.

mod arrivals;
#[cfg(any(test, feature = "memory"))]
pub mod memory;

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_channel::oneshot;

pub use arrivals::Arrivals;
pub use event_listener::EventListener;

/// Agent ids are positive 64-bit integers, as in kas.
pub type AgentId = i64;

/// One node holding tunnels of an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub node: String,
    /// The node's private endpoint.
    pub private_address: String,
    pub expires_at_unix_ms: u64,
}

/// One agent connection to one node, as ListConnectedAgents reports it cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub agent: AgentId,
    pub connection_id: i64,
    pub version: String,
    pub node: String,
    pub since_unix_ms: i64,
}

/// Where a page of ListConnectedAgents ends: connections are listed in the order of
/// (agent, node, connection id), and the next page starts after this key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConnectionKey {
    pub agent: AgentId,
    pub node: String,
    pub connection_id: i64,
}

impl ConnectionRecord {
    /// The record's place in the listing order.
    pub fn key(&self) -> ConnectionKey {
        ConnectionKey {
            agent: self.agent,
            node: self.node.clone(),
            connection_id: self.connection_id,
        }
    }

    /// Whether the record lies after `after` in the listing order (`None`: the first page).
    pub fn is_after(&self, after: Option<&ConnectionKey>) -> bool {
        after.is_none_or(|after| {
            (self.agent, self.node.as_str(), self.connection_id)
                > (after.agent, after.node.as_str(), after.connection_id)
        })
    }
}

/// Why a locator could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocatorError {
    /// The store behind the locator failed (Redis away, timeout, ...).
    #[error("{0}")]
    Store(String),
    /// The locator has stopped and answers nothing more.
    #[error("the agent locator has stopped")]
    Stopped,
}

/// A pending answer of a locator. Dropping it abandons the question.
#[derive(Debug)]
pub struct Answer<T>(oneshot::Receiver<Result<T, LocatorError>>);

impl<T> Answer<T> {
    /// A question and the sender its answerer replies on.
    pub fn channel() -> (oneshot::Sender<Result<T, LocatorError>>, Self) {
        let (reply, answer) = oneshot::channel();
        (reply, Self(answer))
    }

    /// An answer known at once.
    pub fn ready(result: Result<T, LocatorError>) -> Self {
        let (reply, answer) = Self::channel();
        let _ = reply.send(result);
        answer
    }
}

impl<T> Future for Answer<T> {
    type Output = Result<T, LocatorError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(LocatorError::Stopped)))
    }
}

/// Which nodes hold which agents. Writes are fire-and-forget (a data-plane core never waits on
/// them); questions return an [`Answer`].
pub trait AgentLocator: Debug + Send + Sync {
    /// The agent's first connection arrived on this node.
    fn register(&self, agent: AgentId);
    /// The agent's last connection left this node.
    fn unregister(&self, agent: AgentId);
    /// An agent connection arrived on this node (for ListConnectedAgents).
    fn connection_up(&self, record: ConnectionRecord);
    /// An agent connection left this node.
    fn connection_down(&self, agent: AgentId, connection_id: i64);
    /// The nodes holding tunnels of `agent` (this node included if it registered the agent).
    fn lookup(&self, agent: AgentId) -> Answer<Vec<NodeEntry>>;
    /// Up to `limit` agent connections in the cluster, in the order of [`ConnectionKey`], after
    /// `after` (`None`: from the first). Bounded, so one listing never holds every record.
    fn list_connections(
        &self,
        after: Option<ConnectionKey>,
        limit: usize,
    ) -> Answer<Vec<ConnectionRecord>>;
    /// Fires at the next arrival of `agent` anywhere. Create it before looking for a tunnel, so
    /// an arrival between the look and the wait is not missed.
    fn listen(&self, agent: AgentId) -> EventListener;
}
