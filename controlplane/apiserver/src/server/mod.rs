//! The HTTPS side of the API server: the listener and its limits, one task per connection
//! (HTTP/1.1 and HTTP/2), and the shared state every request reads: the kinds, the store, the
//! tokens and the metrics.

pub mod admission;
mod connections;
mod encoded;
mod handler;
mod keys;
mod metrics;
mod objects;
mod overload;
mod panics;
mod query;
mod reply;
mod reviews;
mod span_feed;
mod span_list;
mod span_watch;
mod tokens;
mod visibility;
mod watch;
mod watch_body;
pub mod write_budget;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_apimachinery::Registry;
use sluice_store::Store;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch as signal;

use crate::auth::{AuthError, Identity, Role, TokenBook};
use admission::{BudgetKind, Pool, PoolLimits, RoleShare};
use connections::{Admitted, ConnectionTable, TableLimits, Tracked};

pub use keys::{list_prefix, object_key};
pub use metrics::ApiMetrics;
/// The query parser, public for the fuzz target.
pub use query::Query;
pub use tokens::{create_object, store_token, TOKEN_KIND};

/// What one server holds and how long it waits; every bound a client could otherwise push.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Open connections at once; past it the oldest unauthenticated one is closed for a new
    /// one, and with none left new ones are closed at accept.
    pub max_connections: usize,
    /// Of those, connections that have not authenticated yet (the rest is kept for the admin
    /// and the roles).
    pub max_unauthenticated_connections: usize,
    /// Unauthenticated connections of one source address (IPv4, or IPv6 /64).
    pub max_unauthenticated_connections_per_address: usize,
    /// Each role's share of the authenticated part of the table (`max_connections` minus
    /// `max_unauthenticated_connections`), indexed as [`Role::ALL`]; past a share, 429.
    pub connection_shares: [RoleShare; 4],
    /// Time for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for a request's head (and, between requests, for the next one to start).
    pub header_timeout: Duration,
    /// A connection with no authenticated request yet is closed after this long with no
    /// request in flight.
    pub first_request_timeout: Duration,
    /// An authenticated connection is closed after this long with no request in flight (HTTP/2:
    /// no stream open).
    pub idle_timeout: Duration,
    /// Time to answer any request (a watch: until its stream starts).
    pub request_timeout: Duration,
    /// Largest request body (kube-apiserver's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// Open watches: the pool and each role's share; past a share, 429.
    pub watches: PoolLimits,
    /// Requests being answered at once: the pool and each role's share; past a share, 429.
    pub requests_in_flight: PoolLimits,
    /// Writes and stored bytes per second of each identity and each role (429 past them).
    pub write_budgets: write_budget::WriteBudgets,
    /// A watch without `timeoutSeconds` ends after this long plus up to as long again.
    pub watch_timeout: Duration,
    /// A watch that allows bookmarks gets one for progress alone at most this often
    /// (kube-apiserver: about once a minute). Changes, and the BOOKMARK after a VM agent's
    /// span or VM moved, are sent at once. Each is a TLS record and a socket write: 20,000
    /// watches of 5,000 VM agents at one per 10 s were 2,000 writes a second (issue 36).
    pub bookmark_interval: Duration,
    /// HTTP/2 PINGs this often find dead peers of long watches.
    pub keepalive_interval: Duration,
    /// The Events the control plane records: caps, TTL, queue, write rate.
    pub events: crate::events::EventLimits,
    /// An unanswered PING closes the connection after this long.
    pub keepalive_timeout: Duration,
}

/// A pool's default shares: admin, gateway, node, vm-agent (`(reserved, per identity)`).
fn pool(total: usize, shares: [(usize, usize); 4]) -> PoolLimits {
    PoolLimits {
        total,
        shares: shares.map(|(reserved, per_identity)| RoleShare {
            reserved,
            per_identity,
        }),
    }
}

impl ServerLimits {
    /// The authenticated connections' pool: what the unauthenticated part leaves.
    pub fn authenticated_connections(&self) -> PoolLimits {
        PoolLimits {
            total: self
                .max_connections
                .saturating_sub(self.max_unauthenticated_connections),
            shares: self.connection_shares,
        }
    }

