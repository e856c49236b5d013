//! The private endpoint: other nodes forward calls here with a node JWT, naming the agent. It
//! serves them from this node's own tunnels only and never routes further, so calls cannot
//! loop. A routing node races several nodes: this one reports a ready tunnel (100 Continue)
//! and gives the tunnel back if another node wins.

use std::cell::RefCell;
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Request, Response};
use sluice_grpc::transport::recv_data;
use sluice_grpc::Code;
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use super::super::answer::Responder;
use super::super::call::{expects_continue, CallTarget};
use super::super::pumps::CallBody;
use super::super::relay::{relay_local, start_local, CallHead};
use super::super::route::{RouteEvent, RouteState};
use super::super::router::{Route, Router};
use super::super::tunnel::give_back;
use super::super::NodeShared;
use super::{
    check_client_metadata, list_agents, parse_request, refused, serve_calls, settle, Admitted,
};
use crate::auth::{AuthError, VerifiedTokens};
use crate::error::TunnelError;

/// How long a node that reported a ready tunnel (100 Continue) waits for the routing node to
/// start the request body before it puts the tunnel back: the winner starts at once.
const CONTINUE_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// One forwarded call: authenticate the node, parse, serve from a local tunnel; `settle`
    /// answers a failure. Owns its handler so the HTTP/2 server spawns this future itself.
    async fn serve(
        self: Rc<Self>,
        conn: ConnectionContext,
        request: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) {
        let started = Instant::now();
        let node = &*self.node;
        let mut responder = Responder::new(respond);
        let validated = match &node.private_jwt {
            Some((validator, _)) => self
                .verified_tokens
                .borrow_mut()
                .validate(validator, request.headers()),
            None => Err(AuthError::InvalidToken("no private JWT configured")),
        };
        let admitted = validated
            .map_err(|error| refused(&node.metrics, "private", &error))
            .and_then(|()| parse_request(request.uri().path(), request.headers()));
        let outcome = match admitted {
            // Boxed: its Redis timeout (a 640-byte, 128-byte aligned timer) stays out of
            // every call's future.
            Ok(Admitted::ListAgents) => {
                Box::pin(list_agents(node, request.into_body(), &mut responder)).await
            }
            Ok(Admitted::Call(target)) => {
                self.serve_locally(&conn, target, request, &mut responder)
                    .await
            }
            Err(error) => Err(error),
        };
        let code = settle(outcome, &mut responder, node, conn.worker());
        node.metrics.private_request(code, conn.worker());
        node.metrics
            .request_duration
            .observe(conn.worker(), started.elapsed().as_secs_f64());
        conn.request_served();
    }

    /// Serves the call from one of this node's tunnels, first confirming readiness when the
    /// routing node asks for it; a tunnel that broke before the call used it is replaced.
    async fn serve_locally(
        &self,
        conn: &ConnectionContext,
        target: CallTarget,
        request: Request<RecvStream>,
        responder: &mut Responder,
    ) -> Result<Code, TunnelError> {
        let node = &*self.node;
        let (parts, body) = request.into_parts();
        check_client_metadata(node, &parts.headers)?;
        let head = CallHead::new(parts.uri.path(), &parts.headers, target.deadline);
        let mut body = CallBody {
            body,
            early: Vec::new(),
            ended: false,
        };
        let router = Router {
            node: &self.node,
            remote: None,
            agent: target.agent,
            deadline: target.deadline,
            parts: &parts,
            worker: conn.worker(),
        };
        let mut state = RouteState::new(
            target.agent,
            target.deadline,
            node.max_wait(),
            false,
            Instant::now(),
        );
        let mut step = state.start();
        let mut confirm = expects_continue(&parts.headers);
        loop {
            let route = router.route(&mut state, step, responder).await;
            let mut tunnel = match route {
                Ok(Route::Local(tunnel)) => tunnel,
                // This endpoint never routes to other nodes.
                Ok(Route::Remote(_)) => return Err(TunnelError::client_gone()),
                Err(error) => {
                    let waited = state.waited_for(Instant::now());
                    node.metrics.wait_duration.observe(conn.worker(), waited);
                    return Err(error);
                }
            };
            if std::mem::take(&mut confirm) {
                if let Err(error) = confirm_ready(responder, &mut body).await {
                    give_back(&self.node, tunnel);
                    return Err(error);
                }
            }
            match start_local(node, &mut tunnel, &head, &mut body).await {
                Ok(up) => {
                    let waited = state.waited_for(Instant::now());
                    node.metrics.wait_duration.observe(conn.worker(), waited);
                    let call = (&mut body.body, &mut *responder);
                    return relay_local(&self.node, tunnel, up, call, target.deadline, conn).await;
                }
                Err(error) => {
                    let replied = responder.replied();
                    step = state.next_step(RouteEvent::Failed { error, replied }, Instant::now());
                }
            }
        }
    }
}

/// Reports the tunnel this node holds for the call (100 Continue) and waits for the routing
/// node to start the request. Fails with `ClientGone` when the routing node chose another node
/// (reset) or went quiet.
async fn confirm_ready(responder: &mut Responder, body: &mut CallBody) -> Result<(), TunnelError> {
    let ready = Response::builder()
        .status(http::StatusCode::CONTINUE)
        .body(())
        .map_err(|_| TunnelError::client_gone())?;
    let respond = &mut responder.respond;
    respond
        .send_informational(ready)
        .map_err(|_| TunnelError::client_gone())?;
    let next = monoio::select! {
        chunk = recv_data(&mut body.body) => Some(chunk),
        _ = poll_fn(|cx| respond.poll_reset(cx)) => None,
        _ = monoio::time::sleep(CONTINUE_TIMEOUT) => None,
    };
    match next {
        Some(None) => {
            body.ended = true;
            Ok(())
        }
        Some(Some(Ok(chunk))) => {
            body.early.push(chunk);
            Ok(())
        }
        Some(Some(Err(_))) | None => Err(TunnelError::client_gone()),
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
        assert!(size <= 4096, "a forwarded call's future is {size} bytes");
    }
}
