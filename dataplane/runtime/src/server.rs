use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use sluice_config::ListenerConfig;

use crate::listener::bind_sockets;
use crate::stats::RuntimeCollector;
use crate::worker::{self, WorkerListener, WorkerSpec};
use crate::{
    DriverSelection, HandlerFactory, Lifecycle, ListenerId, ListenerStats, Phase, Placement,
    RuntimeError, StopSignal,
};

/// How long the dedicated (admin) thread keeps serving after the data plane has drained.
const DEDICATED_DRAIN: Duration = Duration::from_secs(1);

/// Settings of the worker pool, resolved from config and command line.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub workers: usize,
    pub driver: DriverSelection,
    pub uring_entries: u32,
    pub drain_timeout: Duration,
}

struct DeclaredListener {
    name: Arc<str>,
    config: ListenerConfig,
    placement: Placement,
    sockets: Vec<std::net::TcpListener>,
    address: std::net::SocketAddr,
    stats: ListenerStats,
    factory: Option<Arc<dyn HandlerFactory>>,
}

/// Declares listeners (binding them at once), attaches handlers, then starts the threads.
pub struct ServerBuilder {
    options: RuntimeOptions,
    lifecycle: Arc<Lifecycle>,
    listeners: Vec<DeclaredListener>,
    background: Vec<Arc<dyn crate::BackgroundTask>>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("options", &self.options)
            .field("listeners", &self.addresses())
            .finish()
    }
}

impl ServerBuilder {
    pub fn new(options: RuntimeOptions, lifecycle: Arc<Lifecycle>) -> Self {
        Self {
            options: RuntimeOptions {
                workers: options.workers.max(1),
                ..options
            },
            lifecycle,
            listeners: Vec::new(),
            background: Vec::new(),
        }
    }

    /// Runs a task on data worker 0 for the life of the process.
    pub fn spawn_background(&mut self, task: impl crate::BackgroundTask) {
        self.background.push(Arc::new(task));
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// Binds the listener's sockets now, so a bad or busy address stops start-up before any
    /// thread runs.
    pub fn bind(
        &mut self,
        name: &str,
        config: &ListenerConfig,
        placement: Placement,
    ) -> Result<ListenerId, RuntimeError> {
        let count = match placement {
            Placement::Workers => self.options.workers,
            Placement::Dedicated => 1,
        };
        let (address, sockets) = bind_sockets(name, config, count)?;
        self.listeners.push(DeclaredListener {
            name: name.into(),
            config: config.clone(),
            placement,
            sockets,
            address,
            stats: ListenerStats::new(count),
            factory: None,
        });
        Ok(ListenerId(self.listeners.len() - 1))
    }

    /// The bound address (port 0 resolved).
    pub fn local_addr(&self, id: ListenerId) -> std::net::SocketAddr {
        self.listeners[id.0].address
    }

    /// Every listener's name and bound address, in declaration order.
    pub fn addresses(&self) -> Vec<(String, std::net::SocketAddr)> {
        self.listeners
            .iter()
            .map(|listener| (listener.name.to_string(), listener.address))
            .collect()
    }

    pub fn stats(&self, id: ListenerId) -> ListenerStats {
        self.listeners[id.0].stats.clone()
    }

    /// Adds the runtime's connection and request metrics to `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(RuntimeCollector {
            lifecycle: self.lifecycle.clone(),
            workers: self.options.workers,
            listeners: self
                .listeners
                .iter()
                .map(|listener| {
                    (
                        listener.name.to_string(),
                        listener.placement,
                        listener.stats.clone(),
                    )
                })
                .collect(),
        }));
    }

    /// Attaches the handler that serves a listener's connections.
    pub fn serve(&mut self, id: ListenerId, factory: impl HandlerFactory) {
        self.listeners[id.0].factory = Some(Arc::new(factory));
    }

    /// Starts the worker threads and the dedicated thread, waits until each one has built its
    /// runtime and registered its sockets, then marks the process ready.
    pub fn start(self) -> Result<RunningServer, RuntimeError> {
        let ServerBuilder {
            options,
            lifecycle,
            listeners,
            mut background,
        } = self;
        let (per_worker, dedicated) = place_listeners(listeners, options.workers)?;
        let (started_tx, started_rx) = mpsc::channel();
        let spawner = Spawner {
            options: &options,
            lifecycle: &lifecycle,
            started: started_tx,
        };
        let mut threads = Vec::new();
        for (index, listeners) in per_worker.into_iter().enumerate() {
            let background = if index == 0 {
                std::mem::take(&mut background)
            } else {
                Vec::new()
            };
            threads.push(spawner.spawn(
                format!("sluice-worker-{index}"),
                index,
                listeners,
                background,
                lifecycle.drain.clone(),
                options.drain_timeout,
            )?);
        }
        let dedicated_stop = Arc::new(StopSignal::new());
        let dedicated_thread = if dedicated.is_empty() {
            None
        } else {
            Some(spawner.spawn(
                "sluice-admin".to_string(),
                0,
                dedicated,
                Vec::new(),
                dedicated_stop.clone(),
                DEDICATED_DRAIN,
            )?)
        };
        // Only the threads hold senders now: a thread that dies before reporting closes it.
        drop(spawner);

        let running = RunningServer {
            lifecycle: lifecycle.clone(),
            workers: threads,
            dedicated: dedicated_thread,
            dedicated_stop,
        };
        let running = wait_started(running, &started_rx)?;
        lifecycle.set_phase(Phase::Ready);
        Ok(running)
    }
}

