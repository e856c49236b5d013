//! The node side of the tunnel: the agent endpoint (agents park `Connect` streams here) and the
//! external endpoint (clients call agents through them).
//!
//! Routing is one decision function, [`Route`], taken per call before any byte is relayed; this
//! issue knows one route (a local tunnel). The multi-node issue adds "forward to the node that
//! holds a tunnel" as a second variant without touching the relay.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Request, Response};
use prost::Message as _;
use rustls::ServerConfig;
use sluice_config::{ListenerConfig, TunnelConfig};
use sluice_grpc::status::encode_message as encode_grpc_message;
use sluice_grpc::transport::{compat, recv_data, send_data, serve, H2Settings};
use sluice_grpc::{
    encode_message, encode_timeout, message_header, parse_timeout, Code, FrameDecoder,
};
use sluice_metrics::PerCoreCounter;
use sluice_proto::agents::v1::{ConnectedAgent, ListConnectedAgentsResponse};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, CloseSend, ConnectResponse, MetadataEntry, RequestInfo,
};
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use crate::auth::{AgentTokens, JwtValidator};
use crate::metrics::TunnelMetrics;
use crate::registry::{AgentId, ConnectionRegistry};
use crate::wire::{
    data_frame, frame, metadata_from_headers, metadata_into_headers, ReadError, TunnelReader,
};

pub const CONNECT_PATH: &str = "/sluice.tunnel.v1.ReverseTunnel/Connect";
pub const LIST_AGENTS_PATH: &str = "/sluice.agents.v1.Agents/ListConnectedAgents";
/// Metadata naming the agent a call is for.
pub const AGENT_ID_HEADER: &str = "sluice-agent-id";
/// Metadata an agent sends when it connects.
pub const CONNECTION_ID_HEADER: &str = "sluice-agent-connection-id";
pub const AGENT_VERSION_HEADER: &str = "sluice-agent-version";

/// How long an agent has to send its Descriptor after opening a tunnel.
const DESCRIPTOR_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One agent process's connection to this node, for ListConnectedAgents.
#[derive(Debug, Clone)]
struct ConnectionInfo {
    version: String,
    since_unix_ms: i64,
}

/// State shared by every core of a node.
#[derive(Debug)]
pub struct NodeShared {
    pub registry: ConnectionRegistry<TunnelStreams>,
    connections: Mutex<HashMap<(AgentId, i64), ConnectionInfo>>,
    tokens: AgentTokens,
    jwt: JwtValidator,
    pub node_name: String,
    pub max_wait: Duration,
    pub max_message_bytes: usize,
    pub metrics: TunnelMetrics,
    next_tunnel_id: AtomicU64,
    agent_tls: Option<Arc<ServerConfig>>,
    external_tls: Option<Arc<ServerConfig>>,
    settings: H2Settings,
    /// Publishes which agents this node holds (multi-node); `None` without Redis.
    tracker: Option<sluice_tracker::TrackerHandle>,
}

impl NodeShared {
    pub fn new(
        config: &TunnelConfig,
        agent_listener: &ListenerConfig,
        external_listener: &ListenerConfig,
        metrics: TunnelMetrics,
        tracker: Option<sluice_tracker::TrackerHandle>,
    ) -> Result<Arc<Self>, sluice_grpc::tls::TlsError> {
        let tls = |listener: &ListenerConfig| {
            listener
                .tls
                .as_ref()
                .map(|tls| {
                    sluice_grpc::tls::server_config(
                        &tls.cert_file,
                        &tls.key_file,
                        tls.client_ca_file.as_deref(),
                    )
                })
                .transpose()
        };
        Ok(Arc::new(Self {
            registry: ConnectionRegistry::new(),
            connections: Mutex::default(),
            tokens: AgentTokens::new(&config.agents),
            jwt: JwtValidator::new(&config.jwt),
            node_name: config.node_name.clone(),
            max_wait: config.max_wait,
            max_message_bytes: config.max_message_bytes,
            metrics,
            next_tunnel_id: AtomicU64::new(1),
            agent_tls: tls(agent_listener)?,
            external_tls: tls(external_listener)?,
            settings: H2Settings::default(),
            tracker,
        }))
    }

