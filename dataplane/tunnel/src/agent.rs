//! The agent (after agentk): dials out to nodes, keeps a pool of idle tunnels on each, and
//! forwards every tunnelled call to the local gRPC backend, any method, any streaming shape.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use event_listener::Event;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request};
use prometheus_client::registry::Registry;
use rustls::pki_types::ServerName;
use sluice_config::{AgentConfig, Endpoint};
use sluice_grpc::status::decode_message;
use sluice_grpc::transport::{
    connect, recv_data, recv_data_now, recv_trailers_now, send_data, ClientConnection, H2Settings,
};
use sluice_grpc::{message_pieces, Code, FrameDecoder};
use sluice_metrics::{PerCoreCounter, PerCoreGauge};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, Descriptor, Error, Header, Trailer,
};
use sluice_runtime::{BackgroundTask, StopSignal, WorkerContext};

use crate::node::{AGENT_VERSION_HEADER, CONNECTION_ID_HEADER, CONNECT_PATH};
use crate::wire::{
    data_frame, frame, frame_into, metadata_from_headers, metadata_into_headers, ReadError,
    TunnelReader,
};

/// Agent metrics (the agent runs its tunnels on one worker).
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    pub tunnels_open: PerCoreGauge,
    pub tunnels_idle: PerCoreGauge,
    pub nodes_connected: PerCoreGauge,
    pub requests: PerCoreCounter,
    pub backend_errors: PerCoreCounter,
    pub connect_failures: PerCoreCounter,
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            tunnels_open: PerCoreGauge::new(1),
            tunnels_idle: PerCoreGauge::new(1),
            nodes_connected: PerCoreGauge::new(1),
            requests: PerCoreCounter::new(1),
            backend_errors: PerCoreCounter::new(1),
            connect_failures: PerCoreCounter::new(1),
        };
        registry.register(
            "sluice_agent_tunnels_open",
            "Tunnels open to nodes",
            metrics.tunnels_open.clone(),
        );
        registry.register(
            "sluice_agent_tunnels_idle",
            "Tunnels waiting on nodes for a call",
            metrics.tunnels_idle.clone(),
        );
        registry.register(
            "sluice_agent_nodes_connected",
            "Nodes this agent has a live connection to",
            metrics.nodes_connected.clone(),
        );
        registry.register(
            "sluice_agent_requests",
            "Calls forwarded to the backend",
            metrics.requests.clone(),
        );
        registry.register(
            "sluice_agent_backend_errors",
            "Calls that could not reach the backend",
            metrics.backend_errors.clone(),
        );
        registry.register(
            "sluice_agent_connect_failures",
            "Failed attempts to connect to a node (each followed by a backoff)",
            metrics.connect_failures.clone(),
        );
        metrics
    }
}

/// The agent role as a runtime background task.
#[derive(Debug, Clone)]
pub struct AgentTask {
    config: Arc<AgentConfig>,
    metrics: AgentMetrics,
    node_tls: Option<Arc<rustls::ClientConfig>>,
    backend_tls: Option<Arc<rustls::ClientConfig>>,
}

