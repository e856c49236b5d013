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
use sluice_grpc::transport::{compat, recv_data, recv_data_now, send_data, serve, H2Settings};
use sluice_grpc::{
    encode_message, encode_timeout, message_pieces, parse_timeout, Code, FrameDecoder,
};
use sluice_metrics::PerCoreCounter;
use sluice_proto::agents::v1::{ConnectedAgent, ListConnectedAgentsResponse};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, CloseSend, ConnectResponse, MetadataEntry, RequestInfo,
};
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use crate::auth::{AgentTokens, JwtValidator, VerifiedTokens};
use crate::metrics::TunnelMetrics;
use crate::registry::{AgentId, ConnectionRegistry};
use crate::wire::{
    data_frame, frame, frame_into, metadata_from_headers, metadata_into_headers, ReadError,
    TunnelReader,
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
    private_tls: Option<Arc<ServerConfig>>,
    /// TLS for calls to other nodes' private endpoints, and the name their certificates must
    /// carry (`None`: the peer's IP address).
    peer_tls: Option<(
        Arc<rustls::ClientConfig>,
        Option<rustls_pki_types::ServerName<'static>>,
    )>,
    settings: H2Settings,
    /// Publishes which agents this node holds (multi-node); `None` without Redis.
    tracker: Option<sluice_tracker::TrackerHandle>,
    /// Checks tokens on the private endpoint; signs tokens for other nodes' private endpoints.
    private_jwt: Option<(JwtValidator, PrivateSigner)>,
}

/// Signs the short-lived JWTs a node presents to another node's private endpoint.
#[derive(Clone)]
struct PrivateSigner {
    key: jsonwebtoken::EncodingKey,
    issuer: String,
    audience: String,
}

impl std::fmt::Debug for PrivateSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateSigner")
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// Lifetime of a node-to-node token (kas uses 5 s).
const PRIVATE_TOKEN_LIFETIME: u64 = 5;

impl PrivateSigner {
    fn token(&self) -> Option<String> {
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
        let claims = Claims {
            iss: &self.issuer,
            aud: &self.audience,
            iat: now,
            exp: now + PRIVATE_TOKEN_LIFETIME,
        };
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &self.key,
        )
        .ok()
    }
}