    /// Records an agent connection; the agent's first one on this node is announced to the
    /// tracker (one Redis write per agent, not per tunnel).
    fn remember_connection(&self, agent: AgentId, connection_id: i64, version: &str) {
        let since_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as i64);
        let first = {
            let mut connections = self.lock_connections();
            let first = !connections.keys().any(|(known, _)| *known == agent);
            connections
                .entry((agent, connection_id))
                .or_insert(ConnectionInfo {
                    version: version.to_string(),
                    since_unix_ms,
                });
            first
        };
        if let (true, Some(tracker)) = (first, &self.tracker) {
            tracker.register(agent);
        }
    }

    /// Forgets an agent connection; when the agent's last one leaves, the tracker is told (it
    /// removes the entry after a delay unless the agent reconnects).
    fn forget_connection(&self, key: (AgentId, i64)) {
        let last = {
            let mut connections = self.lock_connections();
            connections.remove(&key);
            !connections.keys().any(|(known, _)| *known == key.0)
        };
        if let (true, Some(tracker)) = (last, &self.tracker) {
            tracker.unregister(key.0);
        }
    }

    fn lock_connections(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(AgentId, i64), ConnectionInfo>> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Agents with at least one connection to this node.
    pub fn connected_agents(&self) -> usize {
        self.lock_connections()
            .keys()
            .map(|(agent, _)| *agent)
            .collect::<HashSet<_>>()
            .len()
    }

    /// What ListConnectedAgents answers for this node.
    pub fn list_connected_agents(&self) -> ListConnectedAgentsResponse {
        let idle = self.registry.idle_by_connection();
        let mut agents: Vec<ConnectedAgent> = self
            .lock_connections()
            .iter()
            .map(|((agent, connection), info)| ConnectedAgent {
                agent_id: *agent,
                connection_id: *connection,
                agent_version: info.version.clone(),
                node: self.node_name.clone(),
                connected_since_unix_ms: info.since_unix_ms,
                idle_tunnels: idle.get(&(*agent, *connection)).copied().unwrap_or(0),
            })
            .collect();
        agents.sort_by_key(|agent| (agent.agent_id, agent.connection_id));
        ListConnectedAgentsResponse { agents }
    }
}

/// A tunnel handed from its owner to a call: both directions of the agent's Connect stream.
#[derive(Debug)]
pub struct TunnelStreams {
    pub agent: AgentId,
    /// Agent -> node messages.
    recv: RecvStream,
    /// Node -> agent messages.
    send: SendStream<Bytes>,
    /// Bytes already read from `recv`.
    reader: TunnelReader,
    _open: OpenTunnel,
}

/// Counts a tunnel as connected for as long as it exists, on the core that opened it.
#[derive(Debug)]
struct OpenTunnel {
    node: Arc<NodeShared>,
    worker: usize,
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.node.metrics.tunnels_connected.dec(self.worker);
    }
}

fn grpc_headers() -> Response<()> {
    let mut response = Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

fn status_headers(headers: &mut HeaderMap, code: Code, message: &str) {
    headers.insert("grpc-status", HeaderValue::from_static(code.header_value()));
    if !message.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&encode_grpc_message(message)) {
            headers.insert("grpc-message", value);
        }
    }
}

/// Ends a call that has sent nothing yet with a trailers-only response.
fn respond_status(respond: &mut SendResponse<Bytes>, code: Code, message: &str) {
    let mut response = grpc_headers();
    status_headers(response.headers_mut(), code, message);
    let _ = respond.send_response(response, true);
}

