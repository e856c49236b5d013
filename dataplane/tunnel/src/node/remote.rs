//! Reaching other nodes: the locator's listings (cached per core), this core's HTTP/2
//! connections to other nodes' private endpoints, and the race that picks the first node with a
//! ready tunnel.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::uri::Authority;
use http::HeaderValue;
use rustls_pki_types::ServerName;
use sluice_config::{JwtConfig, PeerTlsConfig};
use sluice_grpc::Code;
use sluice_locator::{AgentLocator, LocatorError};

use super::call::header_text;
use super::peer_request::PeerCall;
use super::relays::{RelayPool, RelayStream};
use super::route::{peers_of, Peer};
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;
use crate::wire::TunnelReader;

/// Peer authorities a core keeps; peer addresses come from Redis, so the map is bounded
/// (emptied when full: re-parsing one is cheap, an unbounded map is not).
const KEPT_AUTHORITIES: usize = 1024;

/// TLS for calls to other nodes' private endpoints, and the name their certificates must carry
/// (`None`: the peer's IP address).
#[derive(Debug)]
pub(super) struct PeerTls {
    client: Arc<rustls::ClientConfig>,
    name: Option<ServerName<'static>>,
}

impl PeerTls {
    pub(super) fn new(peer: &PeerTlsConfig) -> Result<Self, sluice_grpc::tls::TlsError> {
        let identity = peer
            .identity
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()));
        let client = sluice_grpc::tls::client_config(Some(&peer.ca_file), identity)?;
        let name = peer
            .server_name
            .as_ref()
            .and_then(|name| ServerName::try_from(name.clone()).ok());
        Ok(Self { client, name })
    }
}

/// Signs the short-lived JWTs a node presents to another node's private endpoint.
#[derive(Clone)]
pub(super) struct PrivateSigner {
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
    pub(super) fn new(config: &JwtConfig) -> Self {
        Self {
            key: jsonwebtoken::EncodingKey::from_secret(&config.secret),
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
        }
    }

