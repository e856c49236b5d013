//! The node's three listeners: agents park tunnels on the agent endpoint, clients call agents
//! on the external endpoint, other nodes forward calls to the private endpoint; and the link in
//! memory through which this process's gateway calls agents (`in_process`).

mod access;
pub mod agent;
pub mod external;
pub mod in_process;
pub mod private;

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, Request};
use prost::Message as _;
use rustls::ServerConfig;
use sluice_grpc::encode_message;
use sluice_grpc::transport::{serve_limited, H2Settings, ServeLimits};
use sluice_grpc::Code;
use sluice_runtime::{CloseReason, ConnectionContext, TcpStream};

pub use agent::AgentEndpoint;
pub use external::ExternalEndpoint;
pub use in_process::GatewayLink;
pub use private::PrivateEndpoint;

use super::answer::{grpc_headers, status_headers, Responder};
use super::call::{parse_call, CallTarget};
use super::NodeShared;
use crate::auth::AuthError;
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::TunnelMetrics;
use crate::protocol::{KUBERNETES_API_SERVICE, LIST_AGENTS_PATH};

/// Accepts a connection with TLS when configured, then serves HTTP/2 on it under the
/// listener's limits (handshake, first request, idle, keepalive, age). Returns whether the
/// connection ended cleanly (the agent endpoint's disconnect log tells a reset from a close).
async fn serve_connection<H, F>(
    stream: TcpStream,
    tls: Option<Arc<ServerConfig>>,
    settings: &H2Settings,
    conn: &ConnectionContext,
    handler: H,
) -> bool
where
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: std::future::Future<Output = ()> + 'static,
{
    let io = match sluice_grpc::transport::compat(stream) {
        Ok(io) => io,
        Err(error) => {
            tracing::warn!(peer = %conn.peer, %error, "cannot register the connection for polling");
            return false;
        }
    };
    let peer = conn.peer;
    let on_limit = |reason: CloseReason| {
        tracing::debug!(%peer, listener = conn.listener(), reason = reason.label(), "connection closed on a limit");
        conn.closed_by(reason);
    };
    let on_retire = || conn.retire();
    let limits = ServeLimits {
        limits: conn.limits().clone(),
        handshake_deadline: monoio::time::Instant::now() + conn.limits().handshake_timeout,
        on_limit: &on_limit,
        retire_at: conn.retire_at(),
        on_retire: &on_retire,
    };
    let deadline = limits.handshake_deadline;
    let drain = conn.process_draining();
    let result = match tls {
        Some(tls) => {
            // Boxed with its timer, and taken apart in the statement that awaits it: the
            // handshake's state (a TLS session mid-handshake) or its result kept in this future
            // would stay beside the serving state for the connection's whole life.
            let accept = tokio_rustls::TlsAcceptor::from(tls).accept(io);
            let io = match Box::pin(monoio::time::timeout_at(deadline, accept)).await {
                Ok(Ok(io)) => io,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return false;
                }
                Err(_) => {
                    on_limit(CloseReason::HandshakeTimeout);
                    return false;
                }
            };
            serve_limited(io, settings, limits, drain, handler).await
        }
        None => serve_limited(io, settings, limits, drain, handler).await,
    };
    if let Err(error) = &result {
        tracing::debug!(%peer, listener = conn.listener(), %error, "HTTP/2 connection ended with an error");
    }
    result.is_ok()
}

/// A call endpoint's connection (external or private): every request runs `serve` on the
/// stream task the HTTP/2 server spawns for it, owning a handle to the endpoint.
fn serve_calls<E, F>(
    endpoint: Rc<E>,
    node: Arc<NodeShared>,
    tls: Option<Arc<ServerConfig>>,
    stream: TcpStream,
    conn: ConnectionContext,
    serve: fn(Rc<E>, ConnectionContext, Request<RecvStream>, SendResponse<Bytes>) -> F,
) -> Pin<Box<dyn std::future::Future<Output = ()>>>
where
    E: 'static,
    F: std::future::Future<Output = ()> + 'static,
{
    Box::pin(async move {
        let stream_conn = conn.clone();
        serve_connection(
            stream,
            tls,
            &node.settings,
            &conn,
            move |request, respond| serve(endpoint.clone(), stream_conn.clone(), request, respond),
        )
        .await;
    })
}

