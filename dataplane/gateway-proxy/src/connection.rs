//! The gateway listener: one [`GatewayHandler`] per worker core, and per client connection the
//! TLS accept (SNI picks the cluster), then HTTP/2 or HTTP/1.1 by ALPN, with HTTP/1.1 upgrades
//! (exec, attach, port-forward) taken aside before hyper sees the connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use monoio::net::TcpStream;
use monoio_compat::hyper::MonoioTimer;
use sluice_gateway::flow_control::CoreShare;
use sluice_gateway::identity::user_from_certificate;
use sluice_gateway::status::GatewayError;
use sluice_grpc::transport::CompatStream;
use sluice_grpc::transport::{IdleClock, GOAWAY_GRACE};
use sluice_runtime::{
    CloseReason, ConnectionContext, ConnectionHandler, HandlerFactory, RequestCounter,
    WorkerContext,
};
use tokio_rustls::server::TlsStream;

use crate::activity::{ActiveBody, Activity};
use crate::answer::record_connection;
use crate::error::ProxyError;
use crate::handler::{ClientConnection, GatewayHandler};
use crate::head::{is_upgrade, parse_request, read_head, Rewind};
use crate::state::{Gateway, Generation};

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
            // The handshake and HTTP/1.1 are boxed: this future lives as long as the
            // connection, and their states inline would make every HTTP/2 client's hold room
            // for them (docs/PERFORMANCE.md, "Issue 36: what a connection's task holds").
            let handshake = Box::pin(self.handshake(stream, &conn));
            let Some((stream, client, http2)) = handshake.await else {
                return;
            };
            if http2 {
                self.serve_http2(stream, client, &conn).await;
            } else {
                Box::pin(self.serve_http1(stream, client, &conn)).await;
            }
        })
    }
}

/// The client's side of an accepted connection.
type ClientStream = TlsStream<CompatStream>;

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
        let io = match sluice_grpc::transport::compat(stream) {
            Ok(io) => io,
            Err(error) => {
                tracing::warn!(peer = %conn.peer, %error, "cannot register the connection for polling");
                return None;
            }
        };
        let accepted = monoio::select! {
            accepted = accept(&self.gateway, io, local_ip) => accepted,
            _ = monoio::time::sleep(conn.limits().handshake_timeout) => {
                conn.closed_by(CloseReason::HandshakeTimeout);
                return None;
            }
            // A connection accepted just before the drain finishes its handshake (the client
            // may be sending its request already): it is served, then goes away.
            _ = drained_for_a_moment(conn) => return None,
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
            .and_then(|der| user_from_certificate(der).ok())
            .map(Rc::new);
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

    /// Not an `async fn`: an `async fn`'s arguments stay in its future for as long as it runs,
    /// the connection's whole life, and `stream` (the TLS session) is over a kilobyte that
    /// hyper's connection holds again. The connection is built here and only it moves in.
    fn serve_http2<'a>(
        self: &Rc<Self>,
        stream: ClientStream,
        client: Rc<ClientConnection>,
        conn: &'a ConnectionContext,
    ) -> impl Future<Output = ()> + use<'a> {
        let activity = Rc::new(Activity::default());
        let limits = conn.limits();
        let mut builder = hyper::server::conn::http2::Builder::new(LocalExec);
        builder
            .timer(MonoioTimer)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout)
            .max_concurrent_streams(1000);
        let service = self.service(client, &activity, conn.request_counter(), conn.closing());
        let io = TokioIo::new(sluice_grpc::frames::FrameIo(stream));
        // Boxed here: pinned inside the future, it would be held twice (moved in, then pinned).
        let mut connection = Box::pin(builder.serve_connection(io, service));
        async move {
            let shut_down = |connection: Pin<&mut _>| {
                hyper::server::conn::http2::Connection::graceful_shutdown(connection)
            };
            drive(
                connection.as_mut(),
                shut_down,
                &activity,
                conn,
                CloseReason::KeepaliveTimeout,
            )
            .await;
        }
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
            _ = monoio::time::sleep(conn.limits().header_timeout) => {
                conn.closed_by(CloseReason::HeaderTimeout);
                return;
            }
            _ = drained_for_a_moment(conn) => return,
        };
        if let Ok(head) = parse_request(&buffer[..head_length]) {
            if is_upgrade(&head.headers) {
                let early = buffer.split_off(head_length).freeze();
                // Boxed: an upgrade's relay is kilobytes that every HTTP/1.1 connection's
                // future would otherwise carry, though few connections upgrade.
                Box::pin(self.upgrade(&client, stream, head, early)).await;
                return;
            }
        }
        let activity = Rc::new(Activity::default());
        let service = self.service(client, &activity, conn.request_counter(), conn.closing());
        let io = TokioIo::new(Rewind::new(buffer.freeze(), stream));
        // hyper's header read timeout also runs while a kept-alive connection waits for its
        // next request head, so on HTTP/1.1 it is the idle limit between requests too.
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(MonoioTimer)
            .header_read_timeout(conn.limits().header_timeout)
            .serve_connection(io, service);
        let connection = std::pin::pin!(connection);
        let shut_down = |connection: Pin<&mut _>| {
            hyper::server::conn::http1::Connection::graceful_shutdown(connection)
        };
        drive(
            connection,
            shut_down,
            &activity,
            conn,
            CloseReason::HeaderTimeout,
        )
        .await;
    }

    /// The hyper service of one client connection: each request counted in flight until its
    /// response body ends.
    fn service(
        self: &Rc<Self>,
        client: Rc<ClientConnection>,
        activity: &Rc<Activity>,
        requests: RequestCounter,
        closing: sluice_runtime::Closing,
    ) -> impl hyper::service::Service<
        http::Request<hyper::body::Incoming>,
        Response = http::Response<ActiveBody>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<ActiveBody>, Infallible>>,
    > {
        let handler = self.clone();
        let activity = activity.clone();
        hyper::service::service_fn(move |request| {
            let handler = handler.clone();
            let client = client.clone();
            let active = activity.enter();
            requests.served();
            let watch = crate::activity::is_watch(request.uri()).then(|| closing.clone());
            async move {
                let response = handler.serve(&client, request).await;
                let watch = watch.filter(|_| crate::activity::is_json(&response));
                Ok::<_, Infallible>(response.map(|body| match watch {
                    Some(closing) => ActiveBody::watch(body, active, closing),
                    None => ActiveBody::new(body, active),
                }))
            }
        })
    }
}

