//! One worker thread: builds its monoio runtime, accepts on its own sockets, serves connections,
//! drains on stop.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use event_listener::Event;
use futures_util::FutureExt;
use monoio::net::TcpListener;

use crate::driver::build_runtime;
use crate::handler::{ListenerShared, Retirement};
use crate::limits::{retirement_age, PeerCounts, PeerSlot};
use crate::task::{contain, panic_message, spawn_contained};
use crate::CloseReason;
use crate::{
    ConnectionContext, Driver, HandlerFactory, Lifecycle, ListenerStats, StopSignal, WorkerContext,
};

/// Counts open connections and wakes waiters when the count drops.
#[derive(Debug, Default)]
struct ConnectionCount {
    open: Cell<usize>,
    dropped: Event,
}

impl ConnectionCount {
    async fn wait_below(&self, limit: usize) {
        while self.open.get() >= limit {
            let listener = self.dropped.listen();
            if self.open.get() < limit {
                return;
            }
            listener.await;
        }
    }
}

/// Takes the connection's place in its source IP's count, or refuses it (counted as
/// `per_ip_limit`) when the listener caps connections per IP and this one is over.
fn admit_peer(shared: &ListenerShared, peer: std::net::SocketAddr) -> Option<Option<PeerSlot>> {
    let (Some(counts), Some(cap)) = (&shared.per_ip, shared.limits.max_connections_per_ip) else {
        return Some(None);
    };
    let slot = counts.enter(peer.ip(), cap);
    if slot.is_none() {
        shared.stats.closed[CloseReason::PerIpLimit.index()].inc(shared.worker);
        tracing::debug!(listener = %shared.name, %peer, cap, "connection refused: per-IP connection cap");
        return None;
    }
    Some(slot)
}

/// Held by a connection task; closing the connection (or dropping the task at abort) releases it.
struct ConnectionGuard {
    worker: Rc<ConnectionCount>,
    listener: Rc<ConnectionCount>,
    shared: Rc<ListenerShared>,
    /// The connection's place in its IP's count (with a per-IP cap).
    _peer: Option<PeerSlot>,
}

impl ConnectionGuard {
    fn enter(
        worker: &Rc<ConnectionCount>,
        listener: &Rc<ConnectionCount>,
        shared: &Rc<ListenerShared>,
        peer: Option<PeerSlot>,
    ) -> Self {
        for count in [worker, listener] {
            count.open.set(count.open.get() + 1);
        }
        shared.stats.active.inc(shared.worker);
        Self {
            worker: worker.clone(),
            listener: listener.clone(),
            shared: shared.clone(),
            _peer: peer,
        }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        for count in [&self.worker, &self.listener] {
            count.open.set(count.open.get().saturating_sub(1));
            count.dropped.notify(usize::MAX);
        }
        self.shared.stats.active.dec(self.shared.worker);
    }
}

/// A listener as handed to a worker thread.
pub(crate) struct WorkerListener {
    pub(crate) name: Arc<str>,
    pub(crate) socket: std::net::TcpListener,
    pub(crate) factory: Arc<dyn HandlerFactory>,
    pub(crate) stats: ListenerStats,
    pub(crate) max_connections: usize,
    pub(crate) limits: sluice_config::ConnectionLimits,
    pub(crate) per_ip: Option<Arc<PeerCounts>>,
    pub(crate) overload_gated: bool,
}

pub(crate) struct WorkerSpec {
    pub(crate) thread_name: String,
    pub(crate) index: usize,
    pub(crate) driver: Driver,
    pub(crate) uring_entries: u32,
    pub(crate) listeners: Vec<WorkerListener>,
    pub(crate) background: Vec<Arc<dyn crate::BackgroundTask>>,
    pub(crate) lifecycle: Arc<Lifecycle>,
    pub(crate) stop: Arc<StopSignal>,
    pub(crate) drain_timeout: Duration,
    pub(crate) started: Sender<(String, Result<(), String>)>,
}

/// Runs on the worker thread until the worker has drained. Returns how many connections were
/// still open when the drain deadline (or an abort) cut them.
pub(crate) fn run(spec: WorkerSpec) -> usize {
    let mut runtime = match build_runtime(spec.driver, spec.uring_entries) {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = spec
                .started
                .send((spec.thread_name, Err(error.to_string())));
            return 0;
        }
    };
    runtime.block_on(serve(spec))
}

