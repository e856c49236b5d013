//! The external endpoint: clients call agents here with a JWT and `sluice-agent-id`. A call
//! reads top-down: authenticate, parse, route (the one driver, `router.rs`: a local tunnel or
//! another node found by the locator, relayed to the end), settle (answer a failure).

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use sluice_grpc::Code;
use sluice_metrics::PerCoreCounter;
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use super::super::answer::Responder;
use super::super::remote::RemoteRouting;
use super::super::router::{Readiness, Router};
use super::super::NodeShared;
use super::access::CallLine;
use super::{
    forwardable, list_agents, open_to_clients, parse_request, refused, serve_calls, settle,
    Admitted,
};
use crate::auth::VerifiedTokens;
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::CallRoute;

/// The external endpoint's handler factory.
#[derive(Debug, Clone)]
pub struct ExternalEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for ExternalEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(ExternalHandler::new(&self.node))
    }
}

/// Per-core state: request counters this core has looked up, verified client tokens, and the
/// way to other nodes.
#[derive(Debug)]
pub(in crate::node) struct ExternalHandler {
    node: Arc<NodeShared>,
    /// By method, then by status code: looked up with the request's `&str` path, so a hit
    /// allocates nothing.
    /// foldhash: looked up on every call.
    counters: RefCell<foldhash::HashMap<String, [Option<PerCoreCounter>; 17]>>,
    /// Client JWTs this core has verified.
    verified_tokens: RefCell<VerifiedTokens>,
    remote: Option<RemoteRouting>,
}

impl ExternalHandler {
    pub(in crate::node) fn new(node: &Arc<NodeShared>) -> Self {
        Self {
            node: node.clone(),
            counters: RefCell::default(),
            verified_tokens: RefCell::default(),
            remote: RemoteRouting::new(node),
        }
    }

    pub(in crate::node) fn count(&self, method: &str, code: Code, worker: usize) {
        let mut counters = self.counters.borrow_mut();
        let slot = code.as_u32() as usize;
        if let Some(counter) = counters
            .get(method)
            .and_then(|by_code| by_code[slot].as_ref())
        {
            counter.inc(worker);
            return;
        }
        let counter = self.node.metrics.requests(method, code);
        counter.inc(worker);
        // Method names come from clients: cache only as many as get their own metric label,
        // so random paths cannot grow this map (they are counted under "other", uncached).
        if counters.len() < crate::metrics::MAX_METHOD_LABELS || counters.contains_key(method) {
            counters.entry(method.to_string()).or_default()[slot] = Some(counter);
        }
    }

    /// One call, counted by method and code. Phases: authenticate, parse (shed when the node is
    /// overloaded, metadata within limits), route (the one driver, `Router::drive`), settle.
    ///
    /// Owns its handler so the HTTP/2 server spawns this future itself: every wrapper around
    /// a call's future is one more copy of its state (kilobytes) per call.
    async fn serve(
        self: Rc<Self>,
        conn: ConnectionContext,
        request: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) {
        let started = Instant::now();
        let node = &*self.node;
        let (parts, body) = request.into_parts();
        let method = parts.uri.path();
        let mut responder = Responder::new(respond);
        let authenticated = self
            .verified_tokens
            .borrow_mut()
            .validate(&node.jwt(), &parts.headers)
            .map_err(|error| refused(&node.metrics, "external", &error));
        let is_authenticated = authenticated.is_ok();
        let admitted = authenticated
            .and_then(|()| open_to_clients(method))
            .and_then(|()| parse_request(method, &parts.headers, started))
            .and_then(unless_shedding)
            .and_then(|admitted| forwardable(node, &parts.headers, admitted));
        let agent = match &admitted {
            Ok(Admitted::Call(target)) => Some(target.agent),
            _ => None,
        };
        let mut route = CallRoute::None;
        let outcome = match admitted {
            // Boxed: its Redis timeout (a 640-byte, 128-byte aligned timer) stays out of
            // every call's future.
            Ok(Admitted::ListAgents) => Box::pin(list_agents(node, body, &mut responder)).await,
            Ok(Admitted::Call(target)) => {
                let router = Router::new(
                    &self.node,
                    self.remote.as_ref(),
                    &target,
                    &parts,
                    conn.worker(),
                );
                // Boxed: the route phase's state (kilobytes) is made inside the task, so the
                // HTTP/2 server's spawn copies only this future's head (a tunnel node spent about
                // 2 % of its CPU per call copying the whole of it into the task).
                let outcome = Box::pin(router.drive(body, Readiness::Silent, &mut responder)).await;
                route = router.taken();
                outcome
            }
            Err(error) => Err(error),
        };
        let code = settle(outcome, &mut responder, node, conn.worker());
        // The method is the caller's text: it becomes a label only once the caller proved who
        // it is (and then bounded, see `TunnelMetrics::requests`).
        let label = if is_authenticated {
            method
        } else {
            crate::metrics::UNAUTHENTICATED_METHOD
        };
        self.count(label, code, conn.worker());
        node.metrics
            .observe_request(route, conn.worker(), started.elapsed().as_secs_f64());
        let line = CallLine {
            endpoint: "external",
            method,
            authenticated: is_authenticated,
            agent,
            route,
            code,
            started,
        };
        super::access::log(&conn, line);
        conn.request_served();
    }
}

/// The newest calls are the ones shed: every call admitted before goes on.
fn unless_shedding(admitted: Admitted) -> Result<Admitted, TunnelError> {
    if !sluice_overload::shedding() {
        return Ok(admitted);
    }
    sluice_overload::count_shed(sluice_overload::Role::Tunnel);
    Err(TunnelError::new(
        ErrorKind::Overloaded,
        "the node is overloaded (near its memory or file-descriptor limit) and sheds new calls; retry later",
    ))
}

impl ConnectionHandler for ExternalHandler {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        let (node, tls) = (self.node.clone(), self.node.external_tls.clone());
        serve_calls(self, node, tls, stream, conn, Self::serve)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::test_node::node;
    use super::*;

    #[test]
    fn random_method_names_cannot_grow_the_counter_cache() {
        let handler = ExternalHandler::new(&node(None));
        for index in 0..5_000 {
            handler.count(
                &format!("/random.Service/Method{index}"),
                Code::Unauthenticated,
                0,
            );
        }
        assert!(handler.counters.borrow().len() <= crate::metrics::MAX_METHOD_LABELS);
        // The first methods keep their own counters; the rest are counted as "other".
        let first = handler
            .node
            .metrics
            .requests("/random.Service/Method0", Code::Unauthenticated);
        assert_eq!(first.sum(), 1);
        let other = handler
            .node
            .metrics
            .requests("/random.Service/Method4999", Code::Unauthenticated);
        assert_eq!(
            other.sum(),
            5_000 - crate::metrics::MAX_METHOD_LABELS as u64
        );
    }

    /// The HTTP/2 server spawns every call's future, and each wrapper on the way (the panic
    /// guard, monoio's task cell) copies all of it. A connection to a peer node, opened once
    /// per peer, is boxed out of it (inline it made a call's future 9,472 bytes), and so is the
    /// route phase (4,096 bytes with it inline, 872 without, in a debug build).
    #[test]
    fn a_call_future_stays_small() {
        let size = crate::future_size::of_four(ExternalHandler::serve);
        assert!(size <= 1280, "a call's future is {size} bytes");
    }
}