/// Accepts a connection with TLS when configured, then serves HTTP/2 on it.
async fn serve_connection<H, F>(
    stream: TcpStream,
    tls: Option<Arc<ServerConfig>>,
    settings: &H2Settings,
    conn: &ConnectionContext,
    handler: H,
) where
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: std::future::Future<Output = ()> + 'static,
{
    let io = compat(stream);
    let peer = conn.peer;
    let result = match tls {
        Some(tls) => {
            let accepted = monoio::time::timeout(
                TLS_HANDSHAKE_TIMEOUT,
                tokio_rustls::TlsAcceptor::from(tls).accept(io),
            )
            .await;
            match accepted {
                Ok(Ok(io)) => serve(io, settings, conn.draining(), handler).await,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            }
        }
        None => serve(io, settings, conn.draining(), handler).await,
    };
    if let Err(error) = result {
        tracing::debug!(%peer, listener = conn.listener(), %error, "HTTP/2 connection ended with an error");
    }
}

/// The agent endpoint: agents authenticate and park their Connect streams here.
#[derive(Debug, Clone)]
pub struct AgentEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for AgentEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(self.clone())
    }
}

impl ConnectionHandler for AgentEndpoint {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            // The agent connections (agent id, connection id) this TCP connection announced.
            let announced: Rc<RefCell<HashSet<(AgentId, i64)>>> = Rc::default();
            let node = self.node.clone();
            let handler_conn = conn.clone();
            let handler_announced = announced.clone();
            serve_connection(
                stream,
                self.node.agent_tls.clone(),
                &self.node.settings,
                &conn,
                move |request, respond| {
                    accept_tunnel(
                        node.clone(),
                        handler_conn.clone(),
                        handler_announced.clone(),
                        request,
                        respond,
                    )
                },
            )
            .await;
            for key in announced.borrow().iter() {
                self.node.forget_connection(*key);
            }
        })
    }
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

async fn accept_tunnel(
    node: Arc<NodeShared>,
    conn: ConnectionContext,
    announced: Rc<RefCell<HashSet<(AgentId, i64)>>>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    if request.uri().path() != CONNECT_PATH {
        respond_status(
            &mut respond,
            Code::Unimplemented,
            &format!("the agent endpoint serves only {CONNECT_PATH}"),
        );
        return;
    }
    let agent = match node.tokens.authenticate(request.headers()) {
        Ok(agent) => agent,
        Err(error) => {
            node.metrics.auth_failure("agent", error.reason());
            tracing::info!(peer = %conn.peer, reason = error.reason(), "agent refused");
            respond_status(&mut respond, Code::Unauthenticated, &error.to_string());
            return;
        }
    };
    let connection_id = header_text(request.headers(), CONNECTION_ID_HEADER)
        .and_then(|text| text.parse::<i64>().ok())
        .unwrap_or(0);
    let version = header_text(request.headers(), AGENT_VERSION_HEADER)
        .unwrap_or("")
        .to_string();
    let mut recv = request.into_body();
    let mut reader = TunnelReader::new(node.max_message_bytes);
    let first = monoio::time::timeout(DESCRIPTOR_TIMEOUT, reader.read_request(&mut recv)).await;
    match first {
        Ok(Ok(Some(connect_request::Msg::Descriptor(_)))) => {}
        Ok(Ok(Some(_))) => {
            node.metrics.protocol_errors.inc(conn.worker());
            respond_status(
                &mut respond,
                Code::InvalidArgument,
                "a tunnel must start with a Descriptor",
            );
            return;
        }
        Ok(Ok(None)) | Ok(Err(ReadError::Gone(_))) => return,
        Ok(Err(ReadError::Protocol(error))) => {
            node.metrics.protocol_errors.inc(conn.worker());
            respond_status(&mut respond, Code::InvalidArgument, &error.to_string());
            return;
        }
        Err(_) => {
            respond_status(
                &mut respond,
                Code::DeadlineExceeded,
                "no Descriptor within 10s",
            );
            return;
        }
    }
    let Ok(mut send) = respond.send_response(grpc_headers(), false) else {
        return;
    };
    if announced.borrow_mut().insert((agent, connection_id)) {
        node.remember_connection(agent, connection_id, &version);
        tracing::info!(agent, connection_id, %version, peer = %conn.peer, "agent connected");
    }
    node.metrics.tunnels_connected.inc(conn.worker());
    let open = OpenTunnel {
        node: node.clone(),
        worker: conn.worker(),
    };
    let tunnel_id = node.next_tunnel_id.fetch_add(1, Ordering::Relaxed);
    let claims = node.registry.offer(agent, tunnel_id, connection_id);

    enum Idle<C> {
        Claimed(C),
        Closed,
        Draining,
    }
    let idle = monoio::select! {
        claim = claims => match claim {
            Ok(claim) => Idle::Claimed(claim),
            Err(_) => Idle::Closed,
        },
        // An idle tunnel carries nothing; any event on it (end, reset, stray data) closes it.
        _ = recv.data() => Idle::Closed,
        _ = conn.draining() => Idle::Draining,
    };
    match idle {
        Idle::Claimed(claim) => {
            let streams = TunnelStreams {
                agent,
                recv,
                send,
                reader,
                _open: open,
            };
            // If the requester gave up in the meantime the streams drop here, resetting the
            // tunnel; the agent opens a fresh one.
            let _ = claim.send(streams);
        }
        Idle::Closed => {
            node.registry.withdraw(agent, tunnel_id);
        }
        Idle::Draining => {
            node.registry.withdraw(agent, tunnel_id);
            let mut trailers = HeaderMap::new();
            status_headers(&mut trailers, Code::Unavailable, "node is shutting down");
            let _ = send.send_trailers(trailers);
        }
    }
}