async fn serve(spec: WorkerSpec) -> usize {
    let worker = WorkerContext {
        index: spec.index,
        driver: spec.driver,
    };
    let open = Rc::new(ConnectionCount::default());
    let cut_signal = Arc::new(StopSignal::new());
    let mut accept_loops = Vec::with_capacity(spec.listeners.len());
    let listener_stats: Vec<(Arc<str>, ListenerStats)> = spec
        .listeners
        .iter()
        .map(|listener| (listener.name.clone(), listener.stats.clone()))
        .collect();
    // Which listeners still hold connections on this worker, for the drain log.
    let open_by_listener = || {
        listener_stats
            .iter()
            .filter(|(_, stats)| stats.active.get(spec.index) > 0)
            .map(|(name, stats)| format!("{name}={}", stats.active.get(spec.index)))
            .collect::<Vec<_>>()
            .join(",")
    };
    for listener in spec.listeners {
        let socket = match TcpListener::from_std(listener.socket) {
            Ok(socket) => socket,
            Err(error) => {
                let reason = format!(
                    "cannot register listener {} with the runtime: {error}",
                    listener.name
                );
                let _ = spec.started.send((spec.thread_name, Err(reason)));
                return 0;
            }
        };
        let shared = Rc::new(ListenerShared {
            name: listener.name,
            worker: spec.index,
            stats: listener.stats,
            lifecycle: spec.lifecycle.clone(),
            stop: spec.stop.clone(),
            limits: listener.limits,
            per_ip: listener.per_ip,
            overload_gated: listener.overload_gated,
        });
        let handler = listener.factory.create(&worker);
        accept_loops.push(spawn_essential(
            "accept-loop",
            spec.lifecycle.clone(),
            accept_loop(
                socket,
                handler,
                shared,
                open.clone(),
                cut_signal.clone(),
                listener.max_connections,
            ),
        ));
    }
    let background: Vec<_> = spec
        .background
        .iter()
        .map(|task| {
            spawn_essential(
                "background",
                spec.lifecycle.clone(),
                task.run(&worker, spec.stop.clone()),
            )
        })
        .collect();
    let _ = spec.started.send((spec.thread_name.clone(), Ok(())));
    spec.stop.wait().await;
    for accept_loop in accept_loops {
        accept_loop.await;
    }
    // Listeners are closed now (each accept loop dropped its socket): new connections are
    // refused by the kernel while in-flight ones finish.
    let deadline = monoio::time::Instant::now() + spec.drain_timeout;
    if open.open.get() > 0 {
        tracing::info!(worker = %spec.thread_name, open = %open_by_listener(), "draining connections");
    }
    let finished = async {
        open.wait_below(1).await;
        for task in background {
            task.await;
        }
    };
    let cut = monoio::select! {
        _ = finished => 0,
        _ = monoio::time::sleep_until(deadline) => {
            let cut = open.open.get();
            tracing::warn!(worker = %spec.thread_name, cut, open = %open_by_listener(), timeout = ?spec.drain_timeout, "drain deadline passed; closing remaining connections");
            cut
        }
        _ = spec.lifecycle.abort.wait() => {
            let cut = open.open.get();
            tracing::warn!(worker = %spec.thread_name, cut, open = %open_by_listener(), "stop forced; closing remaining connections");
            cut
        }
    };
    if cut > 0 {
        // monoio does not drop the tasks of a dropped runtime, so connections are closed here:
        // each connection task ends its handler future (closing the socket) when `cut` fires.
        cut_signal.fire();
        let _ = monoio::time::timeout(Duration::from_secs(1), open.wait_below(1)).await;
    }
    // With io_uring a dropped socket is closed by a queued close operation; park the ring once
    // more so sockets closed in the last moments (client connections of background tasks, for
    // example) are really closed before the runtime goes away, or their peers would wait.
    monoio::time::sleep(Duration::from_millis(5)).await;
    cut
}

