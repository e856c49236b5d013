//! Why an upgrade's HTTP/1.1 head could not be read: a leaf below `head.rs` (which reads heads)
//! and `error.rs` (whose `UpstreamFailure::UpgradeRelay` carries it), so that neither imports
//! the other's callers.

use std::io;

use http::header::HeaderName;

/// Largest request or response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeHeadError {
    #[error("connection closed before a complete head")]
    Closed,
    #[error("head larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed head: {0}")]
    Syntax(#[from] httparse::Error),
    #[error("malformed head: incomplete")]
    Incomplete,
    #[error("malformed head: method")]
    Method,
    #[error("malformed head: request target")]
    Target,
    #[error("malformed head: header name {0:?}")]
    HeaderName(Box<str>),
    #[error("malformed head: value of {0}")]
    HeaderValue(HeaderName),
    #[error("malformed head: status")]
    Status,
    #[error(transparent)]
    Io(#[from] io::Error),
}
