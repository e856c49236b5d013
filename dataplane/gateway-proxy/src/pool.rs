//! Per-core HTTP/2 connections to apiservers. Every client request of this core to one server
//! is multiplexed onto a few long-lived connections; another opens only while all are at their
//! stream limit (the server's MAX_CONCURRENT_STREAMS or ours, whichever is lower), up to this
//! core's share of `maxConnectionsPerServer`. Keepalive pings find dead connections.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use monoio::net::TcpStream;
use sluice_gateway::cluster::spec::ConnectionPool;
use sluice_gateway::cluster::CompiledServer;
use sluice_gateway::flow_control::CoreShare;

use crate::error::UpstreamFailure;

/// Longest wait for TCP + TLS + HTTP/2 set-up of an upstream connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One upstream HTTP/2 connection.
#[derive(Debug)]
struct UpstreamConnection {
    send: h2::client::SendRequest<Bytes>,
    in_flight: Cell<u32>,
    /// Set by the connection's driver task when the connection ends.
    closed: Rc<Cell<bool>>,
}

/// Holds one stream slot of a connection; dropping it (when the response ends) frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    connection: Rc<UpstreamConnection>,
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

/// This core's upstream connections, by (cluster, server endpoint).
#[derive(Debug)]
pub struct CorePool {
    share: CoreShare,
    /// Open upstream connections, this core's slot.
    gauge: sluice_metrics::PerCoreGauge,
    worker: usize,
    /// By cluster name, then server endpoint (nested so that a lookup borrows the names instead
    /// of building an owned key per request).
    servers: RefCell<HashMap<Box<str>, ClusterConnections>>,
}

impl CorePool {
    pub fn new(share: CoreShare, gauge: sluice_metrics::PerCoreGauge, worker: usize) -> Self {
        Self {
            share,
            gauge,
            worker,
            servers: RefCell::default(),
        }
    }

