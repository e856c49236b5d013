//! HTTP/2 connections on monoio: the `h2` crate over `monoio-compat` (tokio I/O traits on monoio
//! streams), cleartext (h2c with prior knowledge) or TLS. The connection future is driven by a
//! task on the current worker; stream handles may be used from any task.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use monoio::net::TcpStream;
use monoio_compat::{AsyncRead, AsyncWrite};
use rustls::pki_types::ServerName;
use sluice_runtime::spawn_contained;

pub use crate::serve::{serve, serve_limited, IdleClock, ServeLimits, GOAWAY_GRACE};

/// HTTP/2 settings of one connection.
#[derive(Debug, Clone)]
pub struct H2Settings {
    pub max_concurrent_streams: u32,
    pub initial_stream_window: u32,
    pub initial_connection_window: u32,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
}

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 1024,
            // Larger than the 64 KiB default so one stream can fill a loopback or LAN pipe.
            initial_stream_window: 1024 * 1024,
            initial_connection_window: 8 * 1024 * 1024,
            max_frame_size: 64 * 1024,
            max_header_list_size: 64 * 1024,
        }
    }
}

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {address}: {source}")]
    Tcp {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {address} failed: {source}")]
    Tls {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP/2 handshake with {address} failed: {source}")]
    H2 {
        address: SocketAddr,
        #[source]
        source: h2::Error,
    },
    #[error("no connection to {address} within {after:?} (connect, TLS and HTTP/2 handshakes)")]
    TimedOut {
        address: SocketAddr,
        after: Duration,
    },
}

/// Bounds for [`connect_within`]: a peer that swallows packets (a partition, a black-holed
/// route) fails the connection instead of holding whoever waits on it.
#[derive(Debug, Clone, Copy)]
pub struct ConnectBounds {
    /// TCP connect, TLS and HTTP/2 handshakes together.
    pub connect: Duration,
    /// TCP_USER_TIMEOUT: once data sent stays unacknowledged this long, the kernel closes the
    /// connection and every stream on it fails.
    pub unacked: Duration,
}

/// How many bytes of small-DATA-frame overhead a connection may have buffered before h2 calls
/// the peer abusive (ENHANCE_YOUR_CALM). h2's default (25,600: about 100 small frames) cuts
/// healthy gRPC connections: a server stream of many tiny messages may legitimately buffer up
/// to a flow-control window of them while the reading core is busy (CI saw a 10,000-message
/// stream cut at 256 KiB). Scale it with the connection window, one 256-byte unit per 32 bytes
/// of window: still a bound, far above what a healthy peer buffers.
pub fn small_frame_budget(settings: &H2Settings) -> usize {
    (settings.initial_connection_window as usize / 32).max(100) * 256
}

/// A monoio TCP stream as tokio-style consumers (h2, tokio-rustls, hyper) see it.
pub type CompatStream = crate::gather::GatherStream;

/// Wraps a monoio stream for tokio-style consumers (h2, tokio-rustls, hyper).
///
/// The adapter gathers writes until a flush (one socket write and, small responses, one TCP
/// segment per batch), and reads by waiting for readiness, then `recv` into the consumer's
/// buffer (a quiet connection holds no read buffer): see `gather.rs`. monoio's
/// readiness-based `poll-io` streams were tried as well: with them a call hung until its
/// deadline when connections were retired by age (`attacks_slowloris.rs::connections_retired_by_age_cost_no_call`
/// failed 3 runs in 8, on both drivers); the cause is not found yet (docs/PERFORMANCE.md,
/// "Readiness-based I/O A/B"). `Result` so that a registering adapter can come back without
/// touching the callers.
pub fn compat(stream: TcpStream) -> std::io::Result<CompatStream> {
    Ok(crate::gather::GatherStream::new(stream))
}

/// An open HTTP/2 client connection.
pub struct ClientConnection {
    /// Opens streams; clone it to share the connection.
    pub send_request: h2::client::SendRequest<Bytes>,
    /// The task driving the connection's I/O; it ends when the connection does (peer gone, or
    /// every `SendRequest` and stream dropped), which is how owners notice a lost connection.
    pub driver: monoio::task::JoinHandle<Option<()>>,
}

impl ClientConnection {
    /// A handle ready to open one stream (waits for the peer's stream limit).
    pub async fn ready(&self) -> Result<h2::client::SendRequest<Bytes>, h2::Error> {
        self.send_request.clone().ready().await
    }
}

impl std::fmt::Debug for ClientConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConnection").finish_non_exhaustive()
    }
}

/// Opens an HTTP/2 client connection (TLS when `tls` is given) and spawns its driver task.
pub async fn connect(
    address: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    settings: &H2Settings,
) -> Result<ClientConnection, ConnectError> {
    let stream = TcpStream::connect(address)
        .await
        .map_err(|source| ConnectError::Tcp { address, source })?;
    handshake(stream, address, tls, settings).await
}

/// [`connect`] within `bounds`.
pub async fn connect_within(
    address: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    settings: &H2Settings,
    bounds: ConnectBounds,
) -> Result<ClientConnection, ConnectError> {
    let connect = async {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|source| ConnectError::Tcp { address, source })?;
        set_user_timeout(&stream, bounds.unacked)
            .map_err(|source| ConnectError::Tcp { address, source })?;
        handshake(stream, address, tls, settings).await
    };
    monoio::time::timeout(bounds.connect, connect)
        .await
        .map_err(|_| ConnectError::TimedOut {
            address,
            after: bounds.connect,
        })?
}