    /// Why these limits cannot work (the field and the reason), if they cannot.
    pub fn check(&self) -> Result<(), String> {
        self.authenticated_connections()
            .check()
            .map_err(|reason| format!("authenticated connections: {reason}"))?;
        self.watches
            .check()
            .map_err(|reason| format!("watches: {reason}"))?;
        self.requests_in_flight
            .check()
            .map_err(|reason| format!("requests in flight: {reason}"))?;
        self.write_budgets.check()?;
        if self.max_unauthenticated_connections > self.max_connections {
            return Err(format!(
                "max_unauthenticated_connections ({}) is more than max_connections ({})",
                self.max_unauthenticated_connections, self.max_connections
            ));
        }
        if self.max_unauthenticated_connections == 0
            || self.max_unauthenticated_connections_per_address == 0
        {
            return Err(
                "no connection could ever authenticate: the unauthenticated connection \
                        limits must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_unauthenticated_connections: 1024,
            max_unauthenticated_connections_per_address: 64,
            connection_shares: pool(0, [(64, 256), (512, 128), (512, 128), (1024, 32)]).shares,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(60),
            max_body_bytes: 3 * 1024 * 1024,
            watches: pool(10_000, [(200, 1000), (1000, 64), (1000, 64), (2000, 16)]),
            requests_in_flight: pool(400, [(40, 100), (60, 20), (60, 20), (60, 8)]),
            write_budgets: write_budget::WriteBudgets::default(),
            watch_timeout: Duration::from_secs(30 * 60),
            bookmark_interval: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            events: crate::events::EventLimits::default(),
        }
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub address: SocketAddr,
    /// The identity a verified client certificate names, when one was sent.
    pub certificate: Option<Result<Identity, AuthError>>,
    /// The connection's place in the table (an authenticated request promotes it).
    connection: Arc<Tracked>,
}

/// The API server's shared state.
pub struct ApiServer {
    registry: Registry,
    store: Arc<dyn Store>,
    tokens: ArcSwap<TokenBook>,
    metrics: ApiMetrics,
    prometheus: prometheus_client::registry::Registry,
    limits: ServerLimits,
    watch_slots: Arc<Pool>,
    request_slots: Arc<Pool>,
    connection_slots: Arc<Pool>,
    writes: write_budget::WriteBudget,
    write_metrics: write_budget::WriteMetrics,
    connections: Arc<ConnectionTable>,
    /// Connection tasks still running (evicted ones included), for the graceful stop.
    tasks: signal::Sender<usize>,
    /// Watch events shared by the watchers that send them unchanged.
    encoded: Arc<encoded::EncodedEvents>,
    /// Where Events are recorded; the queue's reader starts with [`ApiServer::serve`].
    events: crate::events::Recorder,
    event_queue: std::sync::Mutex<Option<(EventQueue, crate::events::EventMetrics)>>,
    /// What VM agents may read, shared by their requests (started by the first).
    span_feed: std::sync::OnceLock<Arc<span_feed::SpanFeed>>,
}

type EventQueue = tokio::sync::mpsc::Receiver<crate::events::Occurrence>;

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
        panics::register(&mut prometheus);
        register(&mut prometheus);
        let write_metrics = write_budget::WriteMetrics::register(&mut prometheus, store.clone());
        let event_metrics = crate::events::EventMetrics::register(&mut prometheus);
        let (events, event_queue) =
            crate::events::Recorder::new(&limits.events, event_metrics.clone());
        Arc::new(Self {
            registry,
            store,
            tokens: ArcSwap::from_pointee(TokenBook::default()),
            metrics,
            prometheus,
            watch_slots: Pool::new(BudgetKind::Watches, limits.watches.clone()),
            request_slots: Pool::new(BudgetKind::Requests, limits.requests_in_flight.clone()),
            connection_slots: Pool::new(
                BudgetKind::Connections,
                limits.authenticated_connections(),
            ),
            writes: write_budget::WriteBudget::new(limits.write_budgets.clone()),
            write_metrics,
            connections: ConnectionTable::new(TableLimits {
                max_connections: limits.max_connections,
                max_unauthenticated: limits.max_unauthenticated_connections,
                max_unauthenticated_per_address: limits.max_unauthenticated_connections_per_address,
            }),
            tasks: signal::Sender::new(0),
            encoded: Arc::default(),
            events,
            event_queue: std::sync::Mutex::new(Some((event_queue, event_metrics))),
            span_feed: std::sync::OnceLock::new(),
            limits,
        })
    }

