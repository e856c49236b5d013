//! The connections a [`Transport`](crate::Transport) sends on: TCP, rustls offering ALPN `h2`
//! then `http/1.1`, hyper's client.
//!
//! When the server picks h2, one connection carries every request of the Transport, each on
//! its own stream (the server's SETTINGS bound how many are open at once; more wait for a
//! free stream). It is dialled at the first request and again at the first one after it
//! closed (GOAWAY, an error, a keepalive ping unanswered): a VM agent's four watches and its
//! reports then cost the control plane one connection instead of five. When the server picks
//! HTTP/1.1 (or no ALPN) each request dials its own connection, as before: a watch holds its
//! connection for minutes anyway.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::Full;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::WatchError;

/// An idle shared connection is pinged this often, so a half-open one (a peer gone without a
/// FIN) is noticed and replaced instead of swallowing every later request.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A ping unanswered this long closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response header block accepted on the shared connection (the API server's are a
/// few hundred bytes).
const MAX_HEADER_LIST: u32 = 64 << 10;

/// Where and how to dial, and the shared h2 connection once there is one.
pub(crate) struct Connector {
    pub host: String,
    pub port: u16,
    pub authority: String,
    pub server_name: ServerName<'static>,
    pub tls: TlsConnector,
    pub connect_timeout: Duration,
    /// `false`: ALPN offers only `http/1.1` (the config's `http2`).
    pub offer_h2: bool,
    /// The last dial's server picked HTTP/1.1: requests dial without waiting for the slot.
    http1_server: AtomicBool,
    slot: tokio::sync::Mutex<Option<Shared>>,
}

/// The shared h2 connection.
#[derive(Clone)]
struct Shared {
    sender: http2::SendRequest<Full<Bytes>>,
    driver: Arc<AbortOnDrop>,
}

impl From<Shared> for Connection {
    fn from(shared: Shared) -> Self {
        Connection {
            sender: Sender::Http2(shared.sender),
            driver: shared.driver,
        }
    }
}

/// A ready way to send one request, and the task driving its connection.
pub(crate) struct Connection {
    pub sender: Sender,
    /// Every response still streaming holds a clone: a replaced connection finishes its open
    /// streams, and its driver is aborted when the last holder (the Transport's slot or a
    /// response) drops.
    pub driver: Arc<AbortOnDrop>,
}

pub(crate) enum Sender {
    /// A connection of this request's own (never put back: HTTP/1.1 has no multiplexing).
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

/// The slot's connection if it can still take requests; `None`: dial again.
fn reusable(slot: Option<&Shared>) -> Option<Shared> {
    slot.filter(|shared| !shared.sender.is_closed()).cloned()
}

fn holds(slot: Option<&Shared>, driver: &Arc<AbortOnDrop>) -> bool {
    slot.is_some_and(|shared| Arc::ptr_eq(&shared.driver, driver))
}

impl Connector {
    pub fn new(
        host: String,
        port: u16,
        authority: String,
        server_name: ServerName<'static>,
        tls: TlsConnector,
        connect_timeout: Duration,
        offer_h2: bool,
    ) -> Self {
        Self {
            host,
            port,
            authority,
            server_name,
            tls,
            connect_timeout,
            offer_h2,
            http1_server: AtomicBool::new(false),
            slot: tokio::sync::Mutex::new(None),
        }
    }

    /// A connection for one request: the shared h2 one (dialled if there is none or it
    /// closed), or a new HTTP/1.1 one.
    pub async fn connection(&self) -> Result<Connection, WatchError> {
        if !self.offer_h2 || self.http1_server.load(Ordering::Relaxed) {
            let tls = self.dial().await?;
            if negotiated_h2(&tls) {
                // The server speaks h2 again (upgraded, or another replica answered).
                let mut slot = self.slot.lock().await;
                return self.install(tls, &mut slot).await;
            }
            return http1_connection(tls).await;
        }
        // Holding the slot while dialling: concurrent first requests share one dial.
        let mut slot = self.slot.lock().await;
        if let Some(shared) = reusable(slot.as_ref()) {
            return Ok(shared.into());
        }
        *slot = None;
        let tls = self.dial().await?;
        if negotiated_h2(&tls) {
            return self.install(tls, &mut slot).await;
        }
        drop(slot);
        self.http1_server.store(true, Ordering::Relaxed);
        http1_connection(tls).await
    }

