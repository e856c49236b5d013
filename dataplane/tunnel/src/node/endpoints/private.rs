//! The private endpoint: other nodes forward calls here with a node JWT, naming the agent. It
//! serves them from this node's own tunnels only and never routes further, so calls cannot
//! loop. A routing node races several nodes: this one reports a ready tunnel (100 Continue)
//! and gives the tunnel back if another node wins.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use super::super::answer::Responder;
use super::super::call::expects_continue;
use super::super::call::CallTarget;
use super::super::framed::{end_relay, next_call, SPLICE_PATH};
use super::super::pumps::CallBody;
use super::super::router::{Readiness, Router};
use super::super::NodeShared;
use super::access::CallLine;
use super::{forwardable, list_agents, parse_request, refused, serve_calls, settle, Admitted};
use crate::auth::{AuthError, VerifiedTokens};
use crate::error::TunnelError;
use crate::metrics::CallRoute;

/// The private endpoint's handler factory.
#[derive(Debug, Clone)]
pub struct PrivateEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for PrivateEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(PrivateHandler {
            node: self.node.clone(),
            verified_tokens: RefCell::default(),
        })
    }
}

/// Per-core state of the private endpoint.
#[derive(Debug)]
pub(in crate::node) struct PrivateHandler {
    node: Arc<NodeShared>,
    /// Node tokens this core has verified: a routing node signs one token per second and
    /// sends it with every call it forwards, so a signature is checked once per second per
    /// routing node and core, not per call.
    verified_tokens: RefCell<VerifiedTokens>,
}

impl ConnectionHandler for PrivateHandler {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        let (node, tls) = (self.node.clone(), self.node.private_tls.clone());
        serve_calls(self, node, tls, stream, conn, Self::serve)
    }
}

impl PrivateHandler {
    /// One forwarded call. Phases: authenticate the node, parse, route (the one driver,
    /// `Router::drive`, on this node's tunnels only), settle. Owns its handler so the HTTP/2
    /// server spawns this future itself.
    async fn serve(
        self: Rc<Self>,
        conn: ConnectionContext,
        request: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) {
        let started = Instant::now();
        let node = &*self.node;
        let (parts, body) = request.into_parts();
        let mut responder = Responder::new(respond);
        let authenticated = self.authenticate(&parts.headers);
        // A routing node sends framed calls only after this node offered them.
        let spliced = node.splice_private_hop && parts.uri.path() == SPLICE_PATH;
        let is_authenticated = authenticated.is_ok();
        let admitted = authenticated
            .and_then(|()| parse_request(parts.uri.path(), &parts.headers, started))
            .and_then(|admitted| forwardable(node, &parts.headers, admitted));
        let agent = match &admitted {
            Ok(Admitted::Call(target)) => Some(target.agent),
            _ => None,
        };
        let mut route = CallRoute::None;
        let mut relay = None;
        let outcome = match admitted {
            // Boxed: its Redis timeout (a 640-byte, 128-byte aligned timer) stays out of
            // every call's future.
            Ok(Admitted::ListAgents) => Box::pin(list_agents(node, body, &mut responder)).await,
            Ok(Admitted::Call(target)) => {
                // Never to other nodes (no `RemoteRouting`), so forwarded calls cannot loop.
                let mut router = Router::new(&self.node, None, &target, &parts, conn.worker());
                if spliced {
                    router = router.splicing();
                }
                let readiness = if expects_continue(&parts.headers) {
                    Readiness::Report
                } else {
                    Readiness::Silent
                };
                let mut body = CallBody::new(body);
                // Boxed, as on the external endpoint: spawning copies only this future's head.
                let outcome =
                    Box::pin(router.drive_body(&mut body, readiness, &mut responder)).await;
                // Carried here for another node; `none` when no tunnel was found.
                if router.taken() != CallRoute::None {
                    route = CallRoute::Private;
                }
                if spliced && outcome.is_ok() {
                    relay = Some((target.agent, body, router.relay_goes_on()));
                }
                outcome
            }
            Err(error) => Err(error),
        };
        let code = settle(outcome, &mut responder, node, conn.worker());
        let line = CallLine {
            endpoint: "private",
            method: parts.uri.path(),
            authenticated: is_authenticated,
            agent,
            route,
            code,
            started,
        };
        self.served(&conn, line);
        match relay {
            Some((agent, body, true)) if !body.ended => {
                // Boxed: only a framed stream's first call goes on to carry more.
                Box::pin(self.serve_relay(&conn, agent, &parts, body, responder)).await;
            }
            Some(_) => end_relay(&mut responder),
            None => {}
        }
    }

    /// Counts and logs one call served.
    fn served(&self, conn: &ConnectionContext, line: CallLine<'_>) {
        let node = &*self.node;
        node.metrics.private_request(line.code, conn.worker());
        node.metrics.observe_request(
            line.route,
            conn.worker(),
            line.started.elapsed().as_secs_f64(),
        );
        super::access::log(conn, line);
        conn.request_served();
    }

    /// The calls after the first on a framed stream the routing node keeps (`framed.rs`): each
    /// waits for its first bytes, then is routed to a tunnel of this node and spliced as the
    /// first was, with no deadline of its own (the routing node keeps the call's deadline and
    /// resets the stream at it). The stream ends OK when the routing node ends it or stays
    /// quiet, or the connection closes; a call that fails ends it with that call's status.
    async fn serve_relay(
        &self,
        conn: &ConnectionContext,
        agent: crate::registry::AgentId,
        parts: &http::request::Parts,
        mut body: CallBody,
        mut responder: Responder,
    ) {
        let node = &*self.node;
        let closing = conn.closing();
        while next_call(&mut body, &mut responder, &closing).await {
            let started = Instant::now();
            let target = CallTarget {
                agent,
                deadline: None,
                arrived: started,
            };
            let router = Router::new(&self.node, None, &target, parts, conn.worker()).splicing();
            let outcome = router
                .drive_body(&mut body, Readiness::Silent, &mut responder)
                .await;
            let goes_on = outcome.is_ok() && router.relay_goes_on() && !body.ended;
            let ended = outcome.is_err();
            let route = match router.taken() {
                CallRoute::None => CallRoute::None,
                _ => CallRoute::Private,
            };
            let code = settle(outcome, &mut responder, node, conn.worker());
            let line = CallLine {
                endpoint: "private",
                method: parts.uri.path(),
                authenticated: true,
                agent: Some(agent),
                route,
                code,
                started,
            };
            self.served(conn, line);
            if ended {
                // Answered with its status, which ended the stream.
                return;
            }
            if !goes_on {
                break;
            }
        }
        end_relay(&mut responder);
    }

    /// The calling node's JWT, checked against this node's private validator.
    fn authenticate(&self, headers: &http::HeaderMap) -> Result<(), TunnelError> {
        let node = &*self.node;
        let validated = match &node.private_jwt {
            Some((validator, _)) => self
                .verified_tokens
                .borrow_mut()
                .validate(validator, headers),
            None => Err(AuthError::InvalidToken("no private JWT configured")),
        };
        validated.map_err(|error| refused(&node.metrics, "private", &error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As a call on the external endpoint (`a_call_future_stays_small` there): the HTTP/2
    /// server spawns every forwarded call's future, copying all of it.
    #[test]
    fn a_forwarded_call_future_stays_small() {
        let size = crate::future_size::of_four(PrivateHandler::serve);
        // 976 bytes in a debug build with the route phase boxed.
        assert!(size <= 1280, "a forwarded call's future is {size} bytes");
    }
}