async fn accept_loop(
    socket: TcpListener,
    handler: Rc<dyn crate::ConnectionHandler>,
    shared: Rc<ListenerShared>,
    worker_open: Rc<ConnectionCount>,
    cut: Arc<StopSignal>,
    max_connections: usize,
) {
    let listener_open = Rc::new(ConnectionCount::default());
    let worker = shared.worker;
    loop {
        if listener_open.open.get() >= max_connections {
            monoio::select! {
                _ = listener_open.wait_below(max_connections) => {}
                _ = shared.stop.wait() => break,
            }
        }
        if shared.overload_gated && sluice_overload::stop_accepting() {
            // New connections wait in the kernel's backlog (and time out there if pressure
            // lasts) instead of taking descriptors and memory the admitted work needs.
            monoio::select! {
                _ = overload_clears() => {}
                _ = shared.stop.wait() => break,
            }
        }
        let accepted = monoio::select! {
            _ = shared.stop.wait() => break,
            accepted = socket.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                shared.stats.accepted.inc(worker);
                let Some(peer_slot) = admit_peer(&shared, peer) else {
                    drop(stream);
                    continue;
                };
                // Proxied traffic is latency-bound; Nagle only delays small frames.
                let _ = stream.set_nodelay(true);
                let guard =
                    ConnectionGuard::enter(&worker_open, &listener_open, &shared, peer_slot);
                let conn = ConnectionContext {
                    peer,
                    shared: shared.clone(),
                    retirement: Rc::new(Retirement::at(shared.limits.max_connection_age.map(
                        |age| {
                            let spread = monoio::utils::thread_rng_n(1001);
                            monoio::time::Instant::now() + retirement_age(age, spread)
                        },
                    ))),
                };
                // A handler that panics before it returns its future is contained as well.
                let served = match std::panic::catch_unwind(AssertUnwindSafe(|| {
                    handler.clone().handle(stream, conn)
                })) {
                    Ok(served) => served,
                    Err(payload) => {
                        shared.stats.panics.inc(worker);
                        tracing::error!(listener = %shared.name, %peer, panic = %panic_message(payload.as_ref()), "connection handler panicked; connection closed");
                        drop(guard);
                        continue;
                    }
                };
                let cut = cut.clone();
                spawn_contained("connection", async move {
                    let guard = guard;
                    monoio::select! {
                        outcome = AssertUnwindSafe(served).catch_unwind() => {
                            if let Err(payload) = outcome {
                                guard.shared.stats.panics.inc(guard.shared.worker);
                                tracing::error!(listener = %guard.shared.name, %peer, panic = %panic_message(payload.as_ref()), "connection handler panicked; connection closed");
                            }
                        }
                        _ = cut.wait() => {}
                    }
                });
            }
            Err(error) => {
                shared.stats.accept_errors.inc(worker);
                match error.raw_os_error() {
                    // Out of descriptors or memory: back off instead of spinning on the error.
                    Some(errno) if is_resource_exhaustion(errno) => {
                        tracing::warn!(listener = %shared.name, %error, "accept failed; pausing 100ms");
                        monoio::time::sleep(Duration::from_millis(100)).await;
                    }
                    _ => tracing::debug!(listener = %shared.name, %error, "accept failed"),
                }
            }
        }
    }
    drop(socket);
    tracing::debug!(listener = %shared.name, worker, "listener closed");
}

/// Returns once the overload monitor lets listeners accept again. Polled: the monitor samples
/// every few hundred milliseconds anyway, and a paused accept loop costs one timer per period.
async fn overload_clears() {
    while sluice_overload::stop_accepting() {
        monoio::time::sleep(OVERLOAD_POLL).await;
    }
}

const OVERLOAD_POLL: Duration = Duration::from_millis(50);

/// Spawns one of the worker's own tasks (accept loops, background tasks): its panic is caught
/// and counted like any task's, but a worker without it is half-dead, so the process fails
/// ([`Lifecycle::fail`]: `/readyz` answers 503 and the process stops).
fn spawn_essential(
    task: &'static str,
    lifecycle: Arc<Lifecycle>,
    future: impl std::future::Future<Output = ()> + 'static,
) -> monoio::task::JoinHandle<Option<()>> {
    spawn_contained(task, async move {
        if contain(task, future).await.is_none() {
            lifecycle.fail(&format!("a worker's {task} task panicked"));
        }
    })
}

fn is_resource_exhaustion(errno: i32) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM on Linux.
    matches!(errno, 24 | 23 | 105 | 12)
}
