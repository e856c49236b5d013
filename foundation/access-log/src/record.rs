//! One request's line: owned, built only for a logged request, formatted on the writer thread.

use std::net::IpAddr;
use std::time::Duration;

use crate::switch::Role;

/// A request through the Kubernetes API gateway, logged at its response head (the duration and
/// sizes are up to there: a watch's line comes when it starts, not when it ends).
#[derive(Debug, Clone, Default)]
pub struct HttpRecord {
    pub client: Option<IpAddr>,
    /// The cluster the client's TLS server name chose (a configured name).
    pub cluster: String,
    /// Who the request runs as, once authenticated (never a client-chosen text before).
    pub principal: Option<String>,
    pub method: String,
    /// Escaped and bounded (see [`crate::bounded`]).
    pub path: String,
    /// The apiserver the request went to, if it got that far.
    pub upstream: Option<String>,
    pub status: u16,
    /// Body sizes as declared by `Content-Length` (absent for a streamed body).
    pub request_bytes: Option<u64>,
    pub response_bytes: Option<u64>,
    pub duration: Duration,
    /// The client's `X-Request-Id`, bounded and escaped.
    pub request_id: Option<String>,
}

/// A gRPC call through the tunnel node, logged when the call ends.
#[derive(Debug, Clone, Default)]
pub struct GrpcRecord {
    pub client: Option<IpAddr>,
    /// The endpoint the call came in on (`external`, or `private` from another node).
    pub endpoint: &'static str,
    /// Whether the caller's JWT was valid.
    pub authenticated: bool,
    /// The gRPC method (the request path), bounded and escaped.
    pub grpc_method: String,
    /// The agent the call asked for, once its caller was authenticated.
    pub agent_id: Option<i64>,
    /// `local`, `remote`, `private` or `none` (answered before any route).
    pub route: &'static str,
    pub grpc_code: &'static str,
    pub grpc_status: u32,
    pub duration: Duration,
}

#[derive(Debug, Clone)]
pub enum Record {
    Http(HttpRecord),
    Grpc(GrpcRecord),
}

impl Record {
    pub(crate) fn role(&self) -> Role {
        match self {
            Record::Http(_) => Role::Gateway,
            Record::Grpc(_) => Role::Tunnel,
        }
    }

    /// Writes the line (on the writer thread). Fields that are `None` are left out.
    pub(crate) fn emit(&self) {
        match self {
            Record::Http(http) => tracing::info!(
                target: "sluice::access",
                role = "gateway",
                client = http.client.map(tracing::field::display),
                cluster = http.cluster.as_str(),
                principal = http.principal.as_deref(),
                method = http.method.as_str(),
                path = http.path.as_str(),
                upstream = http.upstream.as_deref(),
                status = http.status,
                request_bytes = http.request_bytes,
                response_bytes = http.response_bytes,
                duration_us = micros(http.duration),
                request_id = http.request_id.as_deref(),
                "access"
            ),
            Record::Grpc(grpc) => tracing::info!(
                target: "sluice::access",
                role = "tunnel",
                client = grpc.client.map(tracing::field::display),
                endpoint = grpc.endpoint,
                authenticated = grpc.authenticated,
                grpc_method = grpc.grpc_method.as_str(),
                agent_id = grpc.agent_id,
                route = grpc.route,
                grpc_code = grpc.grpc_code,
                grpc_status = grpc.grpc_status,
                duration_us = micros(grpc.duration),
                "access"
            ),
        }
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
