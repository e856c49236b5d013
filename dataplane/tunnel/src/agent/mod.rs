//! The agent (after agentk): dials out to nodes, keeps a pool of idle tunnels on each
//! (`pool`), serves one call at a time per tunnel (`tunnel`), and forwards every tunnelled
//! call to the local gRPC backend (`forward`), any method, any streaming shape, except the
//! Kubernetes API method, which goes to the configured apiserver or nowhere (`kube`).

mod forward;
mod kube;
mod metrics;
mod pool;
mod tunnel;

use std::cell::RefCell;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use rustls::pki_types::ServerName;
use sluice_config::{AgentConfig, Endpoint};
use sluice_grpc::transport::{connect, ClientConnection, H2Settings};
use sluice_runtime::{BackgroundTask, StopSignal, WorkerContext};

pub use forward::BACKEND_UNAVAILABLE;
pub use kube::{KubeMetrics, KubeSetupError};
pub use metrics::AgentMetrics;

use crate::error::{ErrorKind, TunnelError};

/// The agent role as a runtime background task.
#[derive(Debug, Clone)]
pub struct AgentTask {
    config: Arc<AgentConfig>,
    metrics: AgentMetrics,
    node_tls: Option<Arc<rustls::ClientConfig>>,
    backend_tls: Option<Arc<rustls::ClientConfig>>,
    kube: Option<Arc<kube::KubeSetup>>,
}

