//! The gateway proxy's one error type, in the spirit of pingora-error: every way a request (or a
//! config load) can fail here is a [`ProxyError`] that knows which party failed ([`Side`]), the
//! HTTP status and Kubernetes `Status` reason it is answered with, whether the proxy could try
//! again before anything reached the client, and its message. The causes beneath it
//! ([`UpstreamFailure`], [`ApiCallFailure`], [`ClusterFileError`]) are typed, so decisions are made on
//! variants, never on message text; their `Display` is the message clients and logs see.
//!
//! Turning an error into the client's answer happens in one place, `answer.rs`.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;
use rustls_pki_types::InvalidDnsNameError;
use sluice_gateway::cluster::InvalidSources;
use sluice_gateway::status::{
    EmptyObject, GatewayError, Status, StatusDetails, RETRY_AFTER_SECONDS,
};

mod agent;
mod upgrade_head;

pub use agent::{AgentFailure, LinkFailure};
pub use upgrade_head::{UpgradeHeadError, MAX_HEAD_BYTES};

/// Which party a failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client: its TLS handshake, request, credentials or rights, or its share of the load.
    Client,
    /// The reviews (TokenReview, SubjectAccessReview) the gateway asks of the cluster to judge a
    /// client.
    Auth,
    /// The apiservers requests are forwarded to.
    Upstream,
    /// A cluster directory, at start or on reload.
    Config,
    /// The gateway itself.
    Internal,
}

/// Every failure of the gateway proxy.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A phase refused the request with its own verdict (bad request, unauthorized, forbidden
    /// impersonation, no dispatch policy, flow control, no healthy server, unknown host).
    #[error(transparent)]
    Refused(#[from] GatewayError),
    /// The client's TLS handshake failed: nothing can be answered.
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] io::Error),
    /// A TokenReview or SubjectAccessReview got no usable answer, so the client cannot be judged.
    #[error("authentication backend of cluster {cluster:?} is unavailable: {cause}")]
    AuthUnavailable {
        cluster: Box<str>,
        #[source]
        cause: ApiCallFailure,
    },
    /// Talking to the chosen apiserver failed before any response byte reached the client.
    #[error("upstream {server} failed: {cause}")]
    Upstream {
        server: Box<str>,
        #[source]
        cause: UpstreamFailure,
    },
    /// A request to an agent server failed before its answer reached the client.
    #[error("agent {agent}: {cause}")]
    Agent {
        agent: u64,
        #[source]
        cause: AgentFailure,
    },
    /// The cluster files did not validate; nothing of them is applied.
    #[error("{count} config error(s)\n{0}", count = .0.error_count())]
    Config(#[from] InvalidSources),
    /// A cluster's TLS material or credentials could not be built from the files it names.
    /// (The cause is in the message and deliberately not a `source`, so a start-up error chain
    /// names it once.)
    #[error("{file}: cluster {cluster:?}: {cause}")]
    ClusterFiles {
        file: PathBuf,
        cluster: Box<str>,
        cause: ClusterFileError,
    },
    /// The gateway process is near its memory or file-descriptor limit and sheds new requests
    /// (requests already admitted go on); another gateway, or this one a moment later, serves it.
    #[error("the gateway is overloaded (near its memory or file-descriptor limit) and sheds new requests; retry later")]
    Overloaded,
}

/// The step of talking to an apiserver that failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFailure {
    /// Connection set-up of the shared HTTP/2 pool: TCP.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: Box<str>,
        #[source]
        source: io::Error,
    },
    /// Connection set-up took longer than the pool allows.
    #[error("no connection to {endpoint} within {timeout:?}")]
    ConnectTimeout {
        endpoint: Box<str>,
        timeout: Duration,
    },
    /// The server's host is no valid TLS server name.
    #[error("invalid server name of {endpoint}: {source}")]
    ServerName {
        endpoint: Box<str>,
        #[source]
        source: InvalidDnsNameError,
    },
    #[error("TLS handshake with {endpoint}: {source}")]
    Tls {
        endpoint: Box<str>,
        #[source]
        source: io::Error,
    },
    #[error("HTTP/2 handshake with {endpoint}: {source}")]
    Http2Handshake {
        endpoint: Box<str>,
        #[source]
        source: h2::Error,
    },
    /// The connection could not take another stream (it closed before the request was sent).
    #[error(transparent)]
    Ready(h2::Error),
    /// The request (its head, or the gateway's own request body) could not be sent.
    #[error(transparent)]
    Send(h2::Error),
    /// The request was sent; its response (head or body) failed.
    #[error(transparent)]
    Response(h2::Error),
    /// An upgrade's own HTTP/1.1 connection: TCP.
    #[error(transparent)]
    UpgradeConnect(io::Error),
    /// An upgrade's own connection: the server's host is no valid TLS server name.
    #[error(transparent)]
    UpgradeServerName(InvalidDnsNameError),
    /// An upgrade's own connection: TLS.
    #[error(transparent)]
    UpgradeTls(io::Error),
    /// An upgrade's request or answer head, before the answer reached the client.
    #[error(transparent)]
    UpgradeRelay(UpgradeHeadError),
}

