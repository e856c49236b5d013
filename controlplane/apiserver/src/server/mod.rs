//! The HTTPS side of the API server: the listener and its limits, one task per connection
//! (HTTP/1.1 and HTTP/2), and the shared state every request reads: the kinds, the store, the
//! tokens and the metrics.

mod encoded;
mod handler;
mod keys;
mod metrics;
mod objects;
mod query;
mod reply;
mod span_watch;
mod tokens;
mod visibility;
mod watch;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_apimachinery::Registry;
use sluice_store::Store;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch as signal, Semaphore};

use crate::auth::{AuthError, Identity, TokenBook};

pub use keys::{list_prefix, object_key};
pub use metrics::ApiMetrics;
/// The query parser, public for the fuzz target.
pub use query::Query;
pub use tokens::{create_object, store_token, TOKEN_KIND};

/// What one server holds and how long it waits; every bound a client could otherwise push.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Open connections at once; more are closed at accept.
    pub max_connections: usize,
    /// Time for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for a request's head (and, between requests, for the next one to start).
    pub header_timeout: Duration,
    /// Time to answer a request other than a watch.
    pub request_timeout: Duration,
    /// Largest request body (kube-apiserver's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// Open watches at once; more get 429.
    pub max_watches: usize,
    /// A watch without `timeoutSeconds` ends after this long plus up to as long again.
    pub watch_timeout: Duration,
    /// HTTP/2 PINGs this often find dead peers of long watches.
    pub keepalive_interval: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            max_body_bytes: 3 * 1024 * 1024,
            max_watches: 10_000,
            watch_timeout: Duration::from_secs(30 * 60),
            keepalive_interval: Duration::from_secs(30),
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub address: SocketAddr,
    /// The identity a verified client certificate names, when one was sent.
    pub certificate: Option<Result<Identity, AuthError>>,
}

/// The API server's shared state.
pub struct ApiServer {
    registry: Registry,
    store: Arc<dyn Store>,
    tokens: ArcSwap<TokenBook>,
    metrics: ApiMetrics,
    prometheus: prometheus_client::registry::Registry,
    limits: ServerLimits,
    watch_slots: Arc<Semaphore>,
    connection_slots: Arc<Semaphore>,
    /// Watch events shared by the watchers that send them unchanged.
    encoded: Arc<encoded::EncodedEvents>,
}

impl ApiServer {
    pub fn new(registry: Registry, store: Arc<dyn Store>, limits: ServerLimits) -> Arc<Self> {
        Self::with_metrics(registry, store, limits, |_| {})
    }

    /// [`ApiServer::new`], with more metrics on its `/metrics` (the control plane's
    /// controllers register theirs here).
    pub fn with_metrics(
        registry: Registry,
        store: Arc<dyn Store>,
        limits: ServerLimits,
        register: impl FnOnce(&mut prometheus_client::registry::Registry),
    ) -> Arc<Self> {
        let mut prometheus = prometheus_client::registry::Registry::default();
        let metrics = ApiMetrics::register(&mut prometheus);
        register(&mut prometheus);
        Arc::new(Self {
            registry,
            store,
            tokens: ArcSwap::from_pointee(TokenBook::default()),
            metrics,
            prometheus,
            watch_slots: Arc::new(Semaphore::new(limits.max_watches)),
            connection_slots: Arc::new(Semaphore::new(limits.max_connections)),
            encoded: Arc::default(),
            limits,
        })
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Accepts connections until `stop` turns true, then stops accepting; open connections
    /// finish their current request (watches end) within `grace`.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        mut stop: signal::Receiver<bool>,
        grace: Duration,
    ) {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        loop {
            let accepted = tokio::select! {
                _ = stopped(&mut stop) => break,
                accepted = listener.accept() => accepted,
            };
            let (tcp, address) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting an API connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = self.connection_slots.clone().try_acquire_owned() else {
                self.refused("limit");
                continue;
            };
            let server = self.clone();
            let acceptor = acceptor.clone();
            let stop = stop.clone();
            // tokio contains a panicking task; the guard still releases the slot and gauge.
            tokio::spawn(async move {
                let _open = OpenConnection::new(slot, server.metrics.connections.clone());
                server.connection(tcp, address, acceptor, stop).await;
            });
        }
        // Every connection holds a slot: all slots back means all connections are done.
        let all = u32::try_from(self.limits.max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(grace, self.connection_slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(?grace, "API connections still open after the grace period");
        }
    }

    async fn connection(
        self: Arc<Self>,
        tcp: TcpStream,
        address: SocketAddr,
        acceptor: tokio_rustls::TlsAcceptor,
        mut stop: signal::Receiver<bool>,
    ) {
        let _ = tcp.set_nodelay(true);
        let tls =
            match tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%address, %error, "TLS handshake failed");
                    return self.refused("tls");
                }
                Err(_) => return self.refused("handshake_timeout"),
            };
        let peer = Peer {
            address,
            certificate: tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|certificate| identity_of(certificate.as_ref())),
        };
        let server = self.clone();
        let peer = Arc::new(peer);
        let service = hyper::service::service_fn(move |request| {
            let server = server.clone();
            let peer = peer.clone();
            async move {
                let watch = request.uri().query().is_some_and(is_watch_query);
                let answer = server.handle(request, &peer);
                let response = if watch {
                    answer.await
                } else {
                    match tokio::time::timeout(server.limits.request_timeout, answer).await {
                        Ok(response) => response,
                        Err(_) => reply::status_response(&sluice_apimachinery::StatusError::new(
                            sluice_apimachinery::StatusReason::ServiceUnavailable,
                            "the request took longer than the server's request timeout",
                        )),
                    }
                };
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(64 * 1024);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.limits.keepalive_interval)
            .keep_alive_timeout(Duration::from_secs(20))
            .max_concurrent_streams(1000)
            .max_header_list_size(64 * 1024);
        let connection = builder.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%address, %error, "API connection ended with an error");
                }
            }
            _ = stopped(&mut stop) => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }

    fn refused(&self, reason: &'static str) {
        self.metrics
            .connections_refused
            .get_or_create(&metrics::ReasonLabels { reason })
            .inc();
    }

    fn encode_metrics(&self) -> String {
        self.metrics.tokens.set(self.tokens.load().len() as i64);
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.prometheus).is_err() {
            text.clear();
        }
        text
    }
}

/// A connection's slot and its place in the connections gauge, released however it ends.
struct OpenConnection {
    _slot: tokio::sync::OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl OpenConnection {
    fn new(
        slot: tokio::sync::OwnedSemaphorePermit,
        gauge: prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        gauge.inc();
        Self { _slot: slot, gauge }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

fn is_watch_query(query: &str) -> bool {
    query
        .split('&')
        .any(|pair| matches!(pair, "watch" | "watch=1" | "watch=true" | "watch=True"))
}

/// The identity a client certificate names (CN = subject, O = role).
fn identity_of(certificate: &[u8]) -> Result<Identity, AuthError> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(certificate) else {
        return Err(AuthError::CertificateWithoutRole);
    };
    let subject = parsed.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|name| name.as_str().ok())
        .unwrap_or("");
    let organizations: Vec<&str> = subject
        .iter_organization()
        .filter_map(|name| name.as_str().ok())
        .collect();
    Identity::from_certificate(common_name, &organizations)
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut signal::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}