/// The external endpoint: clients call agents here with a JWT and `sluice-agent-id`.
#[derive(Debug, Clone)]
pub struct ExternalEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for ExternalEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(ExternalHandler {
            node: self.node.clone(),
            counters: RefCell::default(),
        })
    }
}

/// Per-core external endpoint state: the request counters this core has looked up.
#[derive(Debug)]
struct ExternalHandler {
    node: Arc<NodeShared>,
    counters: RefCell<HashMap<(String, Code), PerCoreCounter>>,
}

impl ExternalHandler {
    fn count(&self, method: &str, code: Code, worker: usize) {
        let mut counters = self.counters.borrow_mut();
        if let Some(counter) = counters.get(&(method.to_string(), code)) {
            counter.inc(worker);
            return;
        }
        let counter = self.node.metrics.requests(method, code);
        counter.inc(worker);
        counters.insert((method.to_string(), code), counter);
    }
}

impl ConnectionHandler for ExternalHandler {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            let handler = self.clone();
            let handler_conn = conn.clone();
            serve_connection(
                stream,
                self.node.external_tls.clone(),
                &self.node.settings,
                &conn,
                move |request, respond| {
                    let handler = handler.clone();
                    let conn = handler_conn.clone();
                    async move {
                        let started = Instant::now();
                        let method = request.uri().path().to_string();
                        let code = handler.call(&conn, request, respond).await;
                        handler.count(&method, code, conn.worker());
                        handler
                            .node
                            .metrics
                            .request_duration
                            .observe(conn.worker(), started.elapsed().as_secs_f64());
                        conn.request_served();
                    }
                },
            )
            .await;
        })
    }
}

/// Where a call goes; decided before any byte is relayed.
#[derive(Debug)]
enum Route {
    /// A tunnel of the agent on this node.
    Local(TunnelStreams),
}

/// How a relay ended when it did not end with the agent's status.
#[derive(Debug)]
enum Fault {
    ClientGone,
    ClientProtocol(Code, String),
    AgentGone(String),
    AgentProtocol(String),
}