    /// The token for second `now` (seconds since the epoch).
    fn token(&self, now: u64) -> Option<String> {
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
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

/// A call opened on another node's private endpoint: one that reported a ready tunnel (won a
/// race), or one sent directly whose confirmation (100 Continue) is still to come.
pub(super) struct RemoteCall {
    pub(super) node: String,
    pub(super) address: SocketAddr,
    pub(super) answer: PeerAnswer,
    pub(super) send: SendStream<Bytes>,
    /// Whether the node already reported its tunnel.
    pub(super) confirmed: bool,
    /// Sent framed (`framed.rs`): the connection's node offered it earlier.
    pub(super) framed: bool,
    /// Set when the node's 100 Continue offers framed calls: the connection's flag.
    pub(super) offers: Rc<Cell<bool>>,
}

/// Where a remote call's answer comes from.
pub(super) enum PeerAnswer {
    /// A new stream: the node's response head is still to come.
    Pending(ResponseFuture),
    /// A framed stream kept from an earlier call (`relays.rs`): its head came then.
    Kept(RecvStream, TunnelReader),
}

impl RemoteCall {
    /// The next call on a kept framed stream.
    fn on_kept(stream: RelayStream) -> Self {
        Self {
            node: stream.node,
            address: stream.address,
            answer: PeerAnswer::Kept(stream.recv, stream.reader),
            send: stream.send,
            confirmed: true,
            framed: true,
            offers: stream.offers,
        }
    }

    /// Whether the call goes down a kept framed stream.
    pub(super) fn on_kept_stream(&self) -> bool {
        matches!(self.answer, PeerAnswer::Kept(..))
    }
}

/// This core's connection to one other node's private endpoint.
#[derive(Debug)]
struct PeerConnection {
    send: SendRequest<Bytes>,
    /// The node offered framed calls on this connection (learnt from a 100 Continue; a new
    /// connection starts without, so a node replaced by an older one is never sent them).
    offers: Rc<Cell<bool>>,
}

/// How long a core reuses the locator's listing of an agent's nodes. Agents' Redis entries live
/// for minutes and are refreshed well before they expire; a second is short enough that a new
/// node holding the agent is seen at once (an arrival wakes waiting calls anyway).
const REMOTE_LISTING_TTL: Duration = Duration::from_secs(1);
/// Listings kept per core at most.
const MAX_REMOTE_LISTINGS: usize = 4096;

/// One core's way to other nodes.
#[derive(Debug)]
pub(super) struct RemoteRouting {
    node: Arc<NodeShared>,
    pub(super) locator: Arc<dyn AgentLocator>,
    peers: RefCell<HashMap<SocketAddr, PeerConnection>>,
    /// Per agent: when the locator was last asked and the other nodes it listed.
    listings: RefCell<HashMap<AgentId, (Instant, Vec<Peer>)>>,
    /// The `authorization` value of this second's node token. A token's claims are whole
    /// seconds, so every call of one second would sign the same bytes again.
    signed: RefCell<Option<(u64, HeaderValue)>>,
    /// Each peer's address as the `:authority` of the calls forwarded to it (formatted and
    /// parsed once, not per call).
    authorities: RefCell<HashMap<SocketAddr, Authority>>,
    /// Framed streams kept after clean calls, for the next call to the same agent and node.
    pub(super) relays: RelayPool,
}

impl RemoteRouting {
    pub(super) fn new(node: &Arc<NodeShared>) -> Option<Self> {
        let locator = node.locator.clone()?;
        Some(Self {
            node: node.clone(),
            locator,
            peers: RefCell::default(),
            listings: RefCell::default(),
            signed: RefCell::default(),
            authorities: RefCell::default(),
            relays: RelayPool::default(),
        })
    }

    /// The other nodes the locator lists for `agent`. A listing is kept on this core for
    /// `REMOTE_LISTING_TTL`, so a stream of calls for one agent does not wait on Redis per
    /// call; `fresh` (a retry after a failed race, or a wake-up) asks again. A stale listing
    /// costs at most one failed race. An empty listing is never kept: the agent's arrival on
    /// another node must be seen by the next call.
    pub(super) async fn remote_nodes(
        &self,
        agent: AgentId,
        until: Instant,
        fresh: bool,
    ) -> Result<Vec<Peer>, LocatorError> {
        let now = Instant::now();
        if !fresh {
            if let Some((fetched, nodes)) = self.listings.borrow().get(&agent) {
                if now.duration_since(*fetched) < REMOTE_LISTING_TTL {
                    return Ok(nodes.clone());
                }
            }
        }
        // Boxed: the timer would otherwise sit in (and be copied with) every call's future.
        let entries = Box::pin(monoio::time::timeout_at(
            until.into(),
            self.locator.lookup(agent),
        ))
        .await
        .map_err(|_| LocatorError::Store("no answer before the call's wait ended".into()))??;
        let nodes = peers_of(entries, &self.node.node_name);
        let mut listings = self.listings.borrow_mut();
        if nodes.is_empty() {
            listings.remove(&agent);
            return Ok(nodes);
        }
        // Agent ids come from clients: bound the cache (expired entries first, then all).
        if listings.len() >= MAX_REMOTE_LISTINGS {
            listings.retain(|_, (fetched, _)| now.duration_since(*fetched) < REMOTE_LISTING_TTL);
            if listings.len() >= MAX_REMOTE_LISTINGS {
                listings.clear();
            }
        }
        listings.insert(agent, (now, nodes.clone()));
        Ok(nodes)
    }

    /// This core's connection to another node's private endpoint, ready for a request, and
    /// whether that node offered framed calls on it.
    async fn peer(
        &self,
        address: SocketAddr,
    ) -> Result<(SendRequest<Bytes>, Rc<Cell<bool>>), PeerFailure> {
        // Addresses come from Redis: whoever can write there could point this node (and the
        // private JWT it presents) anywhere, so they must lie in `tunnel.peer_allowlist`.
        if !peer_allowed(&self.node.peer_allowlist, address) {
            self.node.metrics.peer_refused();
            return Err(PeerFailure::NotAllowed(address));
        }
        let existing = self
            .peers
            .borrow()
            .get(&address)
            .map(|peer| (peer.send.clone(), peer.offers.clone()));
        if let Some((peer, offers)) = existing {
            if let Ok(ready) = peer.ready().await {
                return Ok((ready, offers));
            }
            self.peers.borrow_mut().remove(&address);
        }
        let tls = self.node.peer_tls.as_ref().map(|tls| {
            let name = tls
                .name
                .clone()
                .unwrap_or_else(|| ServerName::IpAddress(address.ip().into()));
            (tls.client.clone(), name)
        });
        let timeouts = self.node.peer_timeouts;
        let bounds = sluice_grpc::transport::ConnectBounds {
            connect: timeouts.connect,
            unacked: timeouts.unacked,
        };
        // Boxed: the TCP, TLS and HTTP/2 handshakes under a timer make a future of kilobytes,
        // and every call's state would carry it (copied whole each time a call is spawned)
        // although a core connects once per peer.
        let connection = Box::pin(sluice_grpc::transport::connect_within(
            address,
            tls,
            &self.node.settings,
            bounds,
        ))
        .await
        .inspect_err(|_| self.node.metrics.peer_connect_failed())?;
        let ready = connection.ready().await?;
        let offers = Rc::new(Cell::new(false));
        let kept = PeerConnection {
            send: connection.send_request,
            offers: offers.clone(),
        };
        self.peers.borrow_mut().insert(address, kept);
        Ok((ready, offers))
    }

    /// Opens the call on every candidate node at once; the first that reports a ready tunnel
    /// (100 Continue) wins and the others are cancelled (dropping their streams resets them,
    /// and those nodes put their tunnels back). Nothing of the client's request is consumed
    /// before a winner exists, so the caller can still try elsewhere.
    pub(super) async fn race(
        &self,
        candidates: &[Peer],
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
    ) -> Result<RemoteCall, PeersFailed> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        // A node that took a call for the agent moments ago on a stream kept since: no race.
        if let Some(kept) = self.relays.take(candidates, agent) {
            return Ok(RemoteCall::on_kept(kept));
        }
        let token = self.token().map_err(PeersFailed::refused)?;
        let token = &token;
        let mut racing: FuturesUnordered<_> = candidates
            .iter()
            .map(|(name, address)| async move {
                self.open(*address, parts, deadline, agent, token)
                    .await
                    .map(|started| RemoteCall {
                        node: name.clone(),
                        address: *address,
                        answer: PeerAnswer::Pending(started.response),
                        send: started.send,
                        confirmed: true,
                        framed: started.framed,
                        offers: started.offers,
                    })
                    .map_err(|why| {
                        let over = why.over_share();
                        (
                            why.unreachable(),
                            over,
                            format!("node {name} ({address}): {why}"),
                        )
                    })
            })
            .collect();
        let mut failures = Vec::new();
        let mut unreachable = false;
        let mut all_over_share = true;
        while let Some(outcome) = racing.next().await {
            match outcome {
                Ok(call) => return Ok(call),
                Err((silent, over, why)) => {
                    unreachable |= silent;
                    all_over_share &= over;
                    failures.push(why);
                }
            }
        }
        // Every node refused the call for a share it is over (its calls waiting for the
        // agent, its buffers): final, as on this node, instead of a wait here for a tunnel
        // that only those nodes hold.
        let kind = if all_over_share && !failures.is_empty() {
            ErrorKind::OverShare
        } else {
            ErrorKind::PeerUnavailable
        };
        Err(PeersFailed {
            error: TunnelError::new(kind, failures.join("; ")),
            unreachable,
        })
    }

    /// Opens the call on the only candidate node without waiting for its 100 Continue: the
    /// caller sends the request body at once and watches for the confirmation while it does
    /// (`relay_remote`). Fails, with nothing of the request sent, when the node cannot be
    /// reached or the stream cannot be opened.
    pub(super) async fn direct(
        &self,
        candidate: &Peer,
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
    ) -> Result<RemoteCall, PeersFailed> {
        if let Some(kept) = self.relays.take(std::slice::from_ref(candidate), agent) {
            return Ok(RemoteCall::on_kept(kept));
        }
        let (name, address) = candidate;
        let token = self.token().map_err(PeersFailed::refused)?;
        let started = self
            .start(*address, parts, deadline, agent, &token)
            .await
            .map_err(|why| PeersFailed {
                unreachable: why.unreachable(),
                error: TunnelError::new(
                    ErrorKind::PeerUnavailable,
                    format!("node {name} ({address}): {why}"),
                ),
            })?;
        Ok(RemoteCall {
            node: name.clone(),
            address: *address,
            answer: PeerAnswer::Pending(started.response),
            send: started.send,
            confirmed: false,
            framed: started.framed,
            offers: started.offers,
        })
    }

    /// The `authorization` value (a node token) for this call's requests to other nodes.
    fn token(&self) -> Result<HeaderValue, TunnelError> {
        let unsigned =
            || TunnelError::new(ErrorKind::PeerUnavailable, "no private JWT to sign with");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| unsigned())?
            .as_secs();
        if let Some((second, value)) = &*self.signed.borrow() {
            if *second == now {
                return Ok(value.clone());
            }
        }
        let value = self
            .node
            .private_jwt
            .as_ref()
            .and_then(|(_, signer)| signer.token(now))
            .and_then(|token| HeaderValue::try_from(format!("Bearer {token}")).ok())
            .ok_or_else(unsigned)?;
        *self.signed.borrow_mut() = Some((now, value.clone()));
        Ok(value)
    }