/// A call the gateway makes to an apiserver on its own behalf (TokenReview, SubjectAccessReview,
/// health probe) that got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ApiCallFailure {
    #[error("no answer to {path} within {timeout:?}")]
    Timeout { path: Box<str>, timeout: Duration },
    #[error("no healthy server to ask")]
    NoHealthyServer,
    /// An agent server's probe: the agent holds no tunnel connection on any node.
    #[error("agent {agent} is not connected to any node")]
    AgentNotConnected { agent: u64 },
    /// A review through an agent (a cluster of agent servers alone) that got no answer.
    #[error("through agent {agent}: {cause}")]
    Agent {
        agent: u64,
        #[source]
        cause: AgentFailure,
    },
    #[error(transparent)]
    Upstream(#[from] UpstreamFailure),
    /// The request could not be built (the server's address does not make a valid URI).
    #[error(transparent)]
    Request(#[from] http::Error),
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    #[error("{path} answered more than {limit} bytes")]
    TooLarge { path: Box<str>, limit: usize },
    /// A status other than 2xx, with the start of the body.
    #[error("{path} answered {status}: {excerpt}")]
    Status {
        path: Box<str>,
        status: StatusCode,
        excerpt: String,
    },
    #[error("{path}: invalid JSON: {source}")]
    InvalidJson {
        path: Box<str>,
        #[source]
        source: serde_json::Error,
    },
}

/// Why a cluster's TLS material or credentials could not be built from its files.
#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    /// A certificate, key or CA file.
    #[error(transparent)]
    Material(#[from] sluice_grpc::tls::TlsError),
    /// The crypto provider refused the protocol versions.
    #[error(transparent)]
    Protocols(rustls::Error),
    #[error("spec.secureServing.clientCAFile: {0}")]
    ClientCa(#[source] rustls::server::VerifierBuilderError),
    #[error("spec.secureServing: {0}")]
    ServingCertificate(#[source] rustls::Error),
    #[error("spec.clientConfig.insecure is not supported: give caFile so the gateway can verify the apiservers")]
    Insecure,
    #[error("spec.clientConfig: {0}")]
    ClientCertificate(#[source] rustls::Error),
    #[error("spec.clientConfig.bearerTokenFile {}: {source}", path.display())]
    BearerTokenFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spec.clientConfig: the bearer token is not a valid header value")]
    BearerToken,
}

/// The label values of `sluice_gateway_rejected_total{reason}`, one per way the gateway answers
/// a client itself (see [`ProxyError::metric_label`]).
pub const REJECT_REASONS: [&str; 17] = [
    "unknown_host",
    "tls_handshake",
    "bad_request",
    "unauthorized",
    "impersonation_forbidden",
    "no_dispatch_policy",
    "too_many_requests",
    "fair_share",
    "token_reviews_busy",
    "authentication_failures_limited",
    "no_healthy_upstream",
    "authentication_unavailable",
    "upstream_failed",
    "internal",
    "overloaded",
    "agent_not_connected",
    "agent_busy",
];

impl ProxyError {
    /// Which party failed.
    pub fn side(&self) -> Side {
        match self {
            ProxyError::Refused(refusal) => match refusal {
                GatewayError::UnknownHost { .. }
                | GatewayError::BadRequest { .. }
                | GatewayError::Unauthorized
                | GatewayError::ImpersonationForbidden { .. }
                | GatewayError::NoDispatchPolicy { .. }
                | GatewayError::TooManyRequests { .. }
                | GatewayError::FairShare { .. }
                | GatewayError::TokenReviewsBusy { .. }
                | GatewayError::AuthenticationFailuresLimited { .. } => Side::Client,
                GatewayError::AuthenticationUnavailable { .. } => Side::Auth,
                GatewayError::NoHealthyUpstream { .. } | GatewayError::UpstreamFailed { .. } => {
                    Side::Upstream
                }
                GatewayError::Internal { .. } => Side::Internal,
            },
            ProxyError::Handshake(_) => Side::Client,
            ProxyError::AuthUnavailable { .. } => Side::Auth,
            ProxyError::Upstream { .. } | ProxyError::Agent { .. } => Side::Upstream,
            ProxyError::Config(_) | ProxyError::ClusterFiles { .. } => Side::Config,
            ProxyError::Overloaded => Side::Internal,
        }
    }

    /// The HTTP status of the client's answer.
    pub fn http_status(&self) -> StatusCode {
        match self {
            ProxyError::Refused(refusal) => refusal.http_status(),
            ProxyError::Handshake(_) => StatusCode::BAD_REQUEST,
            ProxyError::AuthUnavailable { .. } | ProxyError::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Agent { cause, .. } => cause.http_status(),
            ProxyError::Config(_) | ProxyError::ClusterFiles { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The `reason` of the Kubernetes `Status` (metav1.StatusReason).
    pub fn status_reason(&self) -> &'static str {
        match self {
            ProxyError::Refused(refusal) => refusal.reason(),
            ProxyError::Handshake(_) => "BadRequest",
            // client-go retries ServiceUnavailable; a 502 from a proxy means the same to it.
            ProxyError::AuthUnavailable { .. }
            | ProxyError::Upstream { .. }
            | ProxyError::Overloaded => "ServiceUnavailable",
            ProxyError::Agent { cause, .. } => cause.status_reason(),
            ProxyError::Config(_) | ProxyError::ClusterFiles { .. } => "InternalError",
        }
    }

    /// `Retry-After` seconds: the client may try again later.
    pub fn retry_after_seconds(&self) -> Option<u32> {
        match self {
            ProxyError::Refused(refusal) => refusal.retry_after_seconds(),
            ProxyError::AuthUnavailable { .. } | ProxyError::Upstream { .. } => {
                Some(RETRY_AFTER_SECONDS)
            }
            ProxyError::Overloaded => Some(sluice_overload::RETRY_AFTER_SECONDS),
            ProxyError::Agent { cause, .. } => cause.retry_later().then_some(RETRY_AFTER_SECONDS),
            ProxyError::Handshake(_) | ProxyError::Config(_) | ProxyError::ClusterFiles { .. } => {
                None
            }
        }
    }

    /// Whether the proxy itself may try again (another server, another connection) before
    /// anything reached the client: only when the request never reached an apiserver, or the
    /// apiserver said it did not process it. Verdicts are final.
    pub fn retry_before_reply(&self) -> bool {
        match self {
            ProxyError::AuthUnavailable { cause, .. } => cause.may_retry(),
            ProxyError::Upstream { cause, .. } => cause.request_unsent(),
            ProxyError::Refused(_)
            | ProxyError::Handshake(_)
            | ProxyError::Config(_)
            | ProxyError::ClusterFiles { .. }
            | ProxyError::Agent { .. }
            | ProxyError::Overloaded => false,
        }
    }

    /// Whether the refusal came before the client was authenticated (so nothing it chose may
    /// become a metric label): its connection, its path, its credentials, or the reviews
    /// judging them.
    pub fn before_authentication(&self) -> bool {
        match self {
            ProxyError::Refused(refusal) => matches!(
                refusal,
                GatewayError::UnknownHost { .. }
                    | GatewayError::BadRequest { .. }
                    | GatewayError::Unauthorized
                    | GatewayError::TokenReviewsBusy { .. }
                    | GatewayError::AuthenticationFailuresLimited { .. }
                    | GatewayError::AuthenticationUnavailable { .. }
            ),
            // Shed before anything about the client is known.
            ProxyError::Handshake(_)
            | ProxyError::AuthUnavailable { .. }
            | ProxyError::Overloaded => true,
            ProxyError::Upstream { .. }
            | ProxyError::Agent { .. }
            | ProxyError::Config(_)
            | ProxyError::ClusterFiles { .. } => false,
        }
    }

    /// The `reason` label of `sluice_gateway_rejected_total` (one of [`REJECT_REASONS`]).
    pub fn metric_label(&self) -> &'static str {
        match self {
            ProxyError::Refused(refusal) => match refusal {
                GatewayError::UnknownHost { .. } => "unknown_host",
                GatewayError::BadRequest { .. } => "bad_request",
                GatewayError::Unauthorized => "unauthorized",
                GatewayError::ImpersonationForbidden { .. } => "impersonation_forbidden",
                GatewayError::NoDispatchPolicy { .. } => "no_dispatch_policy",
                GatewayError::TooManyRequests { .. } => "too_many_requests",
                GatewayError::FairShare { .. } => "fair_share",
                GatewayError::TokenReviewsBusy { .. } => "token_reviews_busy",
                GatewayError::AuthenticationFailuresLimited { .. } => {
                    "authentication_failures_limited"
                }
                GatewayError::NoHealthyUpstream { .. } => "no_healthy_upstream",
                GatewayError::AuthenticationUnavailable { .. } => "authentication_unavailable",
                GatewayError::UpstreamFailed { .. } => "upstream_failed",
                GatewayError::Internal { .. } => "internal",
            },
            ProxyError::Handshake(_) => "tls_handshake",
            ProxyError::AuthUnavailable { .. } => "authentication_unavailable",
            ProxyError::Upstream { .. } => "upstream_failed",
            ProxyError::Config(_) | ProxyError::ClusterFiles { .. } => "internal",
            ProxyError::Overloaded => "overloaded",
            ProxyError::Agent { cause, .. } => cause.metric_label(),
        }
    }

    /// The Kubernetes `Status` the client receives.
    pub fn to_status(&self) -> Status {
        match self {
            ProxyError::Refused(refusal) => refusal.to_status(),
            _ => Status {
                kind: "Status",
                api_version: "v1",
                metadata: EmptyObject {},
                status: "Failure",
                message: self.to_string(),
                reason: self.status_reason(),
                details: self.retry_after_seconds().map(|seconds| StatusDetails {
                    retry_after_seconds: seconds,
                }),
                code: self.http_status().as_u16(),
            },
        }
    }

    /// The `Status` as the JSON body (`Content-Type: application/json`).
    pub fn status_body(&self) -> Vec<u8> {
        // The one Status encoder (`sluice-kube-status`), as for the gateway's own refusals.
        self.to_status().into_body()
    }
}

impl UpstreamFailure {
    /// Whether the request certainly never reached the apiserver's handlers: the connection
    /// was never set up, the request was never sent, or the server refused the stream
    /// (REFUSED_STREAM: RFC 9113 section 8.7 guarantees it was not processed).
    pub fn request_unsent(&self) -> bool {
        match self {
            UpstreamFailure::Connect { .. }
            | UpstreamFailure::ConnectTimeout { .. }
            | UpstreamFailure::Tls { .. }
            | UpstreamFailure::Http2Handshake { .. }
            | UpstreamFailure::Ready(_)
            | UpstreamFailure::Send(_)
            | UpstreamFailure::UpgradeConnect(_)
            | UpstreamFailure::UpgradeTls(_) => true,
            UpstreamFailure::Response(error) => error.reason() == Some(h2::Reason::REFUSED_STREAM),
            // A bad name stays bad; an upgrade's head went out (or failed half-way).
            UpstreamFailure::ServerName { .. }
            | UpstreamFailure::UpgradeServerName(_)
            | UpstreamFailure::UpgradeRelay(_) => false,
        }
    }
}

impl ApiCallFailure {
    /// Reviews and probes change nothing on the apiserver, so asking again is safe whenever
    /// another attempt could answer differently.
    pub fn may_retry(&self) -> bool {
        match self {
            ApiCallFailure::Timeout { .. } | ApiCallFailure::Upstream(_) => true,
            ApiCallFailure::Status { status, .. } => status.is_server_error(),
            ApiCallFailure::Agent { cause, .. } => cause.retry_later(),
            ApiCallFailure::NoHealthyServer
            | ApiCallFailure::AgentNotConnected { .. }
            | ApiCallFailure::Request(_)
            | ApiCallFailure::Encode(_)
            | ApiCallFailure::TooLarge { .. }
            | ApiCallFailure::InvalidJson { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests;