impl ExternalHandler {
    async fn call(
        &self,
        conn: &ConnectionContext,
        request: Request<RecvStream>,
        mut respond: SendResponse<Bytes>,
    ) -> Code {
        let node = &self.node;
        if let Err(error) = node.jwt.validate(request.headers()) {
            node.metrics.auth_failure("external", error.reason());
            respond_status(&mut respond, Code::Unauthenticated, &error.to_string());
            return Code::Unauthenticated;
        }
        if request.uri().path() == LIST_AGENTS_PATH {
            return self.list_agents(respond);
        }
        let agent = match header_text(request.headers(), AGENT_ID_HEADER) {
            None => {
                respond_status(
                    &mut respond,
                    Code::InvalidArgument,
                    &format!("missing {AGENT_ID_HEADER} metadata: name the agent to call"),
                );
                return Code::InvalidArgument;
            }
            Some(text) => {
                match text.trim().parse::<AgentId>() {
                    Ok(agent) if agent > 0 => agent,
                    _ => {
                        let shown: String = text.chars().take(40).collect();
                        respond_status(
                        &mut respond,
                        Code::InvalidArgument,
                        &format!("malformed {AGENT_ID_HEADER} {shown:?}: expected a positive integer"),
                    );
                        return Code::InvalidArgument;
                    }
                }
            }
        };
        let deadline = match request
            .headers()
            .get("grpc-timeout")
            .map(|value| parse_timeout(value.as_bytes()))
        {
            None => None,
            Some(Ok(timeout)) => Some(Instant::now() + timeout),
            Some(Err(error)) => {
                respond_status(&mut respond, Code::InvalidArgument, &error.to_string());
                return Code::InvalidArgument;
            }
        };
        let (parts, mut body) = request.into_parts();
        let method = parts.uri.path().to_string();
        let mut metadata = metadata_from_headers(&parts.headers);

        let waited = Instant::now();
        let wait_until = deadline.map_or(waited + node.max_wait, |deadline| {
            deadline.min(waited + node.max_wait)
        });
        let route = loop {
            let acquired = monoio::select! {
                tunnel = monoio::time::timeout_at(wait_until.into(), node.registry.acquire(agent)) => Some(tunnel),
                _ = poll_fn(|cx| respond.poll_reset(cx)) => None,
            };
            let mut tunnel = match acquired {
                None => {
                    node.metrics
                        .wait_duration
                        .observe(conn.worker(), waited.elapsed().as_secs_f64());
                    return Code::Cancelled;
                }
                Some(Err(_)) => {
                    node.metrics
                        .wait_duration
                        .observe(conn.worker(), waited.elapsed().as_secs_f64());
                    let message = if deadline.is_some_and(|deadline| deadline <= wait_until) {
                        format!("deadline exceeded while waiting for a tunnel of agent {agent}")
                    } else {
                        format!(
                            "agent {agent} has no free tunnel on this node after waiting {:?}",
                            node.max_wait
                        )
                    };
                    respond_status(&mut respond, Code::DeadlineExceeded, &message);
                    return Code::DeadlineExceeded;
                }
                Some(Ok(tunnel)) => tunnel,
            };
            // The remaining deadline travels with the call so the backend sees it too.
            metadata.retain(|entry| entry.key != "grpc-timeout");
            if let Some(deadline) = deadline {
                let remaining = deadline.saturating_duration_since(Instant::now());
                metadata.push(MetadataEntry {
                    key: "grpc-timeout".to_string(),
                    values: vec![Bytes::from(encode_timeout(remaining))],
                });
            }
            let info = frame(&ConnectResponse {
                msg: Some(connect_response::Msg::RequestInfo(RequestInfo {
                    method_name: method.clone(),
                    metadata: metadata.clone(),
                })),
            });
            // A tunnel that broke while idle fails here, before the client saw anything: take
            // another one.
            if send_data(&mut tunnel.send, info, false).await.is_ok() {
                break Route::Local(tunnel);
            }
        };
        node.metrics
            .wait_duration
            .observe(conn.worker(), waited.elapsed().as_secs_f64());
        let Route::Local(tunnel) = route;
        self.relay(tunnel, &mut body, respond, deadline, agent, conn.worker())
            .await
    }

