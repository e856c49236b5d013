//! Setting up one upstream HTTP/2 connection for the pool (`pool.rs`): TCP, TLS, the HTTP/2
//! handshake with our settings, and the task that drives the connection and pings it.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use monoio::net::TcpStream;
use sluice_gateway::cluster::spec::ConnectionPool;
use sluice_gateway::cluster::CompiledServer;

use crate::error::UpstreamFailure;

/// A server's stream limit per connection until its SETTINGS say (h2's initial assumption).
pub(crate) const ASSUMED_SERVER_STREAMS: u32 = 100;

/// One upstream HTTP/2 connection.
#[derive(Debug)]
pub(crate) struct UpstreamConnection {
    pub(crate) send: h2::client::SendRequest<Bytes>,
    pub(crate) in_flight: Cell<u32>,
    /// Set by the connection's driver task when the connection ends.
    pub(crate) closed: Rc<Cell<bool>>,
}

pub(crate) async fn connect(
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
            .initial_max_send_streams(ASSUMED_SERVER_STREAMS as usize)
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
