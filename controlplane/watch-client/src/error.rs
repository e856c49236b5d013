//! The one error type of the watch client.

use std::path::PathBuf;
use std::time::Duration;

/// Why a LIST or WATCH attempt (or building the client) failed.
///
/// The reflector loop never ends on an error: [`WatchError::needs_relist`] errors start a new
/// LIST at once, [`WatchError::retryable`] ones are retried after a backoff with the last
/// snapshot kept, and the rest can only come out of [`crate::WatchClient::new`].
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The configuration cannot work (bad URL, unreadable CA or client certificate).
    #[error("watch client configuration: {0}")]
    Config(String),
    /// The bearer token file could not be read (it may be mid-rotation: retried).
    #[error("cannot read the bearer token {path}: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// TCP connect failed or timed out.
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: String, reason: String },
    /// The TLS handshake failed (wrong CA, wrong name, refused client certificate).
    #[error("TLS handshake with {address}: {source}")]
    Tls {
        address: String,
        #[source]
        source: std::io::Error,
    },
    /// HTTP failed below the response (connection reset, malformed response, body error).
    #[error("HTTP: {0}")]
    Http(String),
    /// A request or a body took longer than allowed.
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// The resourceVersion or continue token is too old (HTTP 410, or an ERROR event with a
    /// 410 Status): the cache must be rebuilt from a new LIST.
    #[error("resource version expired: {0}")]
    Expired(String),
    /// The server answered with an error status other than 410.
    #[error("server answered {status}: {message}")]
    Status { status: u16, message: String },
    /// A watch line or a list body is larger than the configured bound.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge { what: &'static str, limit: usize },
    /// The server sent something that is not a list document or a watch event.
    #[error("protocol: {0}")]
    Protocol(String),
    /// Code of this crate panicked while handling the server's data (caught; the cache is
    /// rebuilt from a new LIST).
    #[error("panic while handling the server's data: {0}")]
    Panic(String),
}

impl WatchError {
    /// Whether trying again later (after a backoff) may succeed. Configuration errors are not:
    /// they need a new config.
    pub fn retryable(&self) -> bool {
        !matches!(self, Self::Config(_))
    }

    /// Whether the next request to the same server would most likely fail the same way,
    /// whatever object it is for: the server asked to slow down (429) or failed (5xx), refused
    /// the credentials (401), or could not be reached. A caller working through many objects
    /// stops at such an error and tries the rest later, instead of sending each into the same
    /// refusal. An answer about one object (404 for a deleted one, 403, 409, 422) is not.
    pub fn refuses_every_request(&self) -> bool {
        match self {
            Self::Status { status, .. } => matches!(*status, 401 | 429) || *status >= 500,
            Self::Token { .. }
            | Self::Connect { .. }
            | Self::Tls { .. }
            | Self::Http(_)
            | Self::Timeout { .. } => true,
            Self::Config(_)
            | Self::Expired(_)
            | Self::TooLarge { .. }
            | Self::Protocol(_)
            | Self::Panic(_) => false,
        }
    }

    /// Whether the cache must be rebuilt from a new LIST rather than resuming the watch.
    pub fn needs_relist(&self) -> bool {
        matches!(self, Self::Expired(_) | Self::Panic(_))
    }

    /// A short, fixed name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::Token { .. } => "token",
            Self::Connect { .. } => "connect",
            Self::Tls { .. } => "tls",
            Self::Http(_) => "http",
            Self::Timeout { .. } => "timeout",
            Self::Expired(_) => "expired",
            Self::Status { .. } => "status",
            Self::TooLarge { .. } => "too_large",
            Self::Protocol(_) => "protocol",
            Self::Panic(_) => "panic",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_config_errors_are_final() {
        assert!(!WatchError::Config("x".into()).retryable());
        assert!(WatchError::Expired("x".into()).retryable());
        assert!(WatchError::Expired("x".into()).needs_relist());
        let status = WatchError::Status {
            status: 403,
            message: "forbidden".into(),
        };
        assert!(status.retryable() && !status.needs_relist());
        assert_eq!(status.kind(), "status");
    }

    #[test]
    fn throttling_and_unreachable_servers_refuse_every_request_object_answers_do_not() {
        let status = |status| WatchError::Status {
            status,
            message: String::new(),
        };
        for every in [status(429), status(401), status(500), status(503)] {
            assert!(every.refuses_every_request(), "{every}");
        }
        let connect = WatchError::Connect {
            address: "127.0.0.1:1".into(),
            reason: "refused".into(),
        };
        assert!(connect.refuses_every_request());
        for one in [status(404), status(403), status(409), status(422)] {
            assert!(!one.refuses_every_request(), "{one}");
        }
    }
}