    async fn relay(
        &self,
        mut tunnel: TunnelStreams,
        client_body: &mut RecvStream,
        respond: SendResponse<Bytes>,
        deadline: Option<Instant>,
        agent: AgentId,
        worker: usize,
    ) -> Code {
        let limit = self.node.max_message_bytes;
        let mut responder = Responder {
            respond,
            stream: None,
        };
        let outcome = {
            let up = pump_up(client_body, &mut tunnel.send, limit);
            let down = pump_down(&mut tunnel.recv, &mut tunnel.reader, &mut responder);
            let both = async {
                let mut up = std::pin::pin!(up);
                let mut down = std::pin::pin!(down);
                let mut up_done = false;
                loop {
                    monoio::select! {
                        sent = &mut up, if !up_done => match sent {
                            Ok(()) => up_done = true,
                            Err(fault) => return Err(fault),
                        },
                        received = &mut down => return received,
                    }
                }
            };
            match deadline {
                Some(deadline) => match monoio::time::timeout_at(deadline.into(), both).await {
                    Ok(outcome) => outcome.map_err(Some),
                    Err(_) => Err(None),
                },
                None => both.await.map_err(Some),
            }
        };
        match outcome {
            Ok(code) => {
                // Close the tunnel's Connect call properly; the agent opens a fresh tunnel.
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, Code::Ok, "");
                let _ = tunnel.send.send_trailers(trailers);
                code
            }
            Err(fault) => {
                // Whatever went wrong, the agent's side of this call is cancelled.
                tunnel.send.send_reset(h2::Reason::CANCEL);
                let (code, message) = match fault {
                    None => (
                        Code::DeadlineExceeded,
                        format!("deadline exceeded in a call to agent {agent}"),
                    ),
                    Some(Fault::ClientGone) => return Code::Cancelled,
                    Some(Fault::ClientProtocol(code, message)) => {
                        self.node.metrics.protocol_errors.inc(worker);
                        (code, message)
                    }
                    Some(Fault::AgentGone(why)) => (
                        Code::Unavailable,
                        format!("agent {agent} went away in the middle of the call: {why}"),
                    ),
                    Some(Fault::AgentProtocol(why)) => {
                        self.node.metrics.protocol_errors.inc(worker);
                        (
                            Code::Internal,
                            format!("agent {agent} broke the tunnel protocol: {why}"),
                        )
                    }
                };
                responder.finish(code, &message);
                code
            }
        }
    }

    fn list_agents(&self, mut respond: SendResponse<Bytes>) -> Code {
        let body = self.node.list_connected_agents().encode_to_vec();
        let Ok(mut stream) = respond.send_response(grpc_headers(), false) else {
            return Code::Cancelled;
        };
        let _ = stream.send_data(encode_message(false, &body), false);
        let mut trailers = HeaderMap::new();
        status_headers(&mut trailers, Code::Ok, "");
        let _ = stream.send_trailers(trailers);
        Code::Ok
    }
}

/// The client's half of a call: headers not yet sent, or the response stream.
struct Responder {
    respond: SendResponse<Bytes>,
    stream: Option<SendStream<Bytes>>,
}

impl Responder {
    /// Resolves when the client resets the call.
    async fn reset(&mut self) {
        match &mut self.stream {
            Some(stream) => {
                let _ = poll_fn(|cx| stream.poll_reset(cx)).await;
            }
            None => {
                let _ = poll_fn(|cx| self.respond.poll_reset(cx)).await;
            }
        }
    }

    /// Ends the call with a status: as trailers if headers went out, else trailers-only.
    fn finish(&mut self, code: Code, message: &str) {
        match &mut self.stream {
            Some(stream) => {
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, code, message);
                let _ = stream.send_trailers(trailers);
            }
            None => respond_status(&mut self.respond, code, message),
        }
    }
}

/// Client -> agent: each gRPC message of the client becomes a tunnel Message, then CloseSend.
async fn pump_up(
    client_body: &mut RecvStream,
    tunnel: &mut SendStream<Bytes>,
    limit: usize,
) -> Result<(), Fault> {
    let mut frames = FrameDecoder::new(limit);
    while let Some(chunk) = recv_data(client_body).await {
        let chunk = chunk.map_err(|_| Fault::ClientGone)?;
        frames.push(chunk);
        while let Some(message) = frames
            .next_message()
            .map_err(|error| Fault::ClientProtocol(error.code(), format!("request: {error}")))?
        {
            for piece in data_frame(message.data, message.compressed, false) {
                send_data(tunnel, piece, false)
                    .await
                    .map_err(|error| Fault::AgentGone(error.to_string()))?;
            }
        }
    }
    frames
        .finish()
        .map_err(|error| Fault::ClientProtocol(error.code(), format!("request: {error}")))?;
    let close = frame(&ConnectResponse {
        msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
    });
    send_data(tunnel, close, false)
        .await
        .map_err(|error| Fault::AgentGone(error.to_string()))
}