impl AgentTask {
    pub fn new(
        config: AgentConfig,
        metrics: AgentMetrics,
    ) -> Result<Self, sluice_grpc::tls::TlsError> {
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
        Ok(Self {
            config: Arc::new(config),
            metrics,
            node_tls,
            backend_tls,
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
        });
        Box::pin(async move {
            let loops: Vec<_> = shared
                .task
                .config
                .nodes
                .iter()
                .enumerate()
                .map(|(index, node)| {
                    monoio::spawn(node_loop(shared.clone(), node.clone(), index, stop.clone()))
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
        })
    }
}

struct AgentShared {
    task: AgentTask,
    /// One HTTP/2 connection to the backend, shared by all calls, re-dialled when it dies.
    backend: RefCell<Option<SendRequest<Bytes>>>,
    backend_driver: RefCell<Option<monoio::task::JoinHandle<()>>>,
    settings: H2Settings,
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

async fn dial(
    endpoint: &Endpoint,
    tls: &Option<Arc<rustls::ClientConfig>>,
    settings: &H2Settings,
) -> Result<ClientConnection, String> {
    let address = resolve(endpoint).map_err(|error| format!("{}: {error}", endpoint.url))?;
    let tls = tls_for(endpoint, tls);
    if endpoint.tls && tls.is_none() {
        return Err(format!(
            "{}: no TLS configuration for this host name",
            endpoint.url
        ));
    }
    connect(address, tls, settings)
        .await
        .map_err(|error| error.to_string())
}

/// A per-process, per-node connection id, so ListConnectedAgents tells agent processes apart.
fn connection_id(index: usize) -> i64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    let mixed = (nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 1) as i64
}

fn jitter(base: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    // Up to +20%, so many agents restarted together do not reconnect in lockstep.
    base + base.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

/// Keeps one node connected: dial, run the tunnel pool until the connection dies, back off
/// (1 s doubling to 20 s, with jitter), repeat.
async fn node_loop(agent: Rc<AgentShared>, node: Endpoint, index: usize, stop: Arc<StopSignal>) {
    let config = &agent.task.config;
    let metrics = &agent.task.metrics;
    let connection_id = connection_id(index);
    let mut backoff = config.reconnect.initial_backoff;
    while !stop.is_fired() {
        match dial(&node, &agent.task.node_tls, &agent.settings).await {
            Ok(connection) => {
                tracing::info!(node = %node.url, connection_id, "connected to node");
                metrics.nodes_connected.inc(0);
                let outcome = run_pool(&agent, connection, connection_id, &stop).await;
                metrics.nodes_connected.dec(0);
                match outcome {
                    PoolEnd::Stopped => return,
                    PoolEnd::Lost => {
                        tracing::warn!(node = %node.url, "connection to node lost; reconnecting");
                        backoff = config.reconnect.initial_backoff;
                    }
                    PoolEnd::Refused(why) => {
                        tracing::error!(node = %node.url, %why, "node refused the agent");
                        metrics.connect_failures.inc(0);
                    }
                }
            }
            Err(why) => {
                tracing::warn!(node = %node.url, %why, retry_in = ?backoff, "cannot connect to node");
                metrics.connect_failures.inc(0);
            }
        }
        monoio::select! {
            _ = monoio::time::sleep(jitter(backoff)) => {}
            _ = stop.wait() => return,
        }
        backoff = (backoff * 2).min(config.reconnect.max_backoff);
    }
}

enum PoolEnd {
    Stopped,
    Lost,
    Refused(String),
}

/// Tunnel counts of one node connection.
#[derive(Default)]
struct Pool {
    open: Cell<usize>,
    idle: Cell<usize>,
    refused: RefCell<Option<String>>,
    changed: Event,
}

/// Opens tunnels so that at least `min_idle` wait on the node (growing `grow_by` at a time, up to
/// `max` open), until the connection ends.
async fn run_pool(
    agent: &Rc<AgentShared>,
    connection: ClientConnection,
    connection_id: i64,
    stop: &Arc<StopSignal>,
) -> PoolEnd {
    let pool_config = &agent.task.config.pool;
    let pool = Rc::new(Pool::default());
    let ClientConnection {
        send_request,
        mut driver,
    } = connection;
    loop {
        if let Some(why) = pool.refused.borrow_mut().take() {
            return PoolEnd::Refused(why);
        }
        if pool.idle.get() < pool_config.min_idle && pool.open.get() < pool_config.max {
            let room = pool_config.max - pool.open.get();
            for _ in 0..pool_config.grow_by.min(room) {
                pool.open.set(pool.open.get() + 1);
                monoio::spawn(tunnel(
                    agent.clone(),
                    pool.clone(),
                    send_request.clone(),
                    connection_id,
                    stop.clone(),
                ));
            }
        }
        let changed = pool.changed.listen();
        monoio::select! {
            _ = changed => {}
            _ = &mut driver => return PoolEnd::Lost,
            _ = stop.wait() => break,
        }
    }
    // Stopping: every tunnel task sees the stop and closes its stream. Close the connection only
    // then, and wait for its driver, so the socket is really closed before this worker's runtime
    // ends (monoio does not run the tasks of a finished runtime, which would leave the node
    // waiting for this connection until its drain deadline).
    drop(send_request);
    let closed = async {
        while pool.open.get() > 0 {
            let changed = pool.changed.listen();
            if pool.open.get() == 0 {
                break;
            }
            changed.await;
        }
        driver.await;
    };
    let _ = monoio::time::timeout(Duration::from_secs(2), closed).await;
    PoolEnd::Stopped
}

#[derive(Debug)]
enum TunnelEnd {
    /// The node refused the tunnel (bad token...): no point retrying at once.
    Refused(String),
    /// The connection or stream failed.
    Broken(String),
    /// Idle timeout, or the node closed it: normal.
    Closed,
}

async fn tunnel(
    agent: Rc<AgentShared>,
    pool: Rc<Pool>,
    send_request: SendRequest<Bytes>,
    connection_id: i64,
    stop: Arc<StopSignal>,
) {
    let metrics = agent.task.metrics.clone();
    metrics.tunnels_open.inc(0);
    let end = run_tunnel(&agent, &pool, send_request, connection_id, &stop).await;
    metrics.tunnels_open.dec(0);
    pool.open.set(pool.open.get().saturating_sub(1));
    match end {
        TunnelEnd::Refused(why) => {
            *pool.refused.borrow_mut() = Some(why);
        }
        TunnelEnd::Broken(why) => tracing::debug!(%why, "tunnel ended"),
        TunnelEnd::Closed => {}
    }
    pool.changed.notify(usize::MAX);
}

/// Marks a tunnel idle for as long as it lives.
struct IdleMark<'a> {
    pool: &'a Pool,
    metrics: &'a AgentMetrics,
}

impl<'a> IdleMark<'a> {
    fn new(pool: &'a Pool, metrics: &'a AgentMetrics) -> Self {
        pool.idle.set(pool.idle.get() + 1);
        metrics.tunnels_idle.inc(0);
        pool.changed.notify(usize::MAX);
        Self { pool, metrics }
    }
}

impl Drop for IdleMark<'_> {
    fn drop(&mut self) {
        self.pool.idle.set(self.pool.idle.get().saturating_sub(1));
        self.metrics.tunnels_idle.dec(0);
        self.pool.changed.notify(usize::MAX);
    }
}

async fn run_tunnel(
    agent: &AgentShared,
    pool: &Pool,
    send_request: SendRequest<Bytes>,
    connection_id: i64,
    stop: &StopSignal,
) -> TunnelEnd {
    let config = &agent.task.config;
    let mut ready = match send_request.ready().await {
        Ok(ready) => ready,
        Err(error) => return TunnelEnd::Broken(error.to_string()),
    };
    let request = Request::post(format!("http://sluice{CONNECT_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", config.token),
        )
        .header(CONNECTION_ID_HEADER, connection_id.to_string())
        .header(AGENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
        .body(());
    let Ok(request) = request else {
        return TunnelEnd::Refused("the agent token is not a valid header value".to_string());
    };
    let (response, mut send) = match ready.send_request(request, false) {
        Ok(pair) => pair,
        Err(error) => return TunnelEnd::Broken(error.to_string()),
    };
    let descriptor = frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor {
            services: Vec::new(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            reusable: true,
        })),
    });
    if let Err(error) = send_data(&mut send, descriptor, false).await {
        return TunnelEnd::Broken(error.to_string());
    }
    let response = match response.await {
        Ok(response) => response,
        Err(error) => return TunnelEnd::Broken(error.to_string()),
    };
    if let Some(status) = response.headers().get("grpc-status") {
        let code = Code::from_header(status.as_bytes());
        let message = response
            .headers()
            .get("grpc-message")
            .map(|value| decode_message(value.as_bytes()))
            .unwrap_or_default();
        return TunnelEnd::Refused(format!("{code}: {message}"));
    }
    let mut recv = response.into_body();
    let mut reader = TunnelReader::new(config.max_message_bytes);
    // One call at a time; after a clean one the node puts this tunnel back in its registry and
    // the next RequestInfo comes down the same stream.
    loop {
        let next = {
            let _idle = IdleMark::new(pool, &agent.task.metrics);
            monoio::select! {
                message = reader.read_response(&mut recv) => Some(message),
                _ = monoio::time::sleep(config.pool.idle_timeout) => None,
                _ = stop.wait() => None,
            }
        };
        let info = match next {
            // Idle too long (or stopping): close this tunnel; the pool keeps its minimum.
            None => {
                send.send_reset(h2::Reason::CANCEL);
                return TunnelEnd::Closed;
            }
            Some(Ok(Some(connect_response::Msg::RequestInfo(info)))) => info,
            // The node ended the tunnel (a node that does not reuse tunnels, or draining).
            Some(Ok(None)) => {
                end_tunnel(&mut send);
                return TunnelEnd::Closed;
            }
            Some(Ok(Some(_))) => {
                return TunnelEnd::Broken("the node sent a message before RequestInfo".to_string())
            }
            Some(Err(why)) => return TunnelEnd::Broken(why.to_string()),
        };
        agent.task.metrics.requests.inc(0);
        if !forward(agent, info, &mut recv, &mut reader, &mut send).await {
            return TunnelEnd::Closed;
        }
    }
}