    fn authority(&self, address: SocketAddr) -> Result<Authority, http::Error> {
        if let Some(authority) = self.authorities.borrow().get(&address) {
            return Ok(authority.clone());
        }
        let authority = Authority::try_from(address.to_string())?;
        let mut authorities = self.authorities.borrow_mut();
        if authorities.len() >= KEPT_AUTHORITIES {
            authorities.clear();
        }
        authorities.insert(address, authority.clone());
        Ok(authority)
    }

    /// Sends the call's headers to one node's private endpoint on this core's connection to
    /// it (opened, or opened again, when there is none that works): framed when that node
    /// offered it on this connection.
    async fn start(
        &self,
        address: SocketAddr,
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
        token: &HeaderValue,
    ) -> Result<Started, PeerFailure> {
        let authority = self.authority(address)?;
        let call = PeerCall {
            authority: &authority,
            parts,
            deadline,
            agent,
            token,
        };
        let (mut peer, offers) = self.peer(address).await?;
        let framed = self.node.splice_private_hop && offers.get();
        match peer.send_request(call.request(framed)?, false) {
            Ok((response, send)) => Ok(Started {
                response,
                send,
                framed,
                offers,
            }),
            // The kept connection was closed meanwhile (the peer's idle timeout or connection
            // age, a GOAWAY): nothing was sent, so one new connection is tried at once rather
            // than counting the node out of this call. It has offered nothing yet.
            Err(_) => {
                self.peers.borrow_mut().remove(&address);
                let (mut peer, offers) = self.peer(address).await?;
                let (response, send) = peer.send_request(call.request(false)?, false)?;
                Ok(Started {
                    response,
                    send,
                    framed: false,
                    offers,
                })
            }
        }
    }