    /// Where to record Events about objects (never blocks; see [`crate::events`]).
    pub fn events(&self) -> &crate::events::Recorder {
        &self.events
    }

    /// Starts the Events' writer (once), until `stop` turns true.
    fn write_events(&self, instance: String, stop: signal::Receiver<bool>) {
        let queue = self
            .event_queue
            .lock()
            .ok()
            .and_then(|mut queue| queue.take());
        if let Some((queue, metrics)) = queue {
            tokio::spawn(panics::contained(
                panics::Task::Events,
                crate::events::write_events(
                    self.store.clone(),
                    self.limits.events.clone(),
                    metrics,
                    instance,
                    queue,
                    stop,
                ),
            ));
        }
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
        self.write_events(instance_name(&listener), stop.clone());
        loop {
            // Near the memory or descriptor limit new connections wait in the backlog.
            tokio::select! {
                _ = stopped(&mut stop) => break,
                _ = overload::accepting() => {}
            }
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
            let admitted = match self.connections.admit(address.ip()) {
                Ok((admitted, evicted)) => {
                    self.metrics
                        .connections_refused
                        .get_or_create(&metrics::ReasonLabels { reason: "evicted" })
                        .inc_by(evicted as u64);
                    admitted
                }
                Err(refused) => {
                    self.refused(refused.reason());
                    continue;
                }
            };
            let server = self.clone();
            let acceptor = acceptor.clone();
            let stop = stop.clone();
            // A panic ends this connection's task only; the guard still releases the slot
            // and gauge as it unwinds.
            tokio::spawn(panics::contained(panics::Task::Connection, async move {
                let open = OpenConnection::new(admitted, &server);
                let tracked = open.admitted.0.clone();
                tokio::select! {
                    _ = server.connection(tcp, address, acceptor, stop, tracked.clone()) => {}
                    _ = tracked.evicted() => {
                        tracing::debug!(%address, "closed an unauthenticated connection for a newer one");
                    }
                }
                drop(open);
            }));
        }
        let mut tasks = self.tasks.subscribe();
        if tokio::time::timeout(grace, tasks.wait_for(|open| *open == 0))
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
        tracked: Arc<Tracked>,
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
        let certificate = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|certificate| identity_of(certificate.as_ref()));
        if let Some(Ok(identity)) = &certificate {
            match self.admit(&self.connection_slots, identity) {
                Ok(share) => tracked.authenticated(share),
                Err(_) => return self.refused("identity_connections"),
            }
        }
        let peer = Arc::new(Peer {
            address,
            certificate,
            connection: tracked.clone(),
        });
        let server = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let server = server.clone();
            let peer = peer.clone();
            async move { Ok::<_, std::convert::Infallible>(server.timed(request, &peer).await) }
        });
        let builder = self.connection_builder();
        let connection = builder.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%address, %error, "API connection ended with an error");
                }
            }
            reason = tracked.idle(self.limits.idle_timeout, self.limits.first_request_timeout) => {
                tracing::debug!(%address, reason, "closing an idle API connection");
                self.refused(reason);
                connection.as_mut().graceful_shutdown();
                // A peer that does not read cannot hold the connection open on the GOAWAY.
                let _ = tokio::time::timeout(Duration::from_secs(1), connection).await;
            }
            _ = stopped(&mut stop) => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }

    /// One request with the request timeout on its answer's head, whatever it asks: a watch's
    /// events stream after the head, so no query lifts the timeout of a request that is not
    /// one. The request counts as in flight on its connection until its body is sent.
    async fn timed(
        &self,
        request: http::Request<hyper::body::Incoming>,
        peer: &Peer,
    ) -> http::Response<InFlightBody> {
        let in_flight = peer.connection.request();
        let response =
            match tokio::time::timeout(self.limits.request_timeout, self.handle(request, peer))
                .await
            {
                Ok(response) => response,
                Err(_) => reply::status_response(&sluice_apimachinery::StatusError::new(
                    sluice_apimachinery::StatusReason::ServiceUnavailable,
                    format!(
                        "the request took longer than the server's request timeout ({:?})",
                        self.limits.request_timeout
                    ),
                )),
            };
        response.map(|body| InFlightBody {
            body,
            _in_flight: in_flight,
        })
    }

    fn connection_builder(&self) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
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
            .keep_alive_timeout(self.limits.keepalive_timeout)
            .max_concurrent_streams(1000)
            .max_header_list_size(64 * 1024);
        builder
    }

    fn refused(&self, reason: &'static str) {
        self.metrics
            .connections_refused
            .get_or_create(&metrics::ReasonLabels { reason })
            .inc();
    }

    fn encode_metrics(&self) -> String {
        self.metrics.tokens.set(self.tokens.load().len() as i64);
        let (_, unauthenticated) = self.connections.counts();
        self.metrics
            .unauthenticated_connections
            .set(unauthenticated as i64);
        for (pool, slots) in [
            (BudgetKind::Watches, &self.watch_slots),
            (BudgetKind::Requests, &self.request_slots),
            (BudgetKind::Connections, &self.connection_slots),
        ] {
            for role in Role::ALL {
                self.metrics
                    .admission_in_use
                    .get_or_create(&metrics::ShareLabels {
                        pool: pool.as_str(),
                        role: role.as_str(),
                    })
                    .set(slots.in_use(role) as i64);
            }
        }
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.prometheus).is_err() {
            text.clear();
        }
        text
    }
}

