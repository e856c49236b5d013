//! The gateway listener: one [`GatewayHandler`] per worker core, and per client connection the
//! TLS accept (SNI picks the cluster), then HTTP/2 or HTTP/1.1 by ALPN, with HTTP/1.1 upgrades
//! (exec, attach, port-forward) taken aside before hyper sees the connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use monoio::net::TcpStream;
use monoio_compat::TcpStreamCompat;
use sluice_gateway::flow_control::CoreShare;
use sluice_gateway::identity::user_from_certificate;
use sluice_runtime::{ConnectionContext, ConnectionHandler, HandlerFactory, WorkerContext};
use tokio_rustls::server::TlsStream;

use crate::answer::record_connection;
use crate::handler::{ClientConnection, GatewayHandler};
use crate::state::Gateway;
use crate::tls::accept;
use crate::upgrade::{is_upgrade, parse_request, read_head, Rewind};

/// Longest time a client may take to finish the TLS handshake (and to send its first request
/// head on HTTP/1.1).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gateway listener: builds one [`GatewayHandler`] per worker core.
#[derive(Debug, Clone)]
pub struct GatewayEndpoint {
    pub gateway: Arc<Gateway>,
    pub workers: usize,
}

impl HandlerFactory for GatewayEndpoint {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        let share = CoreShare {
            core_index: worker.index as u32,
            core_count: self.workers.max(1) as u32,
        };
        Rc::new(GatewayHandler::new(
            self.gateway.clone(),
            worker.index,
            share,
        ))
    }
}

#[derive(Clone, Copy)]
struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, future: F) {
        sluice_runtime::spawn_contained("gateway-hyper-task", future);
    }
}

impl ConnectionHandler for GatewayHandler {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let Some((stream, client, http2)) = self.handshake(stream, &conn).await else {
                return;
            };
            if http2 {
                self.serve_http2(stream, client, &conn).await;
            } else {
                self.serve_http1(stream, client, &conn).await;
            }
        })
    }
}

/// The client's side of an accepted connection.
type ClientStream = TlsStream<TcpStreamCompat>;

impl GatewayHandler {
    /// TLS with the cluster the client's server name picks; what the connection is known by,
    /// and whether it speaks HTTP/2. `None` when refused (counted and logged here).
    async fn handshake(
        &self,
        stream: TcpStream,
        conn: &ConnectionContext,
    ) -> Option<(ClientStream, Rc<ClientConnection>, bool)> {
        let local_ip = stream
            .local_addr()
            .map(|address| address.ip())
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        let _ = stream.set_nodelay(true);
        let io = sluice_grpc::transport::compat(stream);
        let accepted = monoio::select! {
            accepted = accept(&self.gateway, io, local_ip) => accepted,
            _ = monoio::time::sleep(HANDSHAKE_TIMEOUT) => return None,
            _ = conn.draining() => return None,
        };
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                record_connection(&error, &self.gateway.metrics, self.worker, conn.peer);
                return None;
            }
        };
        let (_, session) = accepted.stream.get_ref();
        let certificate_user = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|der| user_from_certificate(der).ok());
        let http2 = session.alpn_protocol() == Some(sluice_grpc::tls::ALPN_H2);
        let client = Rc::new(ClientConnection {
            cluster: accepted.generation.snapshot.clusters()[accepted.cluster]
                .name
                .clone(),
            peer: conn.peer.ip(),
            certificate_user,
        });
        Some((accepted.stream, client, http2))
    }

    async fn serve_http2(
        self: &Rc<Self>,
        stream: ClientStream,
        client: Rc<ClientConnection>,
        conn: &ConnectionContext,
    ) {
        let handler = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let handler = handler.clone();
            let client = client.clone();
            async move { Ok::<_, Infallible>(handler.serve(&client, request).await) }
        });
        let connection = hyper::server::conn::http2::Builder::new(LocalExec)
            .max_concurrent_streams(1000)
            .serve_connection(TokioIo::new(stream), service);
        let mut connection = std::pin::pin!(connection);
        monoio::select! {
            _ = connection.as_mut() => return,
            _ = conn.draining() => connection.as_mut().graceful_shutdown(),
        }
        let _ = connection.await;
    }

    /// Upgrades (exec, attach, port-forward) need the raw connection: the first request head is
    /// read here, and anything but an upgrade is handed to hyper with the head replayed.
    async fn serve_http1(
        self: &Rc<Self>,
        mut stream: ClientStream,
        client: Rc<ClientConnection>,
        conn: &ConnectionContext,
    ) {
        let mut buffer = bytes::BytesMut::with_capacity(8 * 1024);
        let head_length = monoio::select! {
            read = read_head(&mut stream, &mut buffer) => match read {
                Ok(length) => length,
                Err(_) => return,
            },
            _ = monoio::time::sleep(HANDSHAKE_TIMEOUT) => return,
            _ = conn.draining() => return,
        };
        if let Ok(head) = parse_request(&buffer[..head_length]) {
            if is_upgrade(&head.headers) {
                let early = buffer.split_off(head_length).freeze();
                self.upgrade(&client, stream, head, early).await;
                return;
            }
        }
        let handler = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let handler = handler.clone();
            let client = client.clone();
            async move { Ok::<_, Infallible>(handler.serve(&client, request).await) }
        });
        let io = TokioIo::new(Rewind::new(buffer.freeze(), stream));
        let connection = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
        let mut connection = std::pin::pin!(connection);
        monoio::select! {
            _ = connection.as_mut() => return,
            _ = conn.draining() => connection.as_mut().graceful_shutdown(),
        }
        let _ = connection.await;
    }
}
