//! Why a request to an agent server failed before its answer's head reached the client.

use http::StatusCode;
use sluice_grpc::Code;
use sluice_kube_tunnel::{AssertionError, CodecError};

/// The gateway's link to the tunnel node of its process could not be opened or used. (Here,
/// not in `via_agent`, so the error type sits below every module that uses it.)
#[derive(Debug, Clone, thiserror::Error)]
#[error("the link to this process's tunnel node failed: {0}")]
pub struct LinkFailure(pub String);

/// The step of the tunnel path that failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentFailure {
    /// The gateway has no tunnel node in its process or no assertion key (a config the loader
    /// refuses for a clusters directory; clusters pushed by the control plane can still ask).
    #[error("this gateway cannot reach agents: it needs a tunnel node in its own process (a `tunnel` section) and gateway.agent_assertion_key_file")]
    NoPath,
    #[error("cannot sign the user's assertion: {0}")]
    Sign(#[source] AssertionError),
    #[error(transparent)]
    Link(LinkFailure),
    #[error("the call could not be sent: {0}")]
    Send(#[source] h2::Error),
    #[error("the call failed before its answer: {0}")]
    Response(#[source] h2::Error),
    /// No tunnel of the agent within the tunnel's wait (UNAVAILABLE or DEADLINE_EXCEEDED from
    /// the node): the agent is not connected to any node.
    #[error("the agent is not connected to any node (waited up to tunnel.max_wait): {message}")]
    NotConnected { message: String },
    /// The agent is at its in-flight bound, or its node at its bound of calls waiting for
    /// the agent (RESOURCE_EXHAUSTED; the message says which).
    #[error("the agent cannot take more requests now: {message}")]
    Busy { message: String },
    /// The agent refused the call (a bad assertion, no `kubernetes_api` section, a malformed
    /// exchange), or the apiserver behind it was unreachable.
    #[error("the agent answered {}: {message}", code.name())]
    Refused { code: Code, message: String },
    /// The agent's answer broke the exchange's framing or order.
    #[error("the agent's answer is malformed: {0}")]
    Protocol(String),
}

impl From<CodecError> for AgentFailure {
    fn from(error: CodecError) -> Self {
        Self::Protocol(error.to_string())
    }
}

impl AgentFailure {
    /// A gRPC status the call ended with before the answer's head.
    pub fn from_status(code: Code, message: String) -> Self {
        match code {
            Code::Unavailable | Code::DeadlineExceeded => Self::NotConnected { message },
            Code::ResourceExhausted => Self::Busy { message },
            code => Self::Refused { code, message },
        }
    }

    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::NoPath | Self::Sign(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NotConnected { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Link(_)
            | Self::Send(_)
            | Self::Response(_)
            | Self::Refused { .. }
            | Self::Protocol(_) => StatusCode::BAD_GATEWAY,
        }
    }

    pub fn status_reason(&self) -> &'static str {
        match self {
            Self::NoPath | Self::Sign(_) => "InternalError",
            Self::Busy { .. } => "TooManyRequests",
            _ => "ServiceUnavailable",
        }
    }

    /// Whether the client may try again later (and is told when).
    pub fn retry_later(&self) -> bool {
        !matches!(self, Self::NoPath | Self::Sign(_))
    }

    /// The `reason` label of `sluice_gateway_rejected_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NotConnected { .. } => "agent_not_connected",
            Self::Busy { .. } => "agent_busy",
            Self::NoPath | Self::Sign(_) => "internal",
            _ => "upstream_failed",
        }
    }
}
