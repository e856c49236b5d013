use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use monoio::net::TcpStream;

use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Data listeners pause accepting while the process is overloaded; the dedicated (admin)
    /// listener never does, so `/metrics` and `/readyz` still answer.
    pub(crate) overload_gated: bool,
}

/// Per-connection view handed to a handler.
#[derive(Debug, Clone)]
pub struct ConnectionContext {
    pub peer: SocketAddr,
    pub(crate) shared: Rc<ListenerShared>,
    /// When this connection is asked to go away (`max_connection_age`, spread).
    pub(crate) retirement: Rc<Retirement>,
}

/// A connection's end as its own serve loop decides it (process drain, or retirement by age),
/// for the work that lives on the connection: an agent's parked tunnels wait on it. A handle
/// (`Send`, cheap to clone) because a tunnel parked by one core may be claimed by a call on
/// another and given back there. The serve loop fires it once; until then waiting costs one
/// listener on this connection's own event, never on a process-wide one.
#[derive(Debug, Clone, Default)]
pub struct Closing(Arc<ClosingInner>);

#[derive(Debug, Default)]
struct ClosingInner {
    fired: AtomicBool,
    event: Event,
}

impl Closing {
    /// Fired by the connection's serve loop (and by tests of what waits on it).
    pub fn fire(&self) {
        self.0.fired.store(true, Ordering::Release);
        self.0.event.notify(usize::MAX);
    }

    pub fn is_fired(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// Whether both handles belong to the same connection.
    pub fn is_same(&self, other: &Closing) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Resolves once the connection's serve loop starts closing it.
    pub async fn wait(&self) {
        while !self.is_fired() {
            // On the future's own state rather than boxed: a node parks every tunnel it gives
            // back here, one per call.
            event_listener::listener!(self.0.event => listener);
            if self.is_fired() {
                return;
            }
            listener.await;
        }
    }
}

/// When a connection is retired by age, and the signal its serve loop fires then.
#[derive(Debug, Default)]
pub(crate) struct Retirement {
    pub(crate) at: Option<Instant>,
    closing: Closing,
}

impl Retirement {
    pub(crate) fn at(at: Option<Instant>) -> Self {
        Self {
            at,
            closing: Closing::default(),
        }
    }

    fn fire(&self) {
        self.closing.fire();
    }

    fn is_fired(&self) -> bool {
        self.closing.is_fired()
    }

    async fn wait(&self) {
        self.closing.wait().await;
    }
}

/// Counts requests served on one connection's listener and worker (`sluice_worker_requests`).
#[derive(Clone)]
pub struct RequestCounter {
    shared: Rc<ListenerShared>,
}

impl RequestCounter {
    pub fn served(&self) {
        self.shared.stats.requests.inc(self.shared.worker);
    }
}

impl std::fmt::Debug for RequestCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestCounter")
            .field("listener", &self.shared.name)
            .finish()
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

    /// A handle that counts requests of this connection from the tasks serving them.
    pub fn request_counter(&self) -> RequestCounter {
        RequestCounter {
            shared: self.shared.clone(),
        }
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
        self.shared.stop.is_fired() || self.retirement.is_fired()
    }

    /// Resolves when this listener starts draining, or when the connection reached its
    /// `max_connection_age` (as its serve loop saw it).
    pub async fn draining(&self) {
        monoio::select! {
            () = self.shared.stop.wait() => {}
            () = self.retirement.wait() => {}
        }
    }

    /// The signal this connection's serve loop fires when it starts closing the connection
    /// (drain or age), to hand to work that lives on the connection. Only for connections
    /// whose serve loop awaits [`Self::connection_draining`] or [`Self::process_draining`].
    pub fn closing(&self) -> Closing {
        self.retirement.closing.clone()
    }

    /// When this connection is to be retired (`max_connection_age`, spread), for serve loops
    /// that keep their own timer and call [`Self::retire`] then.
    pub fn retire_at(&self) -> Option<Instant> {
        self.retirement.at
    }

    /// Retires the connection by age: counted once as `max_age`, and its tasks waiting in
    /// [`Self::closing`] are woken.
    pub fn retire(&self) {
        if !self.retirement.is_fired() {
            self.closed_by(CloseReason::MaxAge);
        }
        self.retirement.fire();
    }

    /// For a serve loop that retires the connection itself ([`Self::retire_at`]): resolves
    /// when the process starts draining, and wakes the connection's tasks waiting in
    /// [`Self::closing`].
    pub async fn process_draining(&self) {
        self.shared.stop.wait().await;
        self.retirement.fire();
    }

    /// The connection's own serve loop (the one place that sends GOAWAY) waits here: for the
    /// process drain or the connection's `max_connection_age`, counted once as `max_age`. Either
    /// way it wakes the connection's tasks waiting in [`Self::closing`].
    pub async fn connection_draining(&self) {
        match self.retirement.at {
            None => self.shared.stop.wait().await,
            Some(at) => monoio::select! {
                () = self.shared.stop.wait() => {}
                () = monoio::time::sleep_until(at) => self.closed_by(CloseReason::MaxAge),
            },
        }
        self.retirement.fire();
    }
}
