//! Per-core HTTP/2 connections to apiservers. Every client request of this core to one server
//! is multiplexed onto a few long-lived connections; another opens only while all are at their
//! stream limit (the server's MAX_CONCURRENT_STREAMS or ours, whichever is lower), up to this
//! core's share of `maxConnectionsPerServer`. Keepalive pings find dead connections.
//!
//! Client requests first take their turn for one of the core's streams to the server
//! (`turns.rs`: fair per user, long-running requests capped to their share, bounded queues and
//! wait), so streams are never over-subscribed and nobody waits inside h2 unbounded. The
//! gateway's own reviews use separate connections (`reserved_stream`) that client traffic never
//! touches, so authentication keeps working whoever holds the client streams.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_gateway::cluster::spec::ConnectionPool;
use sluice_gateway::cluster::CompiledServer;
use sluice_gateway::fair_share::{FairShareRefusal, StreamLimits, StreamQueue};
use sluice_gateway::flow_control::CoreShare;

use crate::error::UpstreamFailure;
use crate::fair_metrics::{FairShareMetrics, LevelMetrics};
use crate::metrics::GatewayMetrics;
use crate::turns::{ask_turn, grant, wait_turn, Asked, ClientTurn, ShareHeld, SharedStreams};
use crate::upstream_connect::{connect, UpstreamConnection, ASSUMED_SERVER_STREAMS};

/// Longest wait for TCP + TLS + HTTP/2 set-up of an upstream connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Holds one stream slot of a connection; dropping it (when the response ends) frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    connection: Rc<UpstreamConnection>,
    /// A client request's place in the server's fair share (dropped after the slot above).
    _share: Option<ShareHeld>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let in_flight = &self.connection.in_flight;
        in_flight.set(in_flight.get().saturating_sub(1));
    }
}

/// The connections of this core to one server.
#[derive(Debug)]
pub(crate) struct ServerConnections {
    client_tls: Arc<rustls::ClientConfig>,
    connections: RefCell<Vec<Rc<UpstreamConnection>>>,
    connecting: Cell<u32>,
    connected: event_listener::Event,
    /// This core's streams to the server, shared fairly by client requests.
    pub(crate) streams: Rc<SharedStreams>,
    /// The lowest stream limit a connection to the server announced (0: none connected yet).
    server_streams: Cell<u32>,
}

impl ServerConnections {
    pub(crate) fn new(client_tls: &Arc<rustls::ClientConfig>) -> Self {
        Self {
            client_tls: client_tls.clone(),
            connections: RefCell::default(),
            connecting: Cell::new(0),
            connected: event_listener::Event::new(),
            streams: Rc::new(RefCell::new(StreamQueue::new(StreamLimits {
                capacity: 0,
                long_running_percent: 0,
                max_queued_per_user: 0,
                max_queued: 0,
            }))),
            server_streams: Cell::new(0),
        }
    }

    /// The fair-share limits for `settings` with `max_connections` connections: streams are
    /// what those connections carry at the lower of our limit and the server's. Until a
    /// connection has told the server's limit, assume what h2 assumes before SETTINGS arrive
    /// ([`ASSUMED_SERVER_STREAMS`]): granting more could leave requests waiting inside h2 for a
    /// stream the server never allows, which is the unbounded queue this replaces.
    fn stream_limits(&self, settings: &ConnectionPool, max_connections: u32) -> StreamLimits {
        let per_connection = match self.server_streams.get() {
            0 => ASSUMED_SERVER_STREAMS,
            announced => announced,
        }
        .min(settings.max_concurrent_streams);
        StreamLimits {
            capacity: max_connections.saturating_mul(per_connection.max(1)),
            long_running_percent: settings.long_running_streams_percent,
            max_queued_per_user: settings.max_queued_per_user,
            max_queued: settings.max_queued_per_server,
        }
    }
}