/// An accepted client connection: which cluster it is for and the TLS stream.
pub struct Accepted {
    pub generation: Arc<Generation>,
    pub cluster: usize,
    pub stream: TlsStream<CompatStream>,
}

/// Reads the ClientHello, picks the cluster by server name (without SNI, e.g. a client that
/// dialled an IP address, by the listener's local address, which may be configured as a
/// hostname) and completes the handshake with that cluster's config. Refuses a name no cluster
/// serves ([`GatewayError::UnknownHost`]) and failed handshakes ([`ProxyError::Handshake`]).
pub async fn accept(
    gateway: &Gateway,
    io: CompatStream,
    local_ip: std::net::IpAddr,
) -> Result<Accepted, ProxyError> {
    let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .map_err(ProxyError::Handshake)?;
    let generation = gateway.current();
    let local = local_ip.to_string();
    let requested = start
        .client_hello()
        .server_name()
        .map(str::to_string)
        .unwrap_or(local);
    let Some((cluster, _)) = generation.snapshot.cluster_for_host(&requested) else {
        return Err(GatewayError::UnknownHost { host: requested }.into());
    };
    let config = generation.clusters[cluster].server_tls.clone();
    let stream = start
        .into_stream(config)
        .await
        .map_err(ProxyError::Handshake)?;
    Ok(Accepted {
        generation,
        cluster,
        stream,
    })
}

/// Resolves [`GOAWAY_GRACE`] after the connection started draining.
async fn drained_for_a_moment(conn: &ConnectionContext) {
    conn.draining().await;
    monoio::time::sleep(GOAWAY_GRACE).await;
}

/// Until the first request arrived, for at most [`GOAWAY_GRACE`]. A connection that started
/// serving while the process already drained is asked to go away only then: closing it right
/// away (hyper closes an HTTP/2 connection still in its handshake without a GOAWAY) would drop
/// the request its client already sent.
async fn first_request_or_grace(activity: &Activity) {
    let deadline = monoio::time::Instant::now() + GOAWAY_GRACE;
    while !activity.seen_any() && monoio::time::Instant::now() < deadline {
        monoio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Runs a client connection to its end under the listener's limits: closed when nothing was in
/// flight for `idle_timeout`, asked to finish at drain or `max_connection_age`. hyper's own
/// timer ends it on `timeout_reason` (unanswered keepalive PING, slow request head).
/// `shut_down` asks it to finish (GOAWAY, or close after the current request on HTTP/1.1).
async fn drive<C: Future<Output = hyper::Result<()>>>(
    mut connection: Pin<&mut C>,
    shut_down: impl Fn(Pin<&mut C>),
    activity: &Activity,
    conn: &ConnectionContext,
    timeout_reason: CloseReason,
) {
    let mut clock = IdleClock::new(conn.limits(), monoio::time::Instant::now());
    let late = conn.is_draining();
    let mut drain = std::pin::pin!(async {
        conn.connection_draining().await;
        if late {
            first_request_or_grace(activity).await;
        }
    });
    let mut draining = false;
    loop {
        monoio::select! {
            biased;
            ended = connection.as_mut() => {
                if ended.is_err_and(|error| error.is_timeout()) {
                    conn.closed_by(timeout_reason);
                }
                return;
            }
            () = &mut drain, if !draining => {
                draining = true;
                shut_down(connection.as_mut());
            }
            () = monoio::time::sleep_until(clock.next_check()), if !draining => {
                let now = monoio::time::Instant::now();
                if activity.take_arrived() {
                    clock.request_arrived(now);
                }
                if let Some(reason) = clock.check(now, activity.busy()) {
                    conn.closed_by(reason);
                    shut_down(connection.as_mut());
                    // Nothing was in flight: the client gets a moment to read the GOAWAY.
                    let _ = monoio::time::timeout(GOAWAY_GRACE, connection.as_mut()).await;
                    return;
                }
            }
        }
    }
}