impl NodeShared {
    pub fn new(
        config: &TunnelConfig,
        agent_listener: &ListenerConfig,
        external_listener: &ListenerConfig,
        private_listener: Option<&ListenerConfig>,
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
            private_tls: match private_listener {
                Some(listener) => tls(listener)?,
                None => None,
            },
            peer_tls: match &config.peer_tls {
                Some(peer) => {
                    let identity = peer
                        .identity
                        .as_ref()
                        .map(|(cert, key)| (cert.as_path(), key.as_path()));
                    let client = sluice_grpc::tls::client_config(Some(&peer.ca_file), identity)?;
                    let name = peer
                        .server_name
                        .as_ref()
                        .and_then(|name| rustls_pki_types::ServerName::try_from(name.clone()).ok());
                    Some((client, name))
                }
                None => None,
            },
            settings: H2Settings::default(),
            tracker,
            private_jwt: config.private_jwt.as_ref().map(|private| {
                (
                    JwtValidator::new(private),
                    PrivateSigner {
                        key: jsonwebtoken::EncodingKey::from_secret(&private.secret),
                        issuer: private.issuer.clone(),
                        audience: private.audience.clone(),
                    },
                )
            }),
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
        if let Some(tracker) = &self.tracker {
            if first {
                tracker.register(agent);
            }
            tracker.connection_up(sluice_tracker::ConnectionRecord {
                agent,
                connection_id,
                version: version.to_string(),
                node: self.node_name.clone(),
                since_unix_ms,
            });
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
        if let Some(tracker) = &self.tracker {
            tracker.connection_down(key.0, key.1);
            if last {
                tracker.unregister(key.0);
            }
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
    connection_id: i64,
    /// Agent -> node messages.
    recv: RecvStream,
    /// Node -> agent messages.
    send: SendStream<Bytes>,
    /// Bytes already read from `recv`.
    reader: TunnelReader,
    /// The agent takes further calls on this tunnel after a clean one (its Descriptor says so).
    reusable: bool,
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

/// Whether a private-endpoint call asks for readiness first (`expect: 100-continue`).
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
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
    let reusable = match first {
        Ok(Ok(Some(connect_request::Msg::Descriptor(descriptor)))) => descriptor.reusable,
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
    };
    let Ok(send) = respond.send_response(grpc_headers(), false) else {
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
    let streams = TunnelStreams {
        agent,
        connection_id,
        recv,
        send,
        reader,
        reusable,
        _open: open,
    };
    hold_idle(node, streams, conn.draining()).await;
}

/// Keeps an idle tunnel in the registry until a request claims it, the agent closes it, or the
/// worker drains. A claim whose requester already gave up (deadline, client gone, another node
/// won a race) puts the tunnel back instead of wasting it.
async fn hold_idle(
    node: Arc<NodeShared>,
    mut streams: TunnelStreams,
    draining: impl std::future::Future<Output = ()>,
) {
    enum Idle<C> {
        Claimed(C),
        Closed,
        Draining,
    }
    let mut draining = std::pin::pin!(draining);
    loop {
        let (agent, connection_id) = (streams.agent, streams.connection_id);
        let tunnel_id = node.next_tunnel_id.fetch_add(1, Ordering::Relaxed);
        let claims = node.registry.offer(agent, tunnel_id, connection_id);
        let idle = monoio::select! {
            claim = claims => match claim {
                Ok(claim) => Idle::Claimed(claim),
                Err(_) => Idle::Closed,
            },
            // An idle tunnel carries nothing; any event on it (end, reset, stray data) closes it.
            _ = streams.recv.data() => Idle::Closed,
            _ = &mut draining => Idle::Draining,
        };
        match idle {
            Idle::Claimed(claim) => match claim.send(streams) {
                Ok(()) => return,
                Err(returned) => streams = returned,
            },
            Idle::Closed => {
                node.registry.withdraw(agent, tunnel_id);
                return;
            }
            Idle::Draining => {
                node.registry.withdraw(agent, tunnel_id);
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, Code::Unavailable, "node is shutting down");
                let _ = streams.send.send_trailers(trailers);
                return;
            }
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
        Rc::new(ExternalHandler::new(&self.node, Endpoint::External))
    }
}

/// The private endpoint: other nodes forward calls here with a node JWT, naming the agent; it
/// serves them from this node's own tunnels only and never routes further, so calls cannot loop.
#[derive(Debug, Clone)]
pub struct PrivateEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for PrivateEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(ExternalHandler::new(&self.node, Endpoint::Private))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    External,
    Private,
}

/// Per-core endpoint state: the request counters this core has looked up and its HTTP/2
/// connections to other nodes' private endpoints.
#[derive(Debug)]
struct ExternalHandler {
    node: Arc<NodeShared>,
    mode: Endpoint,
    /// By method, then by status code: looked up with the request's `&str` path, so a hit
    /// allocates nothing.
    counters: RefCell<HashMap<String, [Option<PerCoreCounter>; 17]>>,
    peers: RefCell<HashMap<std::net::SocketAddr, h2::client::SendRequest<Bytes>>>,
    /// Per agent: when the tracker was last asked and the other nodes it listed.
    remote_listings: RefCell<HashMap<AgentId, RemoteListing>>,
    /// Client JWTs this core has verified.
    verified_tokens: RefCell<VerifiedTokens>,
}

type RemoteListing = (Instant, Vec<(String, std::net::SocketAddr)>);

/// How long a core reuses the tracker's listing of an agent's nodes. Agents' Redis entries live
/// for minutes and are refreshed well before they expire; a second is short enough that a new
/// node holding the agent is seen at once (an arrival wakes waiting calls anyway).
const REMOTE_LISTING_TTL: Duration = Duration::from_secs(1);
/// Listings kept per core at most.
const MAX_REMOTE_LISTINGS: usize = 4096;

impl ExternalHandler {
    fn new(node: &Arc<NodeShared>, mode: Endpoint) -> Self {
        Self {
            node: node.clone(),
            mode,
            counters: RefCell::default(),
            peers: RefCell::default(),
            remote_listings: RefCell::default(),
            verified_tokens: RefCell::default(),
        }
    }

    fn count(&self, method: &str, code: Code, worker: usize) {
        let mut counters = self.counters.borrow_mut();
        let slot = code.as_u32() as usize;
        if let Some(counter) = counters
            .get(method)
            .and_then(|by_code| by_code[slot].as_ref())
        {
            counter.inc(worker);
            return;
        }
        let counter = self.node.metrics.requests(method, code);
        counter.inc(worker);
        // Method names come from clients: cache only as many as get their own metric label,
        // so random paths cannot grow this map (they are counted under "other", uncached).
        if counters.len() < crate::metrics::MAX_METHOD_LABELS || counters.contains_key(method) {
            counters.entry(method.to_string()).or_default()[slot] = Some(counter);
        }
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
            let tls = match self.mode {
                Endpoint::External => self.node.external_tls.clone(),
                Endpoint::Private => self.node.private_tls.clone(),
            };
            serve_connection(
                stream,
                tls,
                &self.node.settings,
                &conn,
                move |request, respond| {
                    let handler = handler.clone();
                    let conn = handler_conn.clone();
                    async move {
                        let started = Instant::now();
                        let method = request.uri().path().to_string();
                        let code = handler.call(&conn, request, respond).await;
                        match handler.mode {
                            Endpoint::External => handler.count(&method, code, conn.worker()),
                            Endpoint::Private => {
                                handler.node.metrics.private_request(code, conn.worker())
                            }
                        }
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
    /// Other nodes hold the agent (name, private endpoint): race them, first ready wins.
    Remote(Vec<(String, std::net::SocketAddr)>),
}

/// A call opened on another node's private endpoint that reported a ready tunnel.
struct RemoteCall {
    node: String,
    address: std::net::SocketAddr,
    response: h2::client::ResponseFuture,
    send: SendStream<Bytes>,
}

/// How long a node that reported a ready tunnel (100 Continue) waits for the routing node to
/// start the request body before it puts the tunnel back: the winner starts at once.
const CONTINUE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a call waiting for its agent asks the tracker again, in case an arrival message
/// was lost (Redis reconnect); pub/sub wakes it sooner.
const ROUTE_POLL: Duration = Duration::from_secs(2);

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
        let validated = match (self.mode, &node.private_jwt) {
            (Endpoint::External, _) => self
                .verified_tokens
                .borrow_mut()
                .validate(&node.jwt, request.headers()),
            (Endpoint::Private, Some((validator, _))) => validator.validate(request.headers()),
            (Endpoint::Private, None) => Err(crate::auth::AuthError::InvalidToken(
                "no private JWT configured",
            )),
        };
        if let Err(error) = validated {
            let endpoint = match self.mode {
                Endpoint::External => "external",
                Endpoint::Private => "private",
            };
            node.metrics.auth_failure(endpoint, error.reason());
            respond_status(&mut respond, Code::Unauthenticated, &error.to_string());
            return Code::Unauthenticated;
        }
        if request.uri().path() == LIST_AGENTS_PATH {
            return self.list_agents(respond).await;
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
        let mut tried_nodes: Vec<String> = Vec::new();
        // Request body chunks read before a tunnel took the call, and whether the body ended.
        let mut early: Vec<Bytes> = Vec::new();
        let mut body_ended = false;
        loop {
            let route = match self
                .decide_route(
                    agent,
                    wait_until,
                    deadline,
                    &mut respond,
                    &tried_nodes,
                    conn.worker(),
                )
                .await
            {
                Ok(route) => route,
                Err(code) => {
                    node.metrics
                        .wait_duration
                        .observe(conn.worker(), waited.elapsed().as_secs_f64());
                    return code;
                }
            };
            match route {
                Route::Local(mut tunnel) => {
                    if self.mode == Endpoint::Private && expects_continue(&parts.headers) {
                        // The routing node races several nodes: say this one has a tunnel, and
                        // hand it back to the registry unused if another node wins.
                        match self.confirm_ready(&mut respond, &mut body).await {
                            Ok(chunk) => early.extend(chunk),
                            Err(()) => {
                                let node = node.clone();
                                let conn = conn.clone();
                                monoio::spawn(async move {
                                    hold_idle(node, tunnel, async move { conn.draining().await })
                                        .await;
                                });
                                return Code::Cancelled;
                            }
                        }
                    }
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
                    // A unary request usually arrived whole with its headers: then RequestInfo,
                    // its messages and CloseSend go down the tunnel as one DATA frame.
                    if !body_ended {
                        match take_ready_chunks(&mut body, &mut early).await {
                            Ok(ended) => body_ended = ended,
                            Err(_) => return Code::Cancelled,
                        }
                    }
                    let whole = body_ended
                        .then(|| whole_request(&info, &early, node.max_message_bytes))
                        .flatten();
                    let request_sent = whole.is_some();
                    // A tunnel that broke while idle fails here, before the client saw anything:
                    // decide again (the body read so far is kept for the next tunnel).
                    if send_data(&mut tunnel.send, whole.unwrap_or(info), false)
                        .await
                        .is_err()
                    {
                        node.metrics.route("retried", conn.worker());
                        continue;
                    }
                    node.metrics
                        .wait_duration
                        .observe(conn.worker(), waited.elapsed().as_secs_f64());
                    let up = Upload {
                        early: if request_sent {
                            Vec::new()
                        } else {
                            std::mem::take(&mut early)
                        },
                        sent: request_sent,
                    };
                    return self
                        .relay(tunnel, up, &mut body, respond, deadline, agent, conn)
                        .await;
                }
                Route::Remote(candidates) => {
                    node.metrics
                        .wait_duration
                        .observe(conn.worker(), waited.elapsed().as_secs_f64());
                    let raced = monoio::select! {
                        raced = self.race_remote(&candidates, &parts, deadline, agent) => Some(raced),
                        _ = monoio::time::sleep_until(wait_until.into()) => None,
                        _ = poll_fn(|cx| respond.poll_reset(cx)) => return Code::Cancelled,
                    };
                    match raced {
                        Some(Ok(call)) => {
                            return self
                                .relay_remote(call, &mut body, &mut respond, deadline, agent)
                                .await
                        }
                        Some(Err(why)) => {
                            tracing::info!(agent, %why, "no node had a ready tunnel; deciding again");
                            node.metrics.route("retried", conn.worker());
                            tried_nodes.extend(candidates.into_iter().map(|(name, _)| name));
                        }
                        // Out of time: deciding again answers DEADLINE_EXCEEDED.
                        None => {}
                    }
                }
            }
        }
    }

    /// On the private endpoint: reports the tunnel it holds for the call (100 Continue) and
    /// waits for the routing node to start the request. `Err` when the routing node chose
    /// another node (reset) or went quiet; `Ok(None)` for a request without body.
    async fn confirm_ready(
        &self,
        respond: &mut SendResponse<Bytes>,
        body: &mut RecvStream,
    ) -> Result<Option<Bytes>, ()> {
        let ready = Response::builder()
            .status(http::StatusCode::CONTINUE)
            .body(())
            .map_err(|_| ())?;
        respond.send_informational(ready).map_err(|_| ())?;
        let next = monoio::select! {
            chunk = recv_data(body) => Some(chunk),
            _ = poll_fn(|cx| respond.poll_reset(cx)) => None,
            _ = monoio::time::sleep(CONTINUE_TIMEOUT) => None,
        };
        match next {
            Some(None) => Ok(None),
            Some(Some(Ok(chunk))) => Ok(Some(chunk)),
            Some(Some(Err(_))) | None => Err(()),
        }
    }

    /// Decides where a call goes: this node's tunnel if it has an idle one; otherwise (on the
    /// external endpoint, with a tracker) a node the tracker lists; otherwise waits for a local
    /// tunnel or an arrival anywhere (pub/sub, with a slow poll as fallback) until `wait_until`.
    async fn decide_route(
        &self,
        agent: AgentId,
        wait_until: Instant,
        deadline: Option<Instant>,
        respond: &mut SendResponse<Bytes>,
        tried_nodes: &[String],
        worker: usize,
    ) -> Result<Route, Code> {
        let node = &self.node;
        let tracker = match self.mode {
            Endpoint::External => node.tracker.as_ref(),
            Endpoint::Private => None,
        };
        let mut waited = false;
        loop {
            // Listen first, so an arrival between the checks below and the wait is not missed.
            let arrival = tracker.map(|tracker| tracker.arrivals.listen(agent));
            if node.registry.has_idle(agent) {
                if let Ok(tunnel) =
                    monoio::time::timeout_at(wait_until.into(), node.registry.acquire(agent)).await
                {
                    node.metrics
                        .route(if waited { "waited" } else { "local" }, worker);
                    return Ok(Route::Local(tunnel));
                }
            }
            if let Some(tracker) = tracker {
                let candidates: Vec<(String, std::net::SocketAddr)> = self
                    .remote_nodes(
                        tracker,
                        agent,
                        wait_until,
                        waited || !tried_nodes.is_empty(),
                    )
                    .await
                    .into_iter()
                    .filter(|(name, _)| !tried_nodes.contains(name))
                    .collect();
                if !candidates.is_empty() {
                    node.metrics.route("remote", worker);
                    return Ok(Route::Remote(candidates));
                }
            }
            waited = true;
            enum Woken {
                Local(TunnelStreams),
                Again,
                Reset,
                Expired,
            }
            let arrival = async {
                match arrival {
                    Some(listener) => listener.await,
                    None => std::future::pending().await,
                }
            };
            let poll = async {
                if tracker.is_some() {
                    monoio::time::sleep(ROUTE_POLL).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let woken = monoio::select! {
                tunnel = node.registry.acquire(agent) => Woken::Local(tunnel),
                _ = arrival => Woken::Again,
                _ = poll => Woken::Again,
                _ = poll_fn(|cx| respond.poll_reset(cx)) => Woken::Reset,
                _ = monoio::time::sleep_until(wait_until.into()) => Woken::Expired,
            };
            match woken {
                Woken::Local(tunnel) => {
                    node.metrics.route("waited", worker);
                    return Ok(Route::Local(tunnel));
                }
                Woken::Again => {}
                Woken::Reset => return Err(Code::Cancelled),
                Woken::Expired => {
                    let message = if deadline.is_some_and(|deadline| deadline <= wait_until) {
                        format!("deadline exceeded while waiting for a tunnel of agent {agent}")
                    } else {
                        let scope = if tracker.is_some() {
                            "in the cluster"
                        } else {
                            "on this node"
                        };
                        format!(
                            "agent {agent} has no free tunnel {scope} after waiting {:?}",
                            node.max_wait
                        )
                    };
                    respond_status(respond, Code::DeadlineExceeded, &message);
                    return Err(Code::DeadlineExceeded);
                }
            }
        }
    }

    /// The other nodes the tracker lists for `agent` (name, private endpoint). A listing is
    /// kept on this core for `REMOTE_LISTING_TTL`, so a stream of calls for one agent does not
    /// wait on Redis per call; `fresh` (a retry after a failed race, or a wake-up) asks Redis
    /// again. A stale listing costs at most one failed race, after which the call looks up
    /// afresh. An empty listing is never kept.
    async fn remote_nodes(
        &self,
        tracker: &sluice_tracker::TrackerHandle,
        agent: AgentId,
        wait_until: Instant,
        fresh: bool,
    ) -> Vec<(String, std::net::SocketAddr)> {
        let now = Instant::now();
        if !fresh {
            if let Some((fetched, nodes)) = self.remote_listings.borrow().get(&agent) {
                if now.duration_since(*fetched) < REMOTE_LISTING_TTL {
                    return nodes.clone();
                }
            }
        }
        let entries = match monoio::time::timeout_at(wait_until.into(), tracker.lookup(agent)).await
        {
            Ok(Ok(entries)) => entries,
            // Redis is away: local tunnels still work; remote routing resumes with it.
            Ok(Err(error)) => {
                tracing::debug!(agent, %error, "tracker lookup failed");
                return Vec::new();
            }
            Err(_) => return Vec::new(),
        };
        let nodes: Vec<(String, std::net::SocketAddr)> = entries
            .into_iter()
            .filter(|entry| entry.node != self.node.node_name)
            .filter_map(|entry| {
                entry
                    .private_address
                    .parse()
                    .ok()
                    .map(|address| (entry.node, address))
            })
            .collect();
        if nodes.is_empty() {
            // Not kept: the agent's arrival on another node must be seen by the next call.
            self.remote_listings.borrow_mut().remove(&agent);
            return nodes;
        }
        let mut listings = self.remote_listings.borrow_mut();
        // Agent ids come from clients: bound the cache (expired entries first, then all).
        if listings.len() >= MAX_REMOTE_LISTINGS {
            listings.retain(|_, (fetched, _)| now.duration_since(*fetched) < REMOTE_LISTING_TTL);
            if listings.len() >= MAX_REMOTE_LISTINGS {
                listings.clear();
            }
        }
        listings.insert(agent, (now, nodes.clone()));
        nodes
    }

    /// This core's connection to another node's private endpoint.
    async fn peer(
        &self,
        address: std::net::SocketAddr,
    ) -> Result<h2::client::SendRequest<Bytes>, String> {
        let existing = self.peers.borrow().get(&address).cloned();
        if let Some(peer) = existing {
            if let Ok(ready) = peer.ready().await {
                return Ok(ready);
            }
            self.peers.borrow_mut().remove(&address);
        }
        let tls = self.node.peer_tls.as_ref().map(|(config, name)| {
            let name = name
                .clone()
                .unwrap_or_else(|| rustls_pki_types::ServerName::IpAddress(address.ip().into()));
            (config.clone(), name)
        });
        let connection = sluice_grpc::transport::connect(address, tls, &self.node.settings)
            .await
            .map_err(|error| error.to_string())?;
        let ready = connection
            .ready()
            .await
            .map_err(|error| error.to_string())?;
        self.peers
            .borrow_mut()
            .insert(address, connection.send_request);
        Ok(ready)
    }

    /// Opens the call on every candidate node at once; the first that reports a ready tunnel
    /// (100 Continue) wins and the others are cancelled (dropping their streams resets them,
    /// and those nodes put their tunnels back). Nothing of the client's request is consumed
    /// before a winner exists, so the caller can still try elsewhere.
    async fn race_remote(
        &self,
        candidates: &[(String, std::net::SocketAddr)],
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
    ) -> Result<RemoteCall, String> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let token = self
            .node
            .private_jwt
            .as_ref()
            .and_then(|(_, signer)| signer.token())
            .ok_or_else(|| "no private JWT to sign with".to_string())?;
        let mut racing: FuturesUnordered<_> = candidates
            .iter()
            .map(|(name, address)| self.open_remote(name, *address, parts, deadline, agent, &token))
            .collect();
        let mut failures = Vec::new();
        while let Some(outcome) = racing.next().await {
            match outcome {
                Ok(call) => return Ok(call),
                Err(why) => failures.push(why),
            }
        }
        Err(failures.join("; "))
    }

    /// Opens the call on one node's private endpoint and waits until that node holds a tunnel
    /// for it (100 Continue) or answers without one.
    async fn open_remote(
        &self,
        name: &str,
        address: std::net::SocketAddr,
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
        token: &str,
    ) -> Result<RemoteCall, String> {
        let failed = |why: String| format!("node {name} ({address}): {why}");
        let mut peer = self.peer(address).await.map_err(failed)?;
        let mut request = Request::post(format!("http://{address}{}", parts.uri.path()))
            .body(())
            .map_err(|error| failed(error.to_string()))?;
        metadata_into_headers(
            &metadata_from_headers(&parts.headers),
            request.headers_mut(),
        );
        let headers = request.headers_mut();
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers
            .entry(http::header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/grpc"));
        headers.insert(
            http::header::EXPECT,
            HeaderValue::from_static("100-continue"),
        );
        if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        headers.insert(AGENT_ID_HEADER, HeaderValue::from(agent));
        if let Some(deadline) = deadline {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if let Ok(value) = HeaderValue::from_str(&encode_timeout(remaining)) {
                headers.insert("grpc-timeout", value);
            }
        }
        let (mut response, send) = peer
            .send_request(request, false)
            .map_err(|error| failed(error.to_string()))?;
        match poll_fn(|cx| response.poll_informational(cx)).await {
            Some(Ok(info)) if info.status() == http::StatusCode::CONTINUE => Ok(RemoteCall {
                node: name.to_string(),
                address,
                response,
                send,
            }),
            Some(Ok(info)) => Err(failed(format!("unexpected {}", info.status()))),
            Some(Err(error)) => Err(failed(error.to_string())),
            // A final answer without a ready tunnel (no tunnel in time, refused, ...).
            None => match response.await {
                Ok(answer) => {
                    let text = |name: &str| header_text(answer.headers(), name).unwrap_or("");
                    Err(failed(format!(
                        "answered {} {:?} without a tunnel",
                        text("grpc-status"),
                        text("grpc-message")
                    )))
                }
                Err(error) => Err(failed(error.to_string())),
            },
        }
    }

    /// Relays a call whose node won the race: client request to it, its answer back.
    async fn relay_remote(
        &self,
        call: RemoteCall,
        client_body: &mut RecvStream,
        respond: &mut SendResponse<Bytes>,
        deadline: Option<Instant>,
        agent: AgentId,
    ) -> Code {
        let RemoteCall {
            node: peer_name,
            address,
            response,
            send: mut peer_send,
        } = call;
        tracing::trace!(agent, node = %peer_name, "relaying through another node");
        // Client -> peer: DATA as it arrives (the peer's node checks the framing).
        let up = async {
            while let Some(chunk) = recv_data(client_body).await {
                let chunk = chunk.map_err(|_| Fault::ClientGone)?;
                send_data(&mut peer_send, chunk, false)
                    .await
                    .map_err(|error| Fault::AgentGone(format!("node {address}: {error}")))?;
            }
            send_data(&mut peer_send, Bytes::new(), true)
                .await
                .map_err(|error| Fault::AgentGone(format!("node {address}: {error}")))?;
            Ok::<(), Fault>(())
        };
        let mut responder = Responder {
            respond,
            stream: None,
        };
        let down = async {
            let response = monoio::select! {
                response = response => response.map_err(|error| Fault::AgentGone(format!("node {address}: {error}")))?,
                _ = responder.reset() => return Err(Fault::ClientGone),
            };
            let (head, mut body) = response.into_parts();
            let trailers_only = head.headers.contains_key("grpc-status");
            let code_of = |headers: &HeaderMap| {
                headers
                    .get("grpc-status")
                    .map_or(Code::Unknown, |value| Code::from_header(value.as_bytes()))
            };
            let mut forwarded = Response::new(());
            *forwarded.headers_mut() = head.headers.clone();
            if trailers_only {
                let _ = responder.respond.send_response(forwarded, true);
                return Ok(code_of(&head.headers));
            }
            let stream = responder
                .respond
                .send_response(forwarded, false)
                .map_err(|_| Fault::ClientGone)?;
            responder.stream = Some(stream);
            loop {
                let next = monoio::select! {
                    chunk = recv_data(&mut body) => Some(chunk),
                    _ = responder.reset() => None,
                };
                match next {
                    None => return Err(Fault::ClientGone),
                    Some(None) => break,
                    Some(Some(Ok(chunk))) => {
                        let Some(stream) = responder.stream.as_mut() else {
                            return Err(Fault::ClientGone);
                        };
                        send_data(stream, chunk, false)
                            .await
                            .map_err(|_| Fault::ClientGone)?;
                    }
                    Some(Some(Err(error))) => {
                        return Err(Fault::AgentGone(format!("node {address}: {error}")))
                    }
                }
            }
            let trailers = poll_fn(|cx| body.poll_trailers(cx))
                .await
                .map_err(|error| Fault::AgentGone(format!("node {address}: {error}")))?
                .unwrap_or_default();
            let code = code_of(&trailers);
            if let Some(stream) = responder.stream.as_mut() {
                let _ = stream.send_trailers(trailers);
            }
            Ok(code)
        };
        let outcome = run_call(up, down, deadline).await;
        match outcome {
            Ok((code, _)) => code,
            Err(fault) => {
                peer_send.send_reset(h2::Reason::CANCEL);
                let (code, message) = match fault {
                    None => (
                        Code::DeadlineExceeded,
                        format!("deadline exceeded in a call to agent {agent}"),
                    ),
                    Some(Fault::ClientGone) => return Code::Cancelled,
                    Some(Fault::AgentGone(why)) | Some(Fault::AgentProtocol(why)) => {
                        (Code::Unavailable, format!("agent {agent} via {why}"))
                    }
                    Some(Fault::ClientProtocol(code, message)) => (code, message),
                };
                responder.finish(code, &message);
                code
            }
        }
    }

    #[allow(clippy::too_many_arguments)] // one call's parts, passed down once
    async fn relay(
        &self,
        mut tunnel: TunnelStreams,
        up: Upload,
        client_body: &mut RecvStream,
        respond: SendResponse<Bytes>,
        deadline: Option<Instant>,
        agent: AgentId,
        conn: &ConnectionContext,
    ) -> Code {
        let worker = conn.worker();
        let limit = self.node.max_message_bytes;
        let mut respond = respond;
        let mut responder = Responder {
            respond: &mut respond,
            stream: None,
        };
        let outcome = {
            let up = pump_up(up, client_body, &mut tunnel.send, limit);
            let down = pump_down(&mut tunnel.recv, &mut tunnel.reader, &mut responder);
            run_call(up, down, deadline).await
        };
        match outcome {
            Ok(((code, ended_with_trailer), up_finished)) => {
                if tunnel.reusable
                    && ended_with_trailer
                    && up_finished
                    && tunnel.reader.buffered() == 0
                {
                    // Both sides finished cleanly: the agent waits for the next RequestInfo on
                    // this stream, so the tunnel goes back to the registry instead of closing.
                    self.node.metrics.tunnels_reused.inc(worker);
                    let node = self.node.clone();
                    let conn = conn.clone();
                    monoio::spawn(async move {
                        hold_idle(node, tunnel, async move { conn.draining().await }).await;
                    });
                } else {
                    // Close the tunnel's Connect call properly; the agent opens a fresh tunnel.
                    let mut trailers = HeaderMap::new();
                    status_headers(&mut trailers, Code::Ok, "");
                    let _ = tunnel.send.send_trailers(trailers);
                }
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

    /// This node's connections, or with a tracker every node's (from Redis, which marks the
    /// node holding each connection; idle tunnel counts are known for this node only).
    async fn list_agents(&self, mut respond: SendResponse<Bytes>) -> Code {
        let local = self.node.list_connected_agents();
        let listing = match &self.node.tracker {
            None => local,
            Some(tracker) => {
                match monoio::time::timeout(Duration::from_secs(5), tracker.list_connections())
                    .await
                {
                    Ok(Ok(records)) => {
                        let idle = self.node.registry.idle_by_connection();
                        ListConnectedAgentsResponse {
                            agents: records
                                .into_iter()
                                .map(|record| ConnectedAgent {
                                    idle_tunnels: if record.node == self.node.node_name {
                                        idle.get(&(record.agent, record.connection_id))
                                            .copied()
                                            .unwrap_or(0)
                                    } else {
                                        0
                                    },
                                    agent_id: record.agent,
                                    connection_id: record.connection_id,
                                    agent_version: record.version,
                                    node: record.node,
                                    connected_since_unix_ms: record.since_unix_ms,
                                })
                                .collect(),
                        }
                    }
                    Ok(Err(error)) => {
                        respond_status(
                            &mut respond,
                            Code::Unavailable,
                            &format!("cannot list the cluster's agents: {error}"),
                        );
                        return Code::Unavailable;
                    }
                    Err(_) => {
                        respond_status(
                            &mut respond,
                            Code::Unavailable,
                            "cannot list the cluster's agents: redis did not answer in 5s",
                        );
                        return Code::Unavailable;
                    }
                }
            }
        };
        let body = listing.encode_to_vec();
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
struct Responder<'a> {
    respond: &'a mut SendResponse<Bytes>,
    stream: Option<SendStream<Bytes>>,
}

impl Responder<'_> {
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
            None => respond_status(self.respond, code, message),
        }
    }
}

/// Runs the request pump and the response pump of one call together. The call ends when the
/// response pump does (a server may answer before the request ends) or when the request pump
/// fails; `Err(None)` means the deadline passed first. `Ok` carries whether the request pump had
/// finished too.
async fn run_call<T>(
    up: impl std::future::Future<Output = Result<(), Fault>>,
    down: impl std::future::Future<Output = Result<T, Fault>>,
    deadline: Option<Instant>,
) -> Result<(T, bool), Option<Fault>> {
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
                received = &mut down => {
                    // The request pump may be finished without having been polled since (a
                    // request sent whole before the relay started): ask it once more.
                    if !up_done {
                        let polled =
                            poll_fn(|cx| std::task::Poll::Ready(up.as_mut().poll(cx))).await;
                        up_done = matches!(polled, std::task::Poll::Ready(Ok(())));
                    }
                    return received.map(|value| (value, up_done));
                }
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
}

/// What of the client's request went down the tunnel before the relay started.
struct Upload {
    /// Body chunks read early, not yet sent.
    early: Vec<Bytes>,
    /// The whole request (messages and CloseSend) went out with the RequestInfo.
    sent: bool,
}

/// Reads the request body chunks that already arrived, without waiting; returns whether the
/// body ended.
async fn take_ready_chunks(body: &mut RecvStream, chunks: &mut Vec<Bytes>) -> Result<bool, Fault> {
    // A request too big to copy into one frame is streamed by the pump instead.
    while chunks.iter().map(Bytes::len).sum::<usize>() <= WHOLE_REQUEST_LIMIT {
        match recv_data_now(body).await {
            Some(Some(Ok(chunk))) => chunks.push(chunk),
            Some(Some(Err(_))) => return Err(Fault::ClientGone),
            Some(None) => return Ok(true),
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// Requests up to this size (all messages) are copied into the RequestInfo's DATA frame.
const WHOLE_REQUEST_LIMIT: usize = 16 * 1024;

/// `info` followed by every message of a complete request body and CloseSend, as one buffer;
/// `None` if the body is not well-formed gRPC framing (the pump then reports it the usual way)
/// or too big to copy.
fn whole_request(info: &[u8], chunks: &[Bytes], limit: usize) -> Option<Bytes> {
    let size: usize = chunks.iter().map(Bytes::len).sum();
    if size > WHOLE_REQUEST_LIMIT {
        return None;
    }
    let mut out = bytes::BytesMut::with_capacity(info.len() + size + 32);
    out.extend_from_slice(info);
    let mut frames = FrameDecoder::new(limit);
    for chunk in chunks {
        frames.push(chunk.clone());
    }
    while let Some(message) = frames.next_message().ok()? {
        for piece in data_frame(message.data, message.compressed, false) {
            out.extend_from_slice(&piece);
        }
    }
    frames.finish().ok()?;
    frame_into(
        &mut out,
        &ConnectResponse {
            msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
        },
    );
    Some(out.freeze())
}

/// Client -> agent: each gRPC message of the client becomes a tunnel Message, then CloseSend.
async fn pump_up(
    up: Upload,
    client_body: &mut RecvStream,
    tunnel: &mut SendStream<Bytes>,
    limit: usize,
) -> Result<(), Fault> {
    if up.sent {
        return Ok(());
    }
    let mut early = up.early.into_iter();
    let mut frames = FrameDecoder::new(limit);
    loop {
        let chunk = match early.next() {
            Some(chunk) => chunk,
            None => match recv_data(client_body).await {
                Some(chunk) => chunk.map_err(|_| Fault::ClientGone)?,
                None => break,
            },
        };
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
/// Returns the call's status code and whether the agent ended it with a Trailer (not an Error).
async fn pump_down(
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
    responder: &mut Responder<'_>,
) -> Result<(Code, bool), Fault> {
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
                let (first, rest) = message_pieces(message.compressed, message.data);
                send_data(stream, first, false)
                    .await
                    .map_err(|_| Fault::ClientGone)?;
                if let Some(rest) = rest {
                    send_data(stream, rest, false)
                        .await
                        .map_err(|_| Fault::ClientGone)?;
                }
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
                return Ok((code, true));
            }
            connect_request::Msg::Error(error) => {
                let code = Code::from_u32(error.grpc_status);
                responder.finish(code, &error.message);
                return Ok((code, false));
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

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use sluice_config::JwtConfig;

    fn node() -> Arc<NodeShared> {
        let listener = ListenerConfig {
            address: "127.0.0.1:0".parse().unwrap(),
            backlog: 16,
            max_connections_per_worker: 16,
            header_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            tls: None,
        };
        let config = TunnelConfig {
            node_name: "n".into(),
            max_wait: Duration::from_secs(1),
            max_message_bytes: 1024,
            agents: Vec::new(),
            jwt: JwtConfig {
                secret: vec![7; 32],
                secret_file: "s".into(),
                issuer: "i".into(),
                audience: "a".into(),
                leeway: Duration::from_secs(1),
                max_lifetime: Duration::from_secs(10),
            },
            private_jwt: None,
            advertise_address: None,
            peer_tls: None,
        };
        let metrics = TunnelMetrics::register(&mut Registry::default(), 1);
        NodeShared::new(&config, &listener, &listener, None, metrics, None).unwrap()
    }

    #[test]
    fn random_method_names_cannot_grow_the_counter_cache() {
        let handler = ExternalHandler::new(&node(), Endpoint::External);
        for index in 0..5_000 {
            handler.count(
                &format!("/random.Service/Method{index}"),
                Code::Unauthenticated,
                0,
            );
        }
        assert!(handler.counters.borrow().len() <= crate::metrics::MAX_METHOD_LABELS);
        // The first methods keep their own counters; the rest are counted as "other".
        let first = handler
            .node
            .metrics
            .requests("/random.Service/Method0", Code::Unauthenticated);
        assert_eq!(first.sum(), 1);
        let other = handler
            .node
            .metrics
            .requests("/random.Service/Method4999", Code::Unauthenticated);
        assert_eq!(
            other.sum(),
            5_000 - crate::metrics::MAX_METHOD_LABELS as u64
        );
    }
}