/// Agent -> client: Header, Message*, then Trailer or Error; returns the call's status code.
async fn pump_down(
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
    responder: &mut Responder,
) -> Result<Code, Fault> {
    loop {
        let next = monoio::select! {
            message = reader.read_request(recv) => Some(message),
            _ = responder.reset() => None,
        };
        let message = match next {
            None => return Err(Fault::ClientGone),
            Some(Err(ReadError::Gone(why))) => return Err(Fault::AgentGone(why)),
            Some(Err(ReadError::Protocol(error))) => {
                return Err(Fault::AgentProtocol(error.to_string()))
            }
            Some(Ok(None)) => {
                return Err(Fault::AgentGone(
                    "the tunnel closed before the call ended".to_string(),
                ))
            }
            Some(Ok(Some(message))) => message,
        };
        match message {
            connect_request::Msg::Header(header) => {
                if responder.stream.is_some() {
                    return Err(Fault::AgentProtocol("a second Header".to_string()));
                }
                let mut response = Response::new(());
                metadata_into_headers(&header.metadata, response.headers_mut());
                response
                    .headers_mut()
                    .entry(http::header::CONTENT_TYPE)
                    .or_insert(HeaderValue::from_static("application/grpc"));
                let stream = responder
                    .respond
                    .send_response(response, false)
                    .map_err(|_| Fault::ClientGone)?;
                responder.stream = Some(stream);
            }
            connect_request::Msg::Message(message) => {
                let Some(stream) = responder.stream.as_mut() else {
                    return Err(Fault::AgentProtocol(
                        "a Message before the Header".to_string(),
                    ));
                };
                send_data(
                    stream,
                    Bytes::copy_from_slice(&message_header(message.compressed, message.data.len())),
                    false,
                )
                .await
                .map_err(|_| Fault::ClientGone)?;
                send_data(stream, message.data, false)
                    .await
                    .map_err(|_| Fault::ClientGone)?;
            }
            connect_request::Msg::Trailer(trailer) => {
                let code = Code::from_u32(trailer.grpc_status);
                let mut trailers = HeaderMap::new();
                metadata_into_headers(&trailer.metadata, &mut trailers);
                status_headers(&mut trailers, code, &trailer.grpc_message);
                match responder.stream.as_mut() {
                    Some(stream) => {
                        let _ = stream.send_trailers(trailers);
                    }
                    None => {
                        let mut response = grpc_headers();
                        response.headers_mut().extend(trailers);
                        let _ = responder.respond.send_response(response, true);
                    }
                }
                return Ok(code);
            }
            connect_request::Msg::Error(error) => {
                let code = Code::from_u32(error.grpc_status);
                responder.finish(code, &error.message);
                return Ok(code);
            }
            connect_request::Msg::Descriptor(_) => {
                return Err(Fault::AgentProtocol(
                    "a Descriptor in the middle of a call".to_string(),
                ));
            }
        }
    }
}

/// Scrape-time gauges read from the node's shared state.
#[derive(Debug)]
pub struct NodeCollector(pub Arc<NodeShared>);

impl prometheus_client::collector::Collector for NodeCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let idle = ConstGauge::new(self.0.registry.idle_count() as i64);
        idle.encode(encoder.encode_descriptor(
            "sluice_tunnel_idle_tunnels",
            "Tunnels waiting in the registry for a call",
            None,
            idle.metric_type(),
        )?)?;
        let agents = ConstGauge::new(self.0.connected_agents() as i64);
        agents.encode(encoder.encode_descriptor(
            "sluice_tunnel_connected_agents",
            "Distinct agents with at least one connection to this node",
            None,
            agents.metric_type(),
        )?)?;
        Ok(())
    }
}
