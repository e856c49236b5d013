//! The gateway's way to agents: the Kubernetes API gateway of this process calls an agent's
//! Kubernetes API forwarder here, over an HTTP/2 link held in memory by each worker. No socket
//! and no credential: only code in this process can open the link, and it serves nothing but the
//! Kubernetes API method, which the external endpoint refuses. A call reads top-down like the
//! external endpoint's: parse (agent, deadline, metadata), route (the one driver,
//! `Router::drive`: a tunnel of this node, or another node's private endpoint with this node's
//! credential), settle.
//!
//! Why HTTP/2 in memory rather than a direct call into the router: the router relays between
//! HTTP/2 streams (a client's request body, its response), and the gateway already speaks
//! HTTP/2 to its upstreams; the link costs a header encode and decode per request but no
//! system call (docs/PERFORMANCE.md measures it against the gateway's direct path).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use sluice_grpc::transport::{client_over, serve_limited, ClientConnection, ServeLimits};
use sluice_grpc::Code;
use sluice_metrics::PerCoreCounter;

use super::super::answer::Responder;
use super::super::call::parse_call;
use super::super::remote::RemoteRouting;
use super::super::router::{Readiness, Router};
use super::super::NodeShared;
use super::{check_client_metadata, settle};
use crate::error::{ErrorKind, TunnelError};
use crate::protocol::KUBERNETES_API_SERVICE;
use crate::registry::AgentId;

/// Bytes in flight each way on a link before the writer waits: one HTTP/2 frame and its
/// headers, so a burst moves in few wake-ups without holding much per worker.
const LINK_BUFFER: usize = 64 * 1024;

/// The gateway's handle on this process's tunnel node (cheap to clone, shared by all workers).
#[derive(Debug, Clone)]
pub struct GatewayLink {
    node: Arc<NodeShared>,
}

impl GatewayLink {
    pub fn new(node: Arc<NodeShared>) -> Self {
        Self { node }
    }

    /// Opens a link on the calling worker (`worker` is its index): the server half runs as a
    /// task of this worker, so a call's routing and relaying stay on the core that took the
    /// gateway's request. The link lives until the returned connection is dropped.
    pub async fn open(&self, worker: usize) -> Result<ClientConnection, TunnelError> {
        let (client_io, server_io) = tokio::io::duplex(LINK_BUFFER);
        let calls = Rc::new(LinkCalls {
            node: self.node.clone(),
            remote: RemoteRouting::new(&self.node),
            worker,
            counters: RefCell::default(),
        });
        let node = self.node.clone();
        sluice_runtime::spawn_contained("gateway-link", async move {
            let limits = ServeLimits {
                limits: link_limits(),
                handshake_deadline: monoio::time::Instant::now() + link_limits().handshake_timeout,
                on_limit: &|_| {},
                retire_at: None,
                on_retire: &|| {},
            };
            let serve = |request, respond| calls.clone().serve(request, respond);
            let ended = serve_limited(
                server_io,
                &node.settings,
                limits,
                std::future::pending(),
                serve,
            )
            .await;
            if let Err(error) = ended {
                tracing::debug!(%error, "gateway link ended with an error");
            }
        });
        client_over(client_io, &self.node.settings, "gateway-link")
            .await
            .map_err(|error| TunnelError::new(ErrorKind::NodeProtocol, error.to_string()))
    }

    /// Whether `agent` holds a tunnel connection on this node or, with a locator, on any node:
    /// an agent server of the gateway is in rotation only while this holds.
    pub async fn agent_connected(&self, agent: AgentId) -> bool {
        if self.node.holds_agent(agent) {
            return true;
        }
        match &self.node.locator {
            Some(locator) => locator
                .lookup(agent)
                .await
                .is_ok_and(|nodes| !nodes.is_empty()),
            None => false,
        }
    }
}

/// The link carries only this process's own calls: nothing to time out but what the calls
/// themselves bound (their deadline, the tunnel's `max_wait`), so no idle or age limit.
fn link_limits() -> sluice_config::ConnectionLimits {
    sluice_config::ConnectionLimits {
        idle_timeout: std::time::Duration::from_secs(365 * 24 * 3600),
        keepalive_interval: None,
        max_connection_age: None,
        ..Default::default()
    }
}

/// One worker's link: the calls it serves and their counters.
struct LinkCalls {
    node: Arc<NodeShared>,
    remote: Option<RemoteRouting>,
    worker: usize,
    /// `sluice_tunnel_requests_total` of the one method, by code: looked up once per link.
    counters: RefCell<[Option<PerCoreCounter>; 17]>,
}

impl LinkCalls {
    /// One call of the gateway. Phases: parse (the method, agent and deadline, metadata within
    /// limits), route (`Router::drive`), settle (answer a failure), count.
    async fn serve(self: Rc<Self>, request: Request<RecvStream>, respond: SendResponse<Bytes>) {
        let started = Instant::now();
        let node = &self.node;
        let (parts, body) = request.into_parts();
        let mut responder = Responder::new(respond);
        let target = only_kubernetes_api(parts.uri.path())
            .and_then(|()| parse_call(&parts.headers, started))
            .and_then(|target| check_client_metadata(node, &parts.headers).map(|()| target));
        let mut route = crate::metrics::CallRoute::None;
        let outcome = match target {
            Ok(target) => {
                let router = Router::new(node, self.remote.as_ref(), &target, &parts, self.worker);
                // Boxed, as on the external endpoint: spawning copies only this future's head.
                let outcome = Box::pin(router.drive(body, Readiness::Silent, &mut responder)).await;
                route = router.taken();
                outcome
            }
            Err(error) => Err(error),
        };
        let code = settle(outcome, &mut responder, node, self.worker);
        self.count(code);
        node.metrics
            .observe_request(route, self.worker, started.elapsed().as_secs_f64());
    }

    fn count(&self, code: Code) {
        let slot = code.as_u32() as usize;
        let mut counters = self.counters.borrow_mut();
        let counter = counters[slot]
            .get_or_insert_with(|| self.node.metrics.requests(GATEWAY_METHOD_LABEL, code));
        counter.inc(self.worker);
    }
}

/// The method label of the gateway's calls.
const GATEWAY_METHOD_LABEL: &str = "/sluice.kubernetes.v1.KubernetesApi/MakeRequest";

/// The link serves the gateway's Kubernetes API calls only: anything else is a bug in this
/// process, answered UNIMPLEMENTED rather than relayed to an agent's backend.
fn only_kubernetes_api(method: &str) -> Result<(), TunnelError> {
    if method.starts_with(KUBERNETES_API_SERVICE) {
        return Ok(());
    }
    Err(TunnelError::new(
        ErrorKind::Unimplemented,
        "the gateway link carries only the Kubernetes API service",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_serves_only_the_kubernetes_api_service() {
        assert!(only_kubernetes_api("/sluice.kubernetes.v1.KubernetesApi/MakeRequest").is_ok());
        let refused = only_kubernetes_api("/test.Echo/Unary").unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Unimplemented);
    }
}