impl AgentShared {
    /// The shared backend connection, dialled on first use and again after it broke.
    async fn backend(&self) -> Result<SendRequest<Bytes>, String> {
        let existing = self.backend.borrow().clone();
        if let Some(backend) = existing {
            match backend.ready().await {
                Ok(ready) => return Ok(ready),
                Err(_) => {
                    self.backend.borrow_mut().take();
                }
            }
        }
        let connection = dial(
            &self.task.config.forward_to,
            &self.task.backend_tls,
            &self.settings,
        )
        .await?;
        let ready = connection
            .ready()
            .await
            .map_err(|error| error.to_string())?;
        *self.backend.borrow_mut() = Some(connection.send_request);
        // Kept so a stopping agent can wait for this connection to close (see `run`).
        *self.backend_driver.borrow_mut() = Some(connection.driver);
        Ok(ready)
    }
}

fn send_frame(
    send: &mut SendStream<Bytes>,
    message: connect_request::Msg,
) -> Result<(), h2::Error> {
    send.send_data(frame(&ConnectRequest { msg: Some(message) }), false)
}

/// Ends the tunnel's Connect call from the agent's side.
fn end_tunnel(send: &mut SendStream<Bytes>) {
    let _ = send.send_data(Bytes::new(), true);
}

/// Agent -> node messages gathered into one DATA frame until the agent would wait for the
/// backend: a unary answer (Header, Message, Trailer) arrives together and leaves as one frame.
struct Batch<'a> {
    out: BytesMut,
    send: &'a mut SendStream<Bytes>,
}