    /// Opens the call on one node's private endpoint and waits until that node holds a tunnel
    /// for it (100 Continue) or answers without one.
    async fn open(
        &self,
        address: SocketAddr,
        parts: &http::request::Parts,
        deadline: Option<Instant>,
        agent: AgentId,
        token: &HeaderValue,
    ) -> Result<Started, PeerFailure> {
        let mut started = self.start(address, parts, deadline, agent, token).await?;
        let response = &mut started.response;
        match poll_fn(|cx| response.poll_informational(cx)).await {
            Some(Ok(info)) if info.status() == http::StatusCode::CONTINUE => {
                if super::framed::offered(&info) {
                    started.offers.set(true);
                }
                Ok(started)
            }
            Some(Ok(info)) => Err(PeerFailure::Unexpected(info.status())),
            Some(Err(error)) => Err(error.into()),
            // A final answer without a ready tunnel (no tunnel in time, refused, ...).
            None => {
                let answer = started.response.await?;
                let text = |name: &str| header_text(answer.headers(), name).unwrap_or("");
                Err(PeerFailure::Answered(
                    text("grpc-status").to_string(),
                    text("grpc-message").to_string(),
                ))
            }
        }
    }
}

/// A call's stream opened on another node.
struct Started {
    response: ResponseFuture,
    send: SendStream<Bytes>,
    framed: bool,
    offers: Rc<Cell<bool>>,
}