/// What a pick found.
enum Pick {
    Stream(h2::client::SendRequest<Bytes>, StreamSlot),
    Connect,
    Wait,
}

/// An open connection's streams in use and the most it may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Load {
    in_flight: u32,
    limit: u32,
}

/// Where the next stream to a server goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// The open connection at this index.
    Use(usize),
    /// Open another connection.
    Connect,
    /// Wait for the connection being set up.
    Wait,
}

/// The least busy open connection if it has a free stream; else another connection if this
/// core's share allows (one set-up at a time: the one in progress may well take this stream);
/// else, when every allowed connection is open and full, queue on the least busy one (h2 waits
/// for a free stream there).
fn choose(open: impl IntoIterator<Item = Load>, connecting: u32, max_connections: u32) -> Choice {
    let mut count = 0u32;
    let mut least_busy: Option<(usize, Load)> = None;
    for (index, load) in open.into_iter().enumerate() {
        count += 1;
        if least_busy.is_none_or(|(_, least)| load.in_flight < least.in_flight) {
            least_busy = Some((index, load));
        }
    }
    let may_open = count + connecting < max_connections;
    match least_busy {
        Some((index, load)) if load.in_flight < load.limit || (!may_open && connecting == 0) => {
            Choice::Use(index)
        }
        _ if may_open && connecting == 0 => Choice::Connect,
        _ => Choice::Wait,
    }
}

/// A connection being set up, counted in `connecting` for as long as this lives. The count
/// must fall however the set-up ends: done, failed, or dropped with its caller (a health probe
/// or a client request that timed out mid-connect). A count left behind would make every later
/// pick wait for a connection nobody is setting up, and the server would never be reached
/// again (seen after a partition: the health checker never brought the server back).
struct SettingUp<'a>(&'a ServerConnections);

impl<'a> SettingUp<'a> {
    fn start(connections: &'a ServerConnections) -> Self {
        connections.connecting.set(connections.connecting.get() + 1);
        Self(connections)
    }
}

impl Drop for SettingUp<'_> {
    fn drop(&mut self) {
        self.0
            .connecting
            .set(self.0.connecting.get().saturating_sub(1));
        self.0.connected.notify(usize::MAX);
    }
}

/// One cluster's servers' connections on this core, by server endpoint.
type ClusterConnections = HashMap<Box<str>, Rc<ServerConnections>>;

/// Connections by cluster name, then server endpoint (nested so that a lookup borrows the
/// names instead of building an owned key per request).
type Servers = RefCell<HashMap<Box<str>, ClusterConnections>>;

/// Fair-share metrics by cluster, then level.
type LevelCache = HashMap<Box<str>, HashMap<Box<str>, Rc<LevelMetrics>>>;

/// Why a client request got no stream.
#[derive(Debug)]
pub enum ClientStreamError {
    /// Over its fair share (answered 429 by the caller).
    Refused(FairShareRefusal),
    Upstream(UpstreamFailure),
}

/// This core's upstream connections, by (cluster, server endpoint).
#[derive(Debug)]
pub struct CorePool {
    share: CoreShare,
    /// Open upstream connections, this core's slot.
    gauge: sluice_metrics::PerCoreGauge,
    fair: FairShareMetrics,
    worker: usize,
    servers: Servers,
    /// The connections of the gateway's own review calls: never used by client requests.
    reserved: Servers,
    /// Fair-share metrics by cluster, then level, looked up once per core.
    levels: RefCell<LevelCache>,
}

impl CorePool {
    pub fn new(share: CoreShare, metrics: &GatewayMetrics, worker: usize) -> Self {
        Self {
            share,
            gauge: metrics.upstream_connections.clone(),
            fair: metrics.fair.clone(),
            worker,
            servers: RefCell::default(),
            reserved: RefCell::default(),
            levels: RefCell::default(),
        }
    }