    /// A stream handle on a connection to `server` with a free slot, opening a connection if
    /// this core's share allows and all are busy.
    pub async fn stream(
        &self,
        cluster: &str,
        server: &CompiledServer,
        client_tls: &Arc<rustls::ClientConfig>,
        settings: &ConnectionPool,
    ) -> Result<(h2::client::SendRequest<Bytes>, StreamSlot), UpstreamFailure> {
        let connections = self.server(cluster, server, client_tls);
        let max_connections = self.share.split(settings.max_connections_per_server).max(1);
        loop {
            // Listening before the pick, so a connection that comes up in between still wakes
            // this request; on the future's own state, since every request passes here.
            event_listener::listener!(connections.connected => listener);
            match Self::pick(&connections, settings, max_connections) {
                Pick::Stream(send, slot) => return Ok((send, slot)),
                // Every allowed connection is being set up: wait for one.
                Pick::Wait => {
                    listener.await;
                    continue;
                }
                Pick::Connect => {}
            }
            let connected = {
                let _setting_up = SettingUp::start(&connections);
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
                Ok(Ok(connection)) => connections.connections.borrow_mut().push(connection),
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
                Pick::Stream(connection.send.clone(), StreamSlot { connection })
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
        let mut servers = self.servers.borrow_mut();
        let known = servers
            .get(cluster)
            .and_then(|by_endpoint| by_endpoint.get(server.endpoint.as_ref()));
        match known {
            // A reload builds new client credentials: new streams go to new connections, the
            // old ones close once their streams (open watches, say) end.
            Some(existing) if Arc::ptr_eq(&existing.client_tls, client_tls) => existing.clone(),
            _ => {
                let fresh = Rc::new(ServerConnections {
                    client_tls: client_tls.clone(),
                    connections: RefCell::default(),
                    connecting: Cell::new(0),
                    connected: event_listener::Event::new(),
                });
                servers
                    .entry(Box::from(cluster))
                    .or_default()
                    .insert(server.endpoint.clone(), fresh.clone());
                fresh
            }
        }
    }
}

async fn connect(
    server: &CompiledServer,
    client_tls: &Arc<rustls::ClientConfig>,
    settings: &ConnectionPool,
    (gauge, worker): (&sluice_metrics::PerCoreGauge, usize),
) -> Result<Rc<UpstreamConnection>, UpstreamFailure> {
    let endpoint = || server.endpoint.clone();
    // Hostnames resolve through the system resolver; apiserver endpoints are usually IPs or
    // /etc/hosts names, and connections are long-lived, so this is rare.
    let stream = TcpStream::connect((server.host.as_ref(), server.port))
        .await
        .map_err(|source| UpstreamFailure::Connect {
            endpoint: endpoint(),
            source,
        })?;
    let _ = stream.set_nodelay(true);
    let io = sluice_grpc::transport::compat(stream).map_err(|source| UpstreamFailure::Connect {
        endpoint: endpoint(),
        source,
    })?;
    let settings_h2 = sluice_grpc::transport::H2Settings::default();
    let builder = {
        let mut builder = h2::client::Builder::new();
        builder
            .initial_window_size(settings_h2.initial_stream_window)
            .initial_connection_window_size(settings_h2.initial_connection_window)
            .max_frame_size(settings_h2.max_frame_size)
            .max_header_list_size(settings_h2.max_header_list_size)
            .max_concurrent_reset_streams(4096)
            // Until the server's SETTINGS arrive, assume a modest stream limit rather than
            // none, so a burst right after connecting is not refused (REFUSED_STREAM).
            .initial_max_send_streams(100)
            // h2's default small-frame budget cuts long-lived connections (see
            // `small_frame_budget`); many watches share one of these.
            .data_frame_budget(sluice_grpc::transport::small_frame_budget(&settings_h2));
        builder
    };
    let closed = Rc::new(Cell::new(false));
    let driving = Driving {
        closed: closed.clone(),
        settings,
        endpoint: server.endpoint.clone(),
        gauge: gauge.clone(),
        worker,
    };
    let send = if server.tls {
        let name =
            rustls_pki_types::ServerName::try_from(server.host.to_string()).map_err(|source| {
                UpstreamFailure::ServerName {
                    endpoint: endpoint(),
                    source,
                }
            })?;
        let tls = tokio_rustls::TlsConnector::from(client_tls.clone())
            .connect(name, io)
            .await
            .map_err(|source| UpstreamFailure::Tls {
                endpoint: endpoint(),
                source,
            })?;
        handshake(&builder, tls, driving).await
    } else {
        handshake(&builder, io, driving).await
    }
    .map_err(|source| UpstreamFailure::Http2Handshake {
        endpoint: endpoint(),
        source,
    })?;
    Ok(Rc::new(UpstreamConnection {
        send,
        in_flight: Cell::new(0),
        closed,
    }))
}

/// What a connection's driver task needs besides the connection.
struct Driving<'a> {
    closed: Rc<Cell<bool>>,
    settings: &'a ConnectionPool,
    endpoint: Box<str>,
    gauge: sluice_metrics::PerCoreGauge,
    worker: usize,
}

/// HTTP/2 over `io`, its driver task started.
async fn handshake<T>(
    builder: &h2::client::Builder,
    io: T,
    driving: Driving<'_>,
) -> Result<h2::client::SendRequest<Bytes>, h2::Error>
where
    T: monoio_compat::AsyncRead + monoio_compat::AsyncWrite + Unpin + 'static,
{
    let (send, connection) = builder
        .handshake::<_, Bytes>(sluice_grpc::frames::FrameIo(io))
        .await?;
    let settled = drive(
        connection,
        driving.closed,
        driving.settings,
        driving.endpoint,
        (driving.gauge, driving.worker),
    );
    // Use the connection only once the server's SETTINGS apply, so its stream limit is known
    // before streams are counted against it.
    if settled.await.is_err() {
        return Err(h2::Error::from(h2::Reason::CONNECT_ERROR));
    }
    Ok(send)
}

/// Why keepalive gave a connection up.
#[derive(Debug, thiserror::Error)]
enum KeepaliveFailure {
    #[error(transparent)]
    Ping(h2::Error),
    #[error("no answer to the first PING within {0:?}")]
    FirstPingTimeout(Duration),
    #[error("no PING answer within {0:?}")]
    PingTimeout(Duration),
}

/// Runs a connection and pings it every keepalive interval; a ping unanswered within the
/// keepalive timeout ends it (its streams fail and new requests go elsewhere). The returned
/// channel fires when the first PING is answered: a server sends its SETTINGS before that
/// answer, so from then on the connection's limits are the server's.
fn drive<T>(
    mut connection: h2::client::Connection<T, Bytes>,
    closed: Rc<Cell<bool>>,
    settings: &ConnectionPool,
    endpoint: Box<str>,
    (gauge, worker): (sluice_metrics::PerCoreGauge, usize),
) -> futures_channel::oneshot::Receiver<()>
where
    T: monoio_compat::AsyncRead + monoio_compat::AsyncWrite + Unpin + 'static,
{
    let interval = settings.keepalive_interval;
    let timeout = settings.keepalive_timeout;
    let mut ping_pong = connection.ping_pong();
    let (settled, settled_receiver) = futures_channel::oneshot::channel();
    gauge.inc(worker);
    sluice_runtime::spawn_contained("gateway-keepalive", async move {
        let keepalive = async {
            let Some(ping_pong) = ping_pong.as_mut() else {
                let _ = settled.send(());
                return std::future::pending::<KeepaliveFailure>().await;
            };
            match monoio::time::timeout(timeout, ping_pong.ping(h2::Ping::opaque())).await {
                Ok(Ok(_)) => {
                    let _ = settled.send(());
                }
                Ok(Err(error)) => return KeepaliveFailure::Ping(error),
                Err(_) => return KeepaliveFailure::FirstPingTimeout(timeout),
            }
            loop {
                monoio::time::sleep(interval).await;
                match monoio::time::timeout(timeout, ping_pong.ping(h2::Ping::opaque())).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return KeepaliveFailure::Ping(error),
                    Err(_) => return KeepaliveFailure::PingTimeout(timeout),
                }
            }
        };
        monoio::select! {
            ended = &mut connection => {
                if let Err(error) = ended {
                    tracing::debug!(%endpoint, %error, "upstream connection ended");
                }
            }
            why = keepalive => tracing::warn!(%endpoint, %why, "upstream connection dropped: keepalive failed"),
        }
        closed.set(true);
        gauge.dec(worker);
    });
    settled_receiver
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
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let connections = ServerConnections {
            client_tls: Arc::new(tls),
            connections: RefCell::default(),
            connecting: Cell::new(0),
            connected: event_listener::Event::new(),
        };
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
