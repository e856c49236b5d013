//! The tunnel's one error type: which side failed, the gRPC code the client gets, whether the
//! call may still be routed elsewhere, and the message.
//!
//! Control flow decides on [`ErrorKind`], never on the message; the message is for people.

use std::borrow::Cow;

use sluice_grpc::Code;

/// Who caused a call to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The caller: the gRPC client on a node, the node relaying the client's call on an agent.
    Client,
    /// The agent or its tunnel.
    Agent,
    /// Another node, asked to serve the call through its own tunnels.
    PeerNode,
    /// The agent's local gRPC backend.
    Backend,
    /// The node itself (no tunnel in time, shutting down, its locator unreachable) or, seen from
    /// an agent, the node that sent the call.
    Node,
}

/// What went wrong; each kind fixes the side, the default gRPC code and whether a retry is
/// allowed before anything was sent to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client reset the call or went away: there is nobody to answer.
    ClientGone,
    /// The client's request is not valid gRPC framing (too large, truncated...).
    ClientProtocol,
    /// The client's call is malformed (missing or bad metadata).
    BadRequest,
    /// The caller is over its share of a node resource (an agent's connections or tunnels, the
    /// calls waiting for one agent): RESOURCE_EXHAUSTED, never retried by the node, since the
    /// same call would be over it again at once (the client may retry later).
    OverShare,
    /// The client's (or agent's, or node's) credentials were refused.
    Unauthenticated,
    /// The endpoint does not serve the method.
    Unimplemented,
    /// The caller may not call the method here: the Kubernetes API method on the external
    /// endpoint, which only the gateway of a node may open (it speaks for a user).
    PermissionDenied,
    /// No tunnel of the agent became free in time.
    NoTunnel,
    /// The call's own deadline passed.
    DeadlineExceeded,
    /// A tunnel broke before the call used it: another tunnel may serve the call.
    StaleTunnel,
    /// The agent or its tunnel went away in the middle of the call.
    AgentGone,
    /// The agent broke the tunnel protocol.
    AgentProtocol,
    /// No candidate node could take the call (each answered without a tunnel, or failed):
    /// routing may try again.
    PeerUnavailable,
    /// The node serving the call went away in the middle of it.
    PeerGone,
    /// The node's agent locator (Redis) did not answer.
    LocatorUnavailable,
    /// The node is shutting down.
    ShuttingDown,
    /// The node is near its memory or descriptor limit and sheds new calls (calls already
    /// admitted go on): UNAVAILABLE, which gRPC clients retry, on this node later or another.
    Overloaded,
    /// The agent cannot reach its backend, or the backend failed the call.
    BackendUnavailable,
    /// Seen from an agent: the node closed or reset the tunnel (its client went away).
    NodeGone,
    /// Seen from an agent: the node broke the tunnel protocol.
    NodeProtocol,
}

impl ErrorKind {
    pub fn side(self) -> Side {
        use ErrorKind::*;
        match self {
            ClientGone | ClientProtocol | BadRequest | OverShare | Unauthenticated
            | Unimplemented | PermissionDenied | DeadlineExceeded => Side::Client,
            StaleTunnel | AgentGone | AgentProtocol => Side::Agent,
            PeerUnavailable | PeerGone => Side::PeerNode,
            BackendUnavailable => Side::Backend,
            NoTunnel | LocatorUnavailable | ShuttingDown | Overloaded | NodeGone | NodeProtocol => {
                Side::Node
            }
        }
    }

    /// The gRPC code the client gets unless the error carries its own.
    pub fn code(self) -> Code {
        use ErrorKind::*;
        match self {
            ClientGone | NodeGone => Code::Cancelled,
            ClientProtocol | BadRequest => Code::InvalidArgument,
            OverShare => Code::ResourceExhausted,
            Unauthenticated => Code::Unauthenticated,
            Unimplemented => Code::Unimplemented,
            PermissionDenied => Code::PermissionDenied,
            NoTunnel | DeadlineExceeded => Code::DeadlineExceeded,
            AgentProtocol | NodeProtocol => Code::Internal,
            StaleTunnel | AgentGone | PeerUnavailable | PeerGone | LocatorUnavailable
            | ShuttingDown | Overloaded | BackendUnavailable => Code::Unavailable,
        }
    }

    /// Whether the call may be routed again, provided nothing was sent to the client yet.
    pub fn retry_before_reply(self) -> bool {
        matches!(self, ErrorKind::StaleTunnel | ErrorKind::PeerUnavailable)
    }

    /// Whether the failure is a protocol violation (counted in `protocol_errors`).
    pub fn is_protocol_violation(self) -> bool {
        matches!(
            self,
            ErrorKind::ClientProtocol | ErrorKind::AgentProtocol | ErrorKind::NodeProtocol
        )
    }
}

/// A failed tunnel call or tunnel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TunnelError {
    kind: ErrorKind,
    code: Code,
    message: Cow<'static, str>,
}

impl TunnelError {
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            code: kind.code(),
            message: message.into(),
        }
    }

    /// The client went away: no message, nobody reads it.
    pub fn client_gone() -> Self {
        Self::new(ErrorKind::ClientGone, "")
    }

    /// Overrides the kind's gRPC code (a framing error knows its own code).
    pub fn with_code(mut self, code: Code) -> Self {
        self.code = code;
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn side(&self) -> Side {
        self.kind.side()
    }

    /// The status the client gets, and the label the call is counted under.
    pub fn code(&self) -> Code {
        self.code
    }

    pub fn retry_before_reply(&self) -> bool {
        self.kind.retry_before_reply()
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_fix_side_code_and_retry() {
        let stale = TunnelError::new(ErrorKind::StaleTunnel, "broke while idle");
        assert_eq!(stale.side(), Side::Agent);
        assert_eq!(stale.code(), Code::Unavailable);
        assert!(stale.retry_before_reply());
        let gone = TunnelError::new(ErrorKind::AgentGone, "reset");
        assert!(!gone.retry_before_reply());
        assert!(TunnelError::new(ErrorKind::PeerUnavailable, "x").retry_before_reply());
        assert_eq!(
            TunnelError::new(ErrorKind::ClientProtocol, "too big")
                .with_code(Code::ResourceExhausted)
                .code(),
            Code::ResourceExhausted
        );
        assert_eq!(ErrorKind::NodeGone.side(), Side::Node);
        let over = TunnelError::new(ErrorKind::OverShare, "too many tunnels");
        assert_eq!(over.code(), Code::ResourceExhausted);
        assert!(!over.retry_before_reply());
        assert!(ErrorKind::AgentProtocol.is_protocol_violation());
        assert_eq!(gone.to_string(), "reset");
        let shed = TunnelError::new(ErrorKind::Overloaded, "overloaded");
        assert_eq!((shed.side(), shed.code()), (Side::Node, Code::Unavailable));
        assert!(
            !shed.retry_before_reply(),
            "routing elsewhere would not relieve this node"
        );
    }
}