    /// A stream for a client request of `turn.user`, after its fair turn (see the module
    /// comment): refused over a bound, else on a connection with a free stream.
    pub async fn client_stream(
        &self,
        (cluster, server): (&str, &CompiledServer),
        client_tls: &Arc<rustls::ClientConfig>,
        settings: &ConnectionPool,
        turn: ClientTurn<'_>,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), ClientStreamError> {
        let connections = self.server(cluster, server, client_tls);
        let max_connections = self.share.split(settings.max_connections_per_server).max(1);
        let share = self
            .take_turn(cluster, &connections, settings, turn)
            .await
            .map_err(ClientStreamError::Refused)?;
        let opened = self
            .open_stream(&connections, server, settings, max_connections)
            .await;
        // A connection set up meanwhile may have told the server's limit: waiters need not
        // wait for the next request to be let in.
        let limits = connections.stream_limits(settings, max_connections);
        connections.streams.borrow_mut().set_limits(limits, grant);
        let (send, mut slot) = opened.map_err(ClientStreamError::Upstream)?;
        slot._share = Some(share);
        Ok((send, slot))
    }

    /// A turn for a request to an agent server, which has no connection of this pool: the same
    /// fair share per user and cap on long-running requests as an apiserver's streams, over
    /// this core's share of `maxConnectionsPerServer` x `maxConcurrentStreams`. That is the
    /// bound of requests this core has in flight to one agent (the agent bounds all of them
    /// with its own `max_in_flight`).
    pub async fn agent_turn(
        &self,
        (cluster, server): (&str, &CompiledServer),
        client_tls: &Arc<rustls::ClientConfig>,
        settings: &ConnectionPool,
        turn: ClientTurn<'_>,
    ) -> Result<ShareHeld, FairShareRefusal> {
        let connections = self.server(cluster, server, client_tls);
        self.take_turn(cluster, &connections, settings, turn).await
    }

    /// `turn.user`'s fair turn for one of this core's streams to a server (see `turns.rs`).
    async fn take_turn(
        &self,
        cluster: &str,
        connections: &ServerConnections,
        settings: &ConnectionPool,
        turn: ClientTurn<'_>,
    ) -> Result<ShareHeld, FairShareRefusal> {
        let max_connections = self.share.split(settings.max_connections_per_server).max(1);
        let limits = connections.stream_limits(settings, max_connections);
        connections.streams.borrow_mut().set_limits(limits, grant);
        match ask_turn(&connections.streams, turn)? {
            Asked::Held(share) => Ok(share),
            // Boxed: only a request that waits carries the timer and the wait.
            Asked::Queued(ticket, queued) => {
                Box::pin(wait_turn(
                    &connections.streams,
                    turn,
                    (ticket, queued),
                    settings.max_queue_wait,
                    (
                        self.level_metrics(cluster, turn.level.map(|level| &**level)),
                        self.worker,
                    ),
                ))
                .await
            }
        }
    }

    /// A stream on this core's reserved connections to `server` (for the gateway's own
    /// TokenReview and SubjectAccessReview calls), `reservedConnectionsPerServer` of them.
    pub async fn reserved_stream(
        &self,
        cluster: &str,
        server: &CompiledServer,
        client_tls: &Arc<rustls::ClientConfig>,
        settings: &ConnectionPool,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), UpstreamFailure> {
        let connections = Self::lookup(&self.reserved, cluster, server, client_tls);
        let max_connections = settings.reserved_connections_per_server.max(1);
        self.open_stream(&connections, server, settings, max_connections)
            .await
    }

    /// A stream handle on a connection to `server` with a free slot, opening a connection if
    /// this core's share allows and all are busy; not queued (for a pool of the gateway's own,
    /// such as the health checker's).
    pub async fn stream(
        &self,
        cluster: &str,
        server: &CompiledServer,
        client_tls: &Arc<rustls::ClientConfig>,
        settings: &ConnectionPool,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), UpstreamFailure> {
        let connections = self.server(cluster, server, client_tls);
        let max_connections = self.share.split(settings.max_connections_per_server).max(1);
        self.open_stream(&connections, server, settings, max_connections)
            .await
    }