/// The last check of a call's parse phase, before it is routed: its metadata within the
/// limits a node forwards (ListConnectedAgents forwards nothing).
fn forwardable(
    node: &NodeShared,
    headers: &HeaderMap,
    admitted: Admitted,
) -> Result<Admitted, TunnelError> {
    if let Admitted::Call(_) = admitted {
        check_client_metadata(node, headers)?;
    }
    Ok(admitted)
}

/// A client's metadata over the limits a node forwards (`wire::check_metadata`): counted, and
/// answered RESOURCE_EXHAUSTED naming the limit.
fn check_client_metadata(node: &NodeShared, headers: &http::HeaderMap) -> Result<(), TunnelError> {
    let metadata = crate::wire::HeaderMetadata::of(headers);
    metadata.check(&node.metadata_limits).map_err(|error| {
        node.metrics.metadata_refused("client");
        TunnelError::new(ErrorKind::BadRequest, format!("request {error}"))
            .with_code(Code::ResourceExhausted)
    })
}

/// A gRPC method is `/package.Service/Method`. A `:path` that does not start with `/` (say
/// `@evil.example:443/x`) would become the authority of the URI the agent builds for its
/// backend, letting the caller pick where the agent connects: refused UNIMPLEMENTED, as a
/// gRPC server answers a method it does not serve.
fn check_method(method: &str) -> Result<(), TunnelError> {
    if method.starts_with('/') {
        return Ok(());
    }
    Err(TunnelError::new(
        ErrorKind::Unimplemented,
        "malformed method: a gRPC :path starts with '/' (/package.Service/Method)",
    ))
}

/// The external endpoint's clients may call any method of the agent's backend but not the
/// agent's Kubernetes API forwarder: a call there carries the user the gateway vouches for, so
/// a JWT holder reaching it could act as anyone in the cluster. Refused before routing, so
/// nothing reaches an agent.
fn open_to_clients(method: &str) -> Result<(), TunnelError> {
    if !method.starts_with(KUBERNETES_API_SERVICE) {
        return Ok(());
    }
    Err(TunnelError::new(
        ErrorKind::PermissionDenied,
        "the Kubernetes API service is reachable only through a node's Kubernetes API gateway, not the external endpoint",
    ))
}

/// What an authenticated request asks for.
enum Admitted {
    ListAgents,
    Call(CallTarget),
}

/// The parse phase of an authenticated request: a well-formed method, then either
/// ListConnectedAgents or a call with its agent and deadline (counted from `started`, when the
/// call arrived: the clock is read once per call here, not per phase).
fn parse_request(
    method: &str,
    headers: &HeaderMap,
    started: Instant,
) -> Result<Admitted, TunnelError> {
    check_method(method)?;
    if method == LIST_AGENTS_PATH {
        return Ok(Admitted::ListAgents);
    }
    parse_call(headers, started).map(Admitted::Call)
}

/// A refused credential: counted by endpoint and reason, answered UNAUTHENTICATED.
fn refused(metrics: &TunnelMetrics, endpoint: &'static str, error: &AuthError) -> TunnelError {
    metrics.auth_failure(endpoint, error.reason());
    TunnelError::new(ErrorKind::Unauthenticated, error.to_string())
}

/// Runs a call's phases, then answers its failure through [`Responder::fail`], the one place
/// a failed call reaches the client. Returns the code the call is counted under.
fn settle(
    outcome: Result<Code, TunnelError>,
    responder: &mut Responder,
    node: &NodeShared,
    worker: usize,
) -> Code {
    match outcome {
        Ok(code) => code,
        Err(error) => responder.fail(&error, &node.metrics, worker),
    }
}

/// ListConnectedAgents, answered by the node itself, one bounded page at a time.
async fn list_agents(
    node: &NodeShared,
    mut request: RecvStream,
    responder: &mut Responder,
) -> Result<Code, TunnelError> {
    let asked = super::listing::read_request(&mut request).await?;
    let body = super::listing::list_page(node, &asked)
        .await?
        .encode_to_vec();
    let Ok(mut stream) = responder.respond.send_response(grpc_headers(), false) else {
        return Err(TunnelError::client_gone());
    };
    let _ = stream.send_data(encode_message(false, &body), false);
    let mut trailers = HeaderMap::new();
    status_headers(&mut trailers, Code::Ok, "");
    let _ = stream.send_trailers(trailers);
    Ok(Code::Ok)
}