fn set_user_timeout(stream: &TcpStream, unacked: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let millis = libc::c_uint::try_from(unacked.as_millis()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: setsockopt on the stream's open socket with a c_uint value of the right size.
    let result = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            std::ptr::from_ref(&millis).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

async fn handshake(
    stream: TcpStream,
    address: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    settings: &H2Settings,
) -> Result<ClientConnection, ConnectError> {
    let _ = stream.set_nodelay(true);
    let io = compat(stream).map_err(|source| ConnectError::Tcp { address, source })?;
    match tls {
        Some((config, server_name)) => {
            let tls_stream = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, io)
                .await
                .map_err(|source| ConnectError::Tls { address, source })?;
            client_handshake(tls_stream, settings, address).await
        }
        None => client_handshake(io, settings, address).await,
    }
}

async fn client_handshake<T>(
    io: T,
    settings: &H2Settings,
    address: SocketAddr,
) -> Result<ClientConnection, ConnectError>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    client_over(io, settings, address)
        .await
        .map_err(|source| ConnectError::H2 { address, source })
}

/// An HTTP/2 client connection over any byte stream: sockets (above), and the gateway's link
/// in memory to the tunnel router of its own process. `peer` names the other end in logs.
pub async fn client_over<T>(
    io: T,
    settings: &H2Settings,
    peer: impl std::fmt::Display + 'static,
) -> Result<ClientConnection, h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (send_request, connection) = h2::client::Builder::new()
        .initial_window_size(settings.initial_stream_window)
        .initial_connection_window_size(settings.initial_connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.max_header_list_size)
        .max_concurrent_reset_streams(4096)
        .data_frame_budget(small_frame_budget(settings))
        .handshake::<_, Bytes>(crate::frames::FrameIo(io))
        .await?;
    let driver = spawn_contained("grpc-client-connection", async move {
        if let Err(error) = connection.await {
            tracing::debug!(%peer, %error, "HTTP/2 client connection ended");
        }
    });
    Ok(ClientConnection {
        send_request,
        driver,
    })
}

/// Sends `data` on `stream` within the peer's flow-control window: waits for capacity instead of
/// buffering without bound, which is how backpressure crosses a proxy.
pub async fn send_data(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
    end_of_stream: bool,
) -> Result<(), h2::Error> {
    if data.is_empty() {
        // An empty DATA frame without END_STREAM says nothing, and h2 peers close a connection
        // after 100 of them (a forwarder relaying the empty final chunk of a stream it reads
        // would otherwise send one per call).
        return if end_of_stream {
            stream.send_data(data, true)
        } else {
            Ok(())
        };
    }
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = match poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(granted) => granted?,
            // The stream was closed or reset: the reset reason tells why.
            None => {
                return Err(poll_fn(|cx| stream.poll_reset(cx))
                    .await
                    .map_or_else(|error| error, h2::Error::from))
            }
        };
        if granted == 0 {
            continue;
        }
        let chunk = data.split_to(granted.min(data.len()));
        stream.send_data(chunk, end_of_stream && data.is_empty())?;
    }
    Ok(())
}

/// Receives the next DATA chunk and returns its flow-control credit at once; the caller has
/// taken ownership of the bytes. `None` at end of stream.
pub async fn recv_data(stream: &mut RecvStream) -> Option<Result<Bytes, h2::Error>> {
    let chunk = stream.data().await?;
    if let Ok(bytes) = &chunk {
        let _ = stream.flow_control().release_capacity(bytes.len());
    }
    Some(chunk)
}

/// Receives the next DATA chunk and keeps its flow-control credit: the caller returns it with
/// [`release`] once the bytes were passed on. A forwarder that does so buffers at most what
/// the windows it advertised allow, and a slow receiver slows the sender (backpressure end to
/// end) instead of the bytes piling up in the forwarder.
pub async fn recv_data_held(stream: &mut RecvStream) -> Option<Result<Bytes, h2::Error>> {
    stream.data().await
}

/// Returns `bytes` of flow-control credit of chunks taken with [`recv_data_held`].
pub fn release(stream: &mut RecvStream, bytes: usize) {
    if bytes > 0 {
        let _ = stream.flow_control().release_capacity(bytes);
    }
}

/// [`recv_data`] without waiting: `None` if no DATA (or end of stream) has arrived yet. Lets a
/// forwarder gather what already arrived into one outgoing frame before it waits.
pub async fn recv_data_now(stream: &mut RecvStream) -> Option<Option<Result<Bytes, h2::Error>>> {
    let polled = poll_fn(|cx| std::task::Poll::Ready(stream.poll_data(cx))).await;
    match polled {
        std::task::Poll::Pending => None,
        std::task::Poll::Ready(chunk) => {
            if let Some(Ok(bytes)) = &chunk {
                let _ = stream.flow_control().release_capacity(bytes.len());
            }
            Some(chunk)
        }
    }
}

/// The trailers of a stream whose DATA has ended, without waiting: `None` if they have not
/// arrived yet.
pub async fn recv_trailers_now(
    stream: &mut RecvStream,
) -> Option<Result<Option<HeaderMap>, h2::Error>> {
    let polled = poll_fn(|cx| std::task::Poll::Ready(stream.poll_trailers(cx))).await;
    match polled {
        std::task::Poll::Pending => None,
        std::task::Poll::Ready(trailers) => Some(trailers),
    }
}