/// Hands every declared listener's sockets to the threads that accept on them: one socket per
/// worker for worker listeners, all on the dedicated thread for dedicated ones.
fn place_listeners(
    listeners: Vec<DeclaredListener>,
    workers: usize,
) -> Result<(Vec<Vec<WorkerListener>>, Vec<WorkerListener>), RuntimeError> {
    let mut per_worker: Vec<Vec<WorkerListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut dedicated = Vec::new();
    for listener in listeners {
        let factory = listener
            .factory
            .ok_or_else(|| RuntimeError::NoHandler(listener.name.to_string()))?;
        // One count per listener, shared by its workers: the cap is per node, not per core.
        let per_ip = listener
            .config
            .limits
            .max_connections_per_ip
            .map(|_| Arc::new(crate::limits::PeerCounts::default()));
        let make = |socket| WorkerListener {
            name: listener.name.clone(),
            socket,
            factory: factory.clone(),
            stats: listener.stats.clone(),
            max_connections: listener.config.max_connections_per_worker,
            limits: listener.config.limits.clone(),
            per_ip: per_ip.clone(),
            overload_gated: listener.placement == Placement::Workers,
        };
        match listener.placement {
            Placement::Workers => {
                for (worker, socket) in listener.sockets.into_iter().enumerate() {
                    per_worker[worker].push(make(socket));
                }
            }
            Placement::Dedicated => dedicated.extend(listener.sockets.into_iter().map(make)),
        }
    }
    Ok((per_worker, dedicated))
}

/// Starts threads that report on `started` once their runtime is up (or why it is not).
struct Spawner<'a> {
    options: &'a RuntimeOptions,
    lifecycle: &'a Arc<Lifecycle>,
    started: mpsc::Sender<(String, Result<(), String>)>,
}

impl Spawner<'_> {
    fn spawn(
        &self,
        name: String,
        index: usize,
        listeners: Vec<WorkerListener>,
        background: Vec<Arc<dyn crate::BackgroundTask>>,
        stop: Arc<StopSignal>,
        drain_timeout: Duration,
    ) -> Result<JoinHandle<usize>, RuntimeError> {
        let spec = WorkerSpec {
            thread_name: name.clone(),
            index,
            driver: self.options.driver.driver,
            uring_entries: self.options.uring_entries,
            listeners,
            background,
            lifecycle: self.lifecycle.clone(),
            stop,
            drain_timeout,
            started: self.started.clone(),
        };
        let failure = self.lifecycle.clone();
        let started = spec.started.clone();
        let thread = name.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                // A panic outside any contained task kills the worker's runtime: the
                // process fails (readiness 503, stop) instead of serving half-dead.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker::run(spec))) {
                    Ok(cut) => cut,
                    Err(payload) => {
                        let reason = format!(
                            "worker thread {thread} panicked: {}",
                            crate::task::panic_message(payload.as_ref())
                        );
                        crate::task::count_panic("worker");
                        failure.fail(&reason);
                        let _ = started.send((thread, Err(reason)));
                        0
                    }
                }
            })
            .map_err(|source| RuntimeError::Spawn { name, source })
    }
}

/// Waits for every thread of `running` to report its start; on the first failure stops the
/// ones already running and returns why.
fn wait_started(
    running: RunningServer,
    started: &mpsc::Receiver<(String, Result<(), String>)>,
) -> Result<RunningServer, RuntimeError> {
    let expected = running.workers.len() + usize::from(running.dedicated.is_some());
    for _ in 0..expected {
        match started.recv() {
            Ok((_, Ok(()))) => {}
            Ok((thread, Err(reason))) => {
                running.shutdown();
                return Err(RuntimeError::WorkerStart { thread, reason });
            }
            Err(_) => {
                running.shutdown();
                return Err(RuntimeError::WorkerStart {
                    thread: "unknown".to_string(),
                    reason: "a worker thread exited during start-up".to_string(),
                });
            }
        }
    }
    Ok(running)
}

/// The started server. Dropping it without [`RunningServer::shutdown`] leaves the threads
/// running until the process exits.
#[derive(Debug)]
pub struct RunningServer {
    lifecycle: Arc<Lifecycle>,
    workers: Vec<JoinHandle<usize>>,
    dedicated: Option<JoinHandle<usize>>,
    dedicated_stop: Arc<StopSignal>,
}

/// What a shutdown did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Connections still open at the drain deadline (or at a forced stop), closed unfinished.
    pub connections_cut: usize,
    pub elapsed: Duration,
}

impl RunningServer {
    pub fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.lifecycle
    }

    /// Drains and stops: readiness flips to draining, data-plane listeners close, in-flight
    /// connections get up to the drain timeout, then the dedicated (admin) thread stops.
    pub fn shutdown(self) -> ShutdownReport {
        let began = Instant::now();
        self.lifecycle.set_phase(Phase::Draining);
        self.lifecycle.drain.fire();
        let mut cut = 0;
        for worker in self.workers {
            cut += join(worker);
        }
        self.dedicated_stop.fire();
        if let Some(dedicated) = self.dedicated {
            join(dedicated);
        }
        self.lifecycle.set_phase(Phase::Stopped);
        ShutdownReport {
            connections_cut: cut,
            elapsed: began.elapsed(),
        }
    }
}

fn join(thread: JoinHandle<usize>) -> usize {
    let name = thread.thread().name().unwrap_or("worker").to_string();
    thread.join().unwrap_or_else(|_| {
        tracing::error!(thread = %name, "worker thread panicked");
        0
    })
}
