//! The node's three listeners: agents park tunnels on the agent endpoint, clients call agents
//! on the external endpoint, other nodes forward calls to the private endpoint.

pub mod agent;
pub mod external;
pub mod private;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, Request};
use prost::Message as _;
use rustls::ServerConfig;
use sluice_grpc::encode_message;
use sluice_grpc::transport::{serve, H2Settings};
use sluice_grpc::Code;
use sluice_runtime::{ConnectionContext, TcpStream};

pub use agent::AgentEndpoint;
pub use external::ExternalEndpoint;
pub use private::PrivateEndpoint;

use super::answer::{grpc_headers, status_headers, Responder};
use super::NodeShared;
use crate::auth::AuthError;
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::TunnelMetrics;

/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts a connection with TLS when configured, then serves HTTP/2 on it.
async fn serve_connection<H, F>(
    stream: TcpStream,
    tls: Option<Arc<ServerConfig>>,
    settings: &H2Settings,
    conn: &ConnectionContext,
    handler: H,
) where
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: std::future::Future<Output = ()> + 'static,
{
    let io = sluice_grpc::transport::compat(stream);
    let peer = conn.peer;
    let result = match tls {
        Some(tls) => {
            let accepted = monoio::time::timeout(
                TLS_HANDSHAKE_TIMEOUT,
                tokio_rustls::TlsAcceptor::from(tls).accept(io),
            )
            .await;
            match accepted {
                Ok(Ok(io)) => serve(io, settings, conn.draining(), handler).await,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            }
        }
        None => serve(io, settings, conn.draining(), handler).await,
    };
    if let Err(error) = result {
        tracing::debug!(%peer, listener = conn.listener(), %error, "HTTP/2 connection ended with an error");
    }
}

/// A client's metadata over the limits a node forwards (`wire::check_metadata`): counted, and
/// answered RESOURCE_EXHAUSTED naming the limit.
fn check_client_metadata(
    node: &NodeShared,
    metadata: &[sluice_proto::tunnel::v1::MetadataEntry],
) -> Result<(), TunnelError> {
    crate::wire::check_metadata(metadata).map_err(|error| {
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

/// ListConnectedAgents, answered by the node itself.
async fn list_agents(node: &NodeShared, responder: &mut Responder) -> Result<Code, TunnelError> {
    let body = node.list_cluster_agents().await?.encode_to_vec();
    let Ok(mut stream) = responder.respond.send_response(grpc_headers(), false) else {
        return Err(TunnelError::client_gone());
    };
    let _ = stream.send_data(encode_message(false, &body), false);
    let mut trailers = HeaderMap::new();
    status_headers(&mut trailers, Code::Ok, "");
    let _ = stream.send_trailers(trailers);
    Ok(Code::Ok)
}