/// Why one node of a race did not take the call (reported in the race's error message).
#[derive(Debug, thiserror::Error)]
enum PeerFailure {
    #[error("{0}")]
    H2(#[from] h2::Error),
    #[error("{0}")]
    Http(#[from] http::Error),
    #[error("{0}")]
    Connect(#[from] sluice_grpc::transport::ConnectError),
    #[error("unexpected {0}")]
    Unexpected(http::StatusCode),
    #[error("answered {0} {1:?} without a tunnel")]
    Answered(String, String),
    #[error("advertised address {0} is outside tunnel.peer_allowlist; not dialled")]
    NotAllowed(SocketAddr),
}

impl PeerFailure {
    /// The node answered RESOURCE_EXHAUSTED: the call is over one of its shares.
    fn over_share(&self) -> bool {
        matches!(self, PeerFailure::Answered(status, _)
            if Code::from_header(status.as_bytes()) == Code::ResourceExhausted)
    }

    /// The node did not answer at all (a timeout, no route): a partition, unlike a node that
    /// refused the connection or the stream, which is going away and whose agents reconnect
    /// elsewhere. Decides whether a call gives up after the short remote-failure grace.
    fn unreachable(&self) -> bool {
        use std::io::ErrorKind as Io;
        let silent = |kind: Io| {
            matches!(
                kind,
                Io::TimedOut | Io::HostUnreachable | Io::NetworkUnreachable
            )
        };
        match self {
            PeerFailure::Connect(sluice_grpc::transport::ConnectError::TimedOut { .. }) => true,
            PeerFailure::Connect(sluice_grpc::transport::ConnectError::Tcp { source, .. }) => {
                silent(source.kind())
            }
            PeerFailure::H2(error) => error.get_io().is_some_and(|io| silent(io.kind())),
            _ => false,
        }
    }
}

/// Why no node of a race (or the one node of a direct call) took the call.
#[derive(Debug)]
pub(super) struct PeersFailed {
    pub(super) error: TunnelError,
    /// At least one node did not answer at all (see [`PeerFailure::unreachable`]).
    pub(super) unreachable: bool,
}

impl PeersFailed {
    fn refused(error: TunnelError) -> Self {
        Self {
            error,
            unreachable: false,
        }
    }
}

/// Whether an advertised peer address may be dialled: inside one of the allow-list's networks,
/// or any address when the list is empty.
fn peer_allowed(allowlist: &[sluice_config::IpNetwork], address: SocketAddr) -> bool {
    allowlist.is_empty()
        || allowlist
            .iter()
            .any(|network| network.contains(address.ip()))
}

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;