    /// Counts a fair-share refusal under its cluster and level.
    pub fn count_refusal(&self, cluster: &str, level: Option<&str>, refusal: FairShareRefusal) {
        self.level_metrics(cluster, level).refused[refusal.index()].inc(self.worker);
    }

    fn level_metrics(&self, cluster: &str, level: Option<&str>) -> Rc<LevelMetrics> {
        let name = level.unwrap_or(crate::fair_metrics::NO_LEVEL);
        let mut levels = self.levels.borrow_mut();
        if let Some(known) = levels.get(cluster).and_then(|levels| levels.get(name)) {
            return known.clone();
        }
        let metrics = Rc::new(self.fair.level(cluster, level));
        levels
            .entry(Box::from(cluster))
            .or_default()
            .insert(Box::from(name), metrics.clone());
        metrics
    }

    /// A free stream on one of `connections`, opening one when all are at their limit and
    /// fewer than `max_connections` are open.
    async fn open_stream(
        &self,
        connections: &Rc<ServerConnections>,
        server: &CompiledServer,
        settings: &ConnectionPool,
        max_connections: u32,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), UpstreamFailure> {
        loop {
            // Listening before the pick, so a connection that comes up in between still wakes
            // this request; on the future's own state, since every request passes here.
            event_listener::listener!(connections.connected => listener);
            match Self::pick(connections, settings, max_connections) {
                Pick::Stream(send, slot) => return Ok((send, slot)),
                // Every allowed connection is being set up: wait for one.
                Pick::Wait => {
                    listener.await;
                    continue;
                }
                Pick::Connect => {}
            }
            let connected = {
                let _setting_up = SettingUp::start(connections);
                // Boxed: the TCP, TLS and HTTP/2 handshakes under a timer are kilobytes, and
                // every request's future would carry them (copied whole each time hyper spawns
                // a request) although a core connects once per upstream connection.
                Box::pin(monoio::time::timeout(
                    CONNECT_TIMEOUT,
                    connect(
                        server,
                        &connections.client_tls,
                        settings,
                        (&self.gauge, self.worker),
                    ),
                ))
                .await
            };
            match connected {
                Ok(Ok(connection)) => {
                    let announced = connection.send.current_max_send_streams() as u32;
                    let known = connections.server_streams.get();
                    if known == 0 || announced < known {
                        connections.server_streams.set(announced.max(1));
                    }
                    connections.connections.borrow_mut().push(connection);
                }
                Ok(Err(error)) => return Err(error),
                Err(_) => {
                    return Err(UpstreamFailure::ConnectTimeout {
                        endpoint: server.endpoint.clone(),
                        timeout: CONNECT_TIMEOUT,
                    })
                }
            }
        }
    }

    /// The least busy connection with a free stream; else whether another may be opened.
    fn pick(
        connections: &ServerConnections,
        settings: &ConnectionPool,
        max_connections: u32,
    ) -> Pick {
        let mut open = connections.connections.borrow_mut();
        open.retain(|connection| !connection.closed.get());
        // Loads are read in place, not collected: no allocation per request.
        let loads = open.iter().map(|connection| Load {
            in_flight: connection.in_flight.get(),
            limit: (connection.send.current_max_send_streams() as u32)
                .min(settings.max_concurrent_streams)
                .max(1),
        });
        let connecting = connections.connecting.get();
        let choice = choose(loads, connecting, max_connections);
        tracing::trace!(open = open.len(), connecting, ?choice, "upstream pick");
        match choice {
            Choice::Use(index) => {
                let connection = open[index].clone();
                connection.in_flight.set(connection.in_flight.get() + 1);
                Pick::Stream(
                    connection.send.clone(),
                    StreamSlot {
                        connection,
                        _share: None,
                    },
                )
            }
            Choice::Connect => Pick::Connect,
            Choice::Wait => Pick::Wait,
        }
    }