/// A connection's place in the table, the connections gauge and the count of running
/// connection tasks, released however the task ends.
struct OpenConnection {
    admitted: Admitted,
    gauge: prometheus_client::metrics::gauge::Gauge,
    tasks: signal::Sender<usize>,
}

impl OpenConnection {
    fn new(admitted: Admitted, server: &ApiServer) -> Self {
        server.metrics.connections.inc();
        server.tasks.send_modify(|open| *open += 1);
        Self {
            admitted,
            gauge: server.metrics.connections.clone(),
            tasks: server.tasks.clone(),
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
        self.tasks.send_modify(|open| *open -= 1);
    }
}

/// A response body that keeps its request in flight on the connection until it is sent (a
/// watch's stream included), so a connection with a watch open is never idle.
pub struct InFlightBody {
    body: reply::Body,
    _in_flight: connections::InFlight,
}

impl hyper::body::Body for InFlightBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The identity a client certificate names (CN = subject, O = role). Public for the fuzz
/// targets (`fuzz/`).
#[doc(hidden)]
pub fn identity_of(certificate: &[u8]) -> Result<Identity, AuthError> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(certificate) else {
        return Err(AuthError::CertificateWithoutRole);
    };
    let subject = parsed.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|name| name.as_str().ok())
        .unwrap_or("");
    // An O value that is not readable text refuses the certificate: skipping it would read a
    // certificate naming two roles as naming the one left (the gateway refuses such a one too).
    let organizations = subject
        .iter_organization()
        .map(|name| name.as_str().map_err(|_| AuthError::CertificateWithoutRole))
        .collect::<Result<Vec<&str>, AuthError>>()?;
    Identity::from_certificate(common_name, &organizations)
}

#[cfg(test)]
#[path = "identity_of_tests.rs"]
mod identity_of_tests;

/// The replica's name in its Events' `source.host`: the host name, else the listen address.
fn instance_name(listener: &TcpListener) -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            listener
                .local_addr()
                .ok()
                .map(|address| address.to_string())
        })
        .unwrap_or_default()
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut signal::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}