impl Batch<'_> {
    fn push(&mut self, message: connect_request::Msg) {
        frame_into(&mut self.out, &ConnectRequest { msg: Some(message) });
    }

    /// A backend message; large ones go out as their own slices, uncopied.
    async fn push_message(&mut self, pieces: Vec<Bytes>) -> Result<(), h2::Error> {
        if let [piece] = pieces.as_slice() {
            self.out.extend_from_slice(piece);
            return Ok(());
        }
        self.flush().await?;
        for piece in pieces {
            send_data(self.send, piece, false).await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), h2::Error> {
        if self.out.is_empty() {
            return Ok(());
        }
        send_data(self.send, self.out.split().freeze(), false).await
    }
}

/// Relays one call between the tunnel and the backend. Returns whether the tunnel can carry
/// another call: the node sent CloseSend, the agent sent its Trailer, nothing went wrong.
async fn forward(
    agent: &AgentShared,
    info: sluice_proto::tunnel::v1::RequestInfo,
    node_recv: &mut RecvStream,
    reader: &mut TunnelReader,
    node_send: &mut SendStream<Bytes>,
) -> bool {
    let config = &agent.task.config;
    let backend = match agent.backend().await {
        Ok(backend) => backend,
        Err(why) => {
            agent.task.metrics.backend_errors.inc(0);
            let _ = send_frame(
                node_send,
                connect_request::Msg::Error(Error {
                    grpc_status: Code::Unavailable.as_u32(),
                    message: format!(
                        "the agent cannot reach its backend {}: {why}",
                        config.forward_to.url
                    ),
                }),
            );
            end_tunnel(node_send);
            await_node_close(node_recv).await;
            return false;
        }
    };
    let mut request = Request::post(format!(
        "http://{}:{}{}",
        config.forward_to.host, config.forward_to.port, info.method_name
    ))
    .body(())
    .unwrap_or_default();
    metadata_into_headers(&info.metadata, request.headers_mut());
    let headers = request.headers_mut();
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    headers
        .entry(http::header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/grpc"));
    // Carry the deadline the node forwarded (it is not a hop header in this direction).
    if let Some(timeout) = info
        .metadata
        .iter()
        .find(|entry| entry.key == "grpc-timeout")
    {
        if let Some(value) = timeout
            .values
            .first()
            .and_then(|value| HeaderValue::from_bytes(value).ok())
        {
            headers.insert("grpc-timeout", value);
        }
    }
    let mut backend = backend;
    let (response, mut backend_send) = match backend.send_request(request, false) {
        Ok(pair) => pair,
        Err(error) => {
            agent.task.metrics.backend_errors.inc(0);
            let _ = send_frame(
                node_send,
                connect_request::Msg::Error(Error {
                    grpc_status: Code::Unavailable.as_u32(),
                    message: format!("backend {}: {error}", config.forward_to.url),
                }),
            );
            end_tunnel(node_send);
            await_node_close(node_recv).await;
            return false;
        }
    };

    let limit = config.max_message_bytes;
    let mut close_send_seen = false;
    // Node -> backend: Message* then CloseSend; after that, keep listening to the tunnel so a
    // reset from the node (the client cancelled, or its deadline passed) cancels the backend call.
    let up = async {
        // A backend may answer and close its stream before reading all of the request (a unary
        // server replies as soon as it has the message); from then on the rest of the request
        // has nowhere to go and is dropped, while the response still flows down.
        let mut backend_open = true;
        let mut read_ahead = None;
        loop {
            let next = match read_ahead.take() {
                Some(next) => next,
                None => reader.read_response(node_recv).await,
            };
            match next {
                Ok(Some(connect_response::Msg::Message(message))) => {
                    // A unary request's message and CloseSend arrive together: the message's
                    // frame then ends the backend stream too.
                    let following = reader.next_response().map_err(ReadError::Protocol);
                    let closes = matches!(following, Ok(Some(connect_response::Msg::CloseSend(_))));
                    if !closes && !matches!(following, Ok(None)) {
                        read_ahead = Some(following);
                    }
                    if backend_open {
                        let (first, rest) = message_pieces(message.compressed, message.data);
                        backend_open =
                            send_data(&mut backend_send, first, closes && rest.is_none())
                                .await
                                .is_ok();
                        if let (true, Some(rest)) = (backend_open, rest) {
                            backend_open = send_data(&mut backend_send, rest, closes).await.is_ok();
                        }
                    }
                    if closes {
                        close_send_seen = true;
                        break;
                    }
                }
                Ok(Some(connect_response::Msg::CloseSend(_))) => {
                    if backend_open {
                        let _ = send_data(&mut backend_send, Bytes::new(), true).await;
                    }
                    close_send_seen = true;
                    break;
                }
                Ok(Some(connect_response::Msg::RequestInfo(_))) => {
                    return Err("a second RequestInfo".to_string())
                }
                // The node ended or reset the tunnel: the client went away (cancel).
                Ok(None) => return Err("the node closed the tunnel".to_string()),
                Err(why) => return Err(format!("the node reset the tunnel: {why}")),
            }
        }
        // The node sends nothing more for this call: the next message would be the next call's
        // RequestInfo, which comes only after this call's Trailer (when this future is no
        // longer polled). A reset means the client cancelled.
        match reader.read_response(node_recv).await {
            Ok(Some(_)) => Err("the node sent a message after CloseSend".to_string()),
            // The node finished its side: the call is over; the backend side ends by itself.
            Ok(None) => std::future::pending().await,
            Err(why) => Err(format!("the node reset the tunnel: {why}")),
        }
    };
    // Backend -> node: Header, Message*, Trailer, gathered into as few DATA frames as the
    // backend's pace allows.
    let down = async {
        let response = response
            .await
            .map_err(|error| format!("backend: {error}"))?;
        let (parts, mut body) = response.into_parts();
        let mut batch = Batch {
            out: BytesMut::new(),
            send: &mut *node_send,
        };
        if parts.headers.contains_key("grpc-status") {
            // Trailers-only response.
            batch.push(connect_request::Msg::Trailer(trailer_from(&parts.headers)));
            return batch.flush().await.map_err(|e| e.to_string());
        }
        batch.push(connect_request::Msg::Header(Header {
            metadata: metadata_from_headers(&parts.headers),
        }));
        let mut frames = FrameDecoder::new(limit);
        loop {
            let chunk = match recv_data_now(&mut body).await {
                Some(chunk) => chunk,
                None => {
                    batch.flush().await.map_err(|e| e.to_string())?;
                    recv_data(&mut body).await
                }
            };
            let Some(chunk) = chunk else { break };
            frames.push(chunk.map_err(|error| format!("backend: {error}"))?);
            while let Some(message) = frames
                .next_message()
                .map_err(|error| format!("backend: {error}"))?
            {
                batch
                    .push_message(data_frame(message.data, message.compressed, true))
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        frames
            .finish()
            .map_err(|error| format!("backend: {error}"))?;
        let trailers = match recv_trailers_now(&mut body).await {
            Some(trailers) => trailers,
            None => {
                batch.flush().await.map_err(|e| e.to_string())?;
                poll_fn(|cx| body.poll_trailers(cx)).await
            }
        };
        let trailers = trailers
            .map_err(|error| format!("backend: {error}"))?
            .unwrap_or_default();
        batch.push(connect_request::Msg::Trailer(trailer_from(&trailers)));
        batch.flush().await.map_err(|e| e.to_string())
    };
    let outcome = {
        monoio::select! {
            sent = up => sent,
            received = down => received,
        }
    };
    match outcome {
        // The node puts the tunnel back in its registry once it has both our Trailer and its
        // own CloseSend behind it; otherwise it ends the tunnel.
        Ok(()) if close_send_seen => true,
        Ok(()) => {
            end_tunnel(node_send);
            await_node_close(node_recv).await;
            false
        }
        Err(why) => {
            tracing::debug!(method = %info.method_name, %why, "call ended early; cancelling both sides");
            backend_send.send_reset(h2::Reason::CANCEL);
            if !why.starts_with("the node") {
                let _ = send_frame(
                    node_send,
                    connect_request::Msg::Error(Error {
                        grpc_status: Code::Unavailable.as_u32(),
                        message: why,
                    }),
                );
                end_tunnel(node_send);
                await_node_close(node_recv).await;
            }
            false
        }
    }
}

/// Waits for the node to close its side of the tunnel (it answers our Trailer or Error with its
/// own trailers). Dropping the stream earlier would reset it, and a reset can overtake the last
/// message on the wire.
async fn await_node_close(node_recv: &mut RecvStream) {
    let _ = monoio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = recv_data(node_recv).await {}
        let _ = poll_fn(|cx| node_recv.poll_trailers(cx)).await;
    })
    .await;
}

/// A Trailer from the backend's trailers (or trailers-only headers).
fn trailer_from(headers: &HeaderMap) -> Trailer {
    let code = headers
        .get("grpc-status")
        .map_or(Code::Unknown, |value| Code::from_header(value.as_bytes()));
    let message = headers
        .get("grpc-message")
        .map(|value| decode_message(value.as_bytes()))
        .unwrap_or_default();
    let mut rest = headers.clone();
    for name in ["grpc-status", "grpc-message", "content-type"] {
        rest.remove(name);
    }
    Trailer {
        grpc_status: code.as_u32(),
        grpc_message: message,
        metadata: metadata_from_headers(&rest),
    }
}
