use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use monoio::net::TcpStream;

use std::cell::Cell;

use event_listener::Event;
use monoio::time::Instant;
use sluice_config::ConnectionLimits;

use crate::limits::PeerCounts;
use crate::{CloseReason, Driver, Lifecycle, ListenerStats, StopSignal};

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
    pub(crate) limits: ConnectionLimits,
    /// Open connections per source IP, shared by the listener's workers (with a per-IP cap).
    pub(crate) per_ip: Option<Arc<PeerCounts>>,
}

/// Per-connection view handed to a handler.
#[derive(Debug, Clone)]
pub struct ConnectionContext {
    pub peer: SocketAddr,
    pub(crate) shared: Rc<ListenerShared>,
    /// When this connection is asked to go away (`max_connection_age`, spread).
    pub(crate) retirement: Rc<Retirement>,
}

/// A connection's retirement by age: one timer, in the connection's own serve loop
/// ([`ConnectionContext::connection_draining`]), which then wakes everything else that waits in
/// [`ConnectionContext::draining`] (idle tunnels, for example) without timers of their own.
#[derive(Debug, Default)]
pub(crate) struct Retirement {
    pub(crate) at: Option<Instant>,
    fired: Cell<bool>,
    event: Event,
}

impl Retirement {
    pub(crate) fn at(at: Option<Instant>) -> Self {
        Self {
            at,
            ..Self::default()
        }
    }

    fn fire(&self) {
        self.fired.set(true);
        self.event.notify(usize::MAX);
    }

    async fn wait(&self) {
        while !self.fired.get() {
            let listener = self.event.listen();
            if self.fired.get() {
                return;
            }
            listener.await;
        }
    }
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

    /// The listener's connection limits (timeouts, keepalive), for the handler to apply.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.shared.limits
    }

    /// Counts a connection the handler closes on one of the limits.
    pub fn closed_by(&self, reason: CloseReason) {
        self.shared.stats.closed[reason.index()].inc(self.shared.worker);
    }

    /// True once this listener stopped accepting or the connection reached its age: finish the
    /// current request, then close.
    pub fn is_draining(&self) -> bool {
        self.shared.stop.is_fired() || self.retirement.fired.get()
    }

    /// Resolves when this listener starts draining, or when the connection reached its
    /// `max_connection_age`: handlers then send GOAWAY and let in-flight requests finish, and
    /// idle tunnels close so agents reconnect.
    pub async fn draining(&self) {
        monoio::select! {
            () = self.shared.stop.wait() => {}
            () = self.retirement.wait() => {}
        }
    }

    /// [`Self::draining`] for the connection's own serve loop (the one place that sends
    /// GOAWAY): a retirement by age is counted here, once per connection.
    pub async fn connection_draining(&self) {
        let Some(at) = self.retirement.at else {
            return self.draining().await;
        };
        monoio::select! {
            () = self.draining() => {}
            () = monoio::time::sleep_until(at) => {
                self.retirement.fire();
                self.closed_by(CloseReason::MaxAge);
            }
        }
    }
}
