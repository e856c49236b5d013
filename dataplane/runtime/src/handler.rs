use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use monoio::net::TcpStream;

use crate::{Driver, Lifecycle, ListenerStats, StopSignal};

/// What a handler factory knows about the worker it builds a handler for.
#[derive(Debug, Clone)]
pub struct WorkerContext {
    /// Index of the worker within its group (0-based); the slot it writes in per-core metrics.
    pub index: usize,
    pub driver: Driver,
}

/// Serves the connections of one listener on one worker. Built once per worker by a
/// [`HandlerFactory`], so per-core state (pools, caches, buffers) lives here unshared.
pub trait ConnectionHandler: 'static {
    /// Serves one accepted connection to its end. The future runs on the worker's thread and
    /// need not be `Send`.
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>>;
}

/// Builds a [`ConnectionHandler`] on each worker thread.
pub trait HandlerFactory: Send + Sync + 'static {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler>;
}

/// Work that is not driven by a listener (the agent's tunnel pool, for example). Runs on data
/// worker 0 from start-up; `stop` fires when the process starts draining, and the task gets the
/// drain timeout to finish.
pub trait BackgroundTask: Send + Sync + 'static {
    fn run(
        &self,
        worker: &WorkerContext,
        stop: Arc<StopSignal>,
    ) -> Pin<Box<dyn Future<Output = ()>>>;
}

/// State shared by every connection of one listener on one worker.
#[derive(Debug)]
pub(crate) struct ListenerShared {
    pub(crate) name: Arc<str>,
    pub(crate) worker: usize,
    pub(crate) stats: ListenerStats,
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// Fires when this listener's group starts draining.
    pub(crate) stop: Arc<StopSignal>,
}

/// Per-connection view handed to a handler.
#[derive(Debug, Clone)]
pub struct ConnectionContext {
    pub peer: SocketAddr,
    pub(crate) shared: Rc<ListenerShared>,
}

impl ConnectionContext {
    /// Name of the listener (its config key).
    pub fn listener(&self) -> &str {
        &self.shared.name
    }

    /// Worker index, for per-core metrics.
    pub fn worker(&self) -> usize {
        self.shared.worker
    }

    /// Counts one request served (per core, summed at scrape).
    pub fn request_served(&self) {
        self.shared.stats.requests.inc(self.shared.worker);
    }

    pub fn lifecycle(&self) -> &Lifecycle {
        &self.shared.lifecycle
    }

    /// True once this listener stopped accepting: finish the current request, then close.
    pub fn is_draining(&self) -> bool {
        self.shared.stop.is_fired()
    }

    /// Resolves when this listener starts draining; idle connections await it to close early.
    pub async fn draining(&self) {
        self.shared.stop.wait().await;
    }
}