    pub(crate) fn server(
        &self,
        cluster: &str,
        server: &CompiledServer,
        client_tls: &Arc<rustls::ClientConfig>,
    ) -> Rc<ServerConnections> {
        Self::lookup(&self.servers, cluster, server, client_tls)
    }

    fn lookup(
        servers: &Servers,
        cluster: &str,
        server: &CompiledServer,
        client_tls: &Arc<rustls::ClientConfig>,
    ) -> Rc<ServerConnections> {
        let mut servers = servers.borrow_mut();
        let known = servers
            .get(cluster)
            .and_then(|by_endpoint| by_endpoint.get(server.endpoint.as_ref()));
        match known {
            // A reload builds new client credentials: new streams go to new connections, the
            // old ones close once their streams (open watches, say) end.
            Some(existing) if Arc::ptr_eq(&existing.client_tls, client_tls) => existing.clone(),
            _ => {
                let fresh = Rc::new(ServerConnections::new(client_tls));
                servers
                    .entry(Box::from(cluster))
                    .or_default()
                    .insert(server.endpoint.clone(), fresh.clone());
                fresh
            }
        }
    }
}

#[cfg(test)]
impl ServerConnections {
    /// Connections whose TLS trusts no server: for the tests of the bookkeeping, which never
    /// complete a handshake.
    pub(crate) fn trusting_no_one() -> Self {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Self::new(&Arc::new(tls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(in_flight: u32, limit: u32) -> Load {
        Load { in_flight, limit }
    }

    #[test]
    fn the_least_busy_connection_with_a_free_stream_is_used() {
        let open = [load(5, 10), load(2, 10), load(2, 10), load(9, 10)];
        assert_eq!(
            choose(open, 0, 4),
            Choice::Use(1),
            "first of the least busy"
        );
        assert_eq!(
            choose(open, 1, 8),
            Choice::Use(1),
            "even while one is set up"
        );
    }

    #[test]
    fn another_connection_opens_only_when_every_open_one_is_full() {
        let full = [load(10, 10), load(10, 10)];
        assert_eq!(choose(full, 0, 3), Choice::Connect);
        assert_eq!(choose([], 0, 1), Choice::Connect, "the first one");
    }

    #[test]
    fn one_set_up_at_a_time_and_the_rest_wait_for_it() {
        let full = [load(10, 10)];
        assert_eq!(choose(full, 1, 3), Choice::Wait);
        assert_eq!(choose([], 1, 1), Choice::Wait);
        assert_eq!(
            choose(full, 1, 2),
            Choice::Wait,
            "at the limit with one coming: it may take this stream"
        );
    }

    #[test]
    fn a_set_up_abandoned_midway_frees_its_slot_and_wakes_the_waiters() {
        let connections = ServerConnections::trusting_no_one();
        let waiter = connections.connected.listen();
        // A set-up future dropped while pending (its caller timed out) drops its guard.
        let setting_up = SettingUp::start(&connections);
        assert_eq!(connections.connecting.get(), 1);
        assert_eq!(choose([], connections.connecting.get(), 1), Choice::Wait);
        drop(setting_up);
        assert_eq!(connections.connecting.get(), 0);
        assert_eq!(choose([], connections.connecting.get(), 1), Choice::Connect);
        assert!(
            futures_util::FutureExt::now_or_never(waiter).is_some(),
            "those waiting for the connection are woken to pick again"
        );
    }

    #[test]
    fn at_the_connection_limit_requests_queue_on_the_least_busy() {
        let full = [load(12, 10), load(11, 10)];
        assert_eq!(choose(full, 0, 2), Choice::Use(1));
        assert_eq!(choose(full, 0, 1), Choice::Use(1), "over the share too");
    }
}
