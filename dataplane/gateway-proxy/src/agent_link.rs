//! What the gateway needs from the tunnel node of its own process, as a trait the daemon
//! implements (so this crate does not depend on the tunnel's): a link per worker, and whether
//! an agent is connected anywhere (an agent server's health).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use sluice_kube_tunnel::{AssertionSigner, ExchangeLimits};

pub use crate::error::LinkFailure;

/// This process's tunnel node, as the gateway sees it.
pub trait AgentLink: Send + Sync + std::fmt::Debug {
    /// An HTTP/2 client link to the node, served on worker `worker` (the caller's).
    fn open(
        &self,
        worker: usize,
    ) -> Pin<Box<dyn Future<Output = Result<h2::client::SendRequest<Bytes>, LinkFailure>>>>;

    /// Whether `agent` holds a tunnel connection on some node.
    fn connected(&self, agent: u64) -> Pin<Box<dyn Future<Output = bool>>>;
}

/// Everything agent servers need: the link and the key the gateway signs assertions with.
#[derive(Debug)]
pub struct AgentPath {
    pub link: Arc<dyn AgentLink>,
    pub signer: AssertionSigner,
    /// The bounds of the exchange's messages (the agent enforces the same).
    pub limits: ExchangeLimits,
}
