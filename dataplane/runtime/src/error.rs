use std::io;
use std::net::SocketAddr;

use crate::Driver;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot bind listener {listener} to {address}: {source}")]
    Bind {
        listener: String,
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("io_uring is required (driver: uring) but cannot be set up: {0}")]
    UringRequired(#[source] io::Error),
    #[error("cannot create a monoio runtime with the {driver} driver: {source}")]
    Build {
        driver: Driver,
        #[source]
        source: io::Error,
    },
    #[error("cannot spawn thread {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("worker {thread} failed to start: {reason}")]
    WorkerStart { thread: String, reason: String },
    #[error("listener {0} was declared but no handler was attached")]
    NoHandler(String),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] io::Error),
}