    /// Empties the slot if it still holds the connection `driver` drives: a request found it
    /// unable to take more, before the driver noticed.
    pub async fn discard(&self, driver: &Arc<AbortOnDrop>) {
        let mut slot = self.slot.lock().await;
        if holds(slot.as_ref(), driver) {
            *slot = None;
        }
    }

    /// Starts h2 on `tls` and puts it in the slot for the next requests.
    async fn install(
        &self,
        tls: TlsStream<TcpStream>,
        slot: &mut Option<Shared>,
    ) -> Result<Connection, WatchError> {
        self.http1_server.store(false, Ordering::Relaxed);
        let handshake = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake(TokioIo::new(tls));
        let (sender, connection) = tokio::time::timeout(self.connect_timeout, handshake)
            .await
            .map_err(|_| WatchError::Timeout {
                what: "connect",
                after: self.connect_timeout,
            })?
            .map_err(|error| WatchError::Http(format!("h2 handshake: {error}")))?;
        tracing::debug!(address = %self.authority, "watch client connected (h2, shared)");
        let shared = Shared {
            sender,
            driver: Arc::new(spawn_contained("h2 connection", connection)),
        };
        *slot = Some(shared.clone());
        Ok(shared.into())
    }

    /// TCP connect and TLS handshake, within `connect_timeout`.
    async fn dial(&self) -> Result<TlsStream<TcpStream>, WatchError> {
        let connect = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|error| WatchError::Connect {
                    address: self.authority.clone(),
                    reason: error.to_string(),
                })?;
            let _ = tcp.set_nodelay(true);
            self.tls
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|source| WatchError::Tls {
                    address: self.authority.clone(),
                    source,
                })
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| WatchError::Timeout {
                what: "connect",
                after: self.connect_timeout,
            })?
    }
}

fn negotiated_h2(tls: &TlsStream<TcpStream>) -> bool {
    tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice())
}

async fn http1_connection(tls: TlsStream<TcpStream>) -> Result<Connection, WatchError> {
    let (sender, connection) = http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|error| WatchError::Http(format!("handshake: {error}")))?;
    Ok(Connection {
        sender: Sender::Http1(sender),
        driver: Arc::new(spawn_contained("connection", connection)),
    })
}

/// Aborts a spawned task when dropped, so a connection never outlives its users.
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Spawns `future` with its panics caught and logged: a panic in hyper's connection driver
/// ends that connection (its requests see an error and are retried), not the thread.
fn spawn_contained<F, E>(what: &'static str, future: F) -> AbortOnDrop
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    AbortOnDrop(tokio::spawn(async move {
        match std::panic::AssertUnwindSafe(future).catch_unwind().await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "watch client {what} ended"),
            Err(_) => tracing::error!("watch client {what} task panicked"),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An h2 connection over an in-memory pipe whose server side `serve` drives.
    async fn piped(
        serve: impl FnOnce(tokio::io::DuplexStream) -> tokio::task::JoinHandle<()>,
    ) -> (Shared, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let server = serve(server);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(client))
            .await
            .expect("handshake");
        let shared = Shared {
            sender,
            driver: Arc::new(spawn_contained("test", connection)),
        };
        (shared, server)
    }

    fn h2_server(io: tokio::io::DuplexStream) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_request| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service)
                .await;
        })
    }

    #[tokio::test]
    async fn an_open_connection_is_reused_and_a_closed_one_is_not() {
        assert!(reusable(None).is_none());
        let (connection, server) = piped(h2_server).await;
        let Some(again) = reusable(Some(&connection)) else {
            panic!("an open connection is reused");
        };
        assert!(Arc::ptr_eq(&again.driver, &connection.driver));
        // The server goes away: the client's driver sees the connection end.
        server.abort();
        let closed = async {
            while !connection.sender.is_closed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("the client notices the closed connection");
        assert!(reusable(Some(&connection)).is_none());
    }

    #[tokio::test]
    async fn only_the_connection_that_failed_is_discarded() {
        let (first, _server) = piped(h2_server).await;
        let (second, _other) = piped(h2_server).await;
        assert!(holds(Some(&first), &first.driver));
        // A request that failed on an older connection leaves a newer one in place.
        assert!(!holds(Some(&second), &first.driver));
        assert!(!holds(None, &first.driver));
    }

    #[tokio::test]
    async fn a_panicking_driver_ends_its_connection_not_the_runtime() {
        let driver = spawn_contained("test", async {
            panic!("driver bug");
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(driver.0.is_finished());
    }
}
