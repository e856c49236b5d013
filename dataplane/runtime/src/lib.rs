//! Sluice's thread-per-core data-plane runtime.
//!
//! One monoio runtime per worker thread, each with its own `SO_REUSEPORT` socket per listener so
//! the kernel spreads connections across cores and no accept lock is shared. Per-core state stays
//! on its core; the only cross-thread traffic is the stop signal and the scrape of per-core
//! counters. The io_uring driver is used when it can be set up, otherwise epoll (monoio's legacy
//! driver); the choice is made once at start-up and reported.
//!
//! Lifecycle: bind every listener (so a busy port fails start-up before anything runs), start the
//! workers, report ready; on a stop signal flip to draining, close the listeners (new connections
//! are refused), let in-flight connections finish up to the drain deadline, then stop the
//! dedicated (admin) listeners last so `/readyz` can say "draining" throughout.

mod driver;
mod error;
mod handler;
mod lifecycle;
mod limits;
mod listener;
mod server;
mod signals;
mod stats;
mod task;
mod worker;

pub use driver::{select_driver, Driver, DriverSelection};
pub use error::RuntimeError;
pub use handler::{
    BackgroundTask, Closing, ConnectionContext, ConnectionHandler, HandlerFactory, RequestCounter,
    WorkerContext,
};
pub use lifecycle::{Lifecycle, Phase, StopSignal};
pub use limits::CloseReason;
pub use listener::{ListenerId, Placement};
pub use server::{RunningServer, RuntimeOptions, ServerBuilder, ShutdownReport};
pub use signals::StopSignals;
pub use sluice_config::ConnectionLimits;
pub use stats::ListenerStats;
pub use task::{
    contain, panic_message, spawn_contained, task_panics, task_panics_of, TASK_PANICS_LABEL,
};

/// Re-exported so handlers name the same stream type the runtime accepts.
pub use monoio::net::TcpStream;