/// Why the agent task could not be built (each error names its config field).
#[derive(Debug, thiserror::Error)]
pub enum AgentSetupError {
    #[error("{0}")]
    Tls(#[from] sluice_grpc::tls::TlsError),
    #[error("{0}")]
    Kube(#[from] KubeSetupError),
}

impl AgentSetupError {
    /// The config field to name in the error.
    pub fn field(&self) -> String {
        match self {
            Self::Tls(_) => "agent".into(),
            Self::Kube(error) => error.field(),
        }
    }
}

impl AgentTask {
    pub fn new(config: AgentConfig, metrics: AgentMetrics) -> Result<Self, AgentSetupError> {
        let node_tls = config
            .nodes
            .iter()
            .any(|node| node.tls)
            .then(|| sluice_grpc::tls::client_config(config.ca_file.as_deref(), None))
            .transpose()?;
        let backend_tls = config
            .forward_to
            .tls
            .then(|| sluice_grpc::tls::client_config(config.forward_ca_file.as_deref(), None))
            .transpose()?;
        let kube = config
            .kubernetes_api
            .clone()
            .map(|kube| kube::KubeSetup::new(kube, metrics.kube.clone()).map(Arc::new))
            .transpose()?;
        Ok(Self {
            config: Arc::new(config),
            metrics,
            node_tls,
            backend_tls,
            kube,
        })
    }
}

impl BackgroundTask for AgentTask {
    fn run(
        &self,
        _worker: &WorkerContext,
        stop: Arc<StopSignal>,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        let shared = Rc::new(AgentShared {
            task: self.clone(),
            backend: RefCell::new(None),
            backend_driver: RefCell::new(None),
            settings: H2Settings::default(),
            backend_log: LogInterval::default(),
            kube: self.kube.clone().map(kube::KubeApi::new),
            backend_authority: forward::backend_authority(&self.config.forward_to).ok(),
        });
        Box::pin(async move {
            let loops: Vec<_> = shared
                .task
                .config
                .nodes
                .iter()
                .enumerate()
                .map(|(index, node)| {
                    let node_loop =
                        pool::node_loop(shared.clone(), node.clone(), index, stop.clone());
                    sluice_runtime::spawn_contained("agent-node-loop", node_loop)
                })
                .collect();
            for node_loop in loops {
                node_loop.await;
            }
            // Every tunnel has ended: close the backend connection and let its driver finish, so
            // the socket is closed before this worker's runtime stops running tasks.
            shared.backend.borrow_mut().take();
            let driver = shared.backend_driver.borrow_mut().take();
            if let Some(driver) = driver {
                let _ = monoio::time::timeout(Duration::from_secs(2), driver).await;
            }
            if let Some(kube) = &shared.kube {
                kube.close().await;
            }
        })
    }
}

struct AgentShared {
    task: AgentTask,
    /// One HTTP/2 connection to the backend, shared by all calls, re-dialled when it dies.
    backend: RefCell<Option<SendRequest<Bytes>>>,
    backend_driver: RefCell<Option<monoio::task::JoinHandle<Option<()>>>>,
    settings: H2Settings,
    /// Bounds the backend-failure log lines of this worker (see `forward::answer_message`).
    backend_log: LogInterval,
    /// The Kubernetes API forwarder, when `agent.kubernetes_api` is set.
    kube: Option<kube::KubeApi>,
    /// `forward_to` as each backend request's authority (`forward::backend_authority`); a
    /// valid config always has one.
    backend_authority: Option<http::uri::Authority>,
}

/// At most one log line per [`LogInterval::EVERY`]; the lines it holds back are counted and
/// reported on the next one written, so a failing backend cannot flood the log.
#[derive(Default)]
pub(crate) struct LogInterval {
    last: std::cell::Cell<Option<std::time::Instant>>,
    suppressed: std::cell::Cell<u64>,
}

impl LogInterval {
    pub(crate) const EVERY: Duration = Duration::from_secs(10);

    /// `Some(lines held back since the last one)` when a line may be written now.
    pub(crate) fn admit(&self, now: std::time::Instant) -> Option<u64> {
        let due = self
            .last
            .get()
            .is_none_or(|last| now.saturating_duration_since(last) >= Self::EVERY);
        if !due {
            self.suppressed.set(self.suppressed.get() + 1);
            return None;
        }
        self.last.set(Some(now));
        Some(self.suppressed.take())
    }
}

impl AgentShared {
    /// The shared backend connection, dialled on first use and again after it broke.
    async fn backend(&self) -> Result<SendRequest<Bytes>, TunnelError> {
        let existing = self.backend.borrow().clone();
        if let Some(backend) = existing {
            match backend.ready().await {
                Ok(ready) => return Ok(ready),
                Err(_) => {
                    self.backend.borrow_mut().take();
                }
            }
        }
        let kind = ErrorKind::BackendUnavailable;
        let backend = &self.task.config.forward_to;
        // Boxed: the handshakes under a timer are kilobytes that every tunnel's task would
        // otherwise hold for its whole life, though the agent dials its backend once.
        let connection =
            Box::pin(dial(backend, &self.task.backend_tls, &self.settings, kind)).await?;
        let ready = connection
            .ready()
            .await
            .map_err(|error| TunnelError::new(kind, error.to_string()))?;
        *self.backend.borrow_mut() = Some(connection.send_request);
        // Kept so a stopping agent can wait for this connection to close (see `run`).
        *self.backend_driver.borrow_mut() = Some(connection.driver);
        Ok(ready)
    }
}

fn resolve(endpoint: &Endpoint) -> std::io::Result<SocketAddr> {
    (endpoint.host.as_str(), endpoint.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{} resolves to no address", endpoint.host)))
}

fn tls_for(
    endpoint: &Endpoint,
    config: &Option<Arc<rustls::ClientConfig>>,
) -> Option<(Arc<rustls::ClientConfig>, ServerName<'static>)> {
    if !endpoint.tls {
        return None;
    }
    let config = config.clone()?;
    let name = ServerName::try_from(endpoint.host.clone()).ok()?;
    Some((config, name))
}

/// Connects to a node, the backend or the apiserver; a failure is reported as `kind` (the side
/// dialled).
async fn dial(
    endpoint: &Endpoint,
    tls: &Option<Arc<rustls::ClientConfig>>,
    settings: &H2Settings,
    kind: ErrorKind,
) -> Result<ClientConnection, TunnelError> {
    let failed = |why: String| TunnelError::new(kind, why);
    let address =
        resolve(endpoint).map_err(|error| failed(format!("{}: {error}", endpoint.url)))?;
    let tls = tls_for(endpoint, tls);
    if endpoint.tls && tls.is_none() {
        return Err(failed(format!(
            "{}: no TLS configuration for this host name",
            endpoint.url
        )));
    }
    connect(address, tls, settings)
        .await
        .map_err(|error| failed(error.to_string()))
}
