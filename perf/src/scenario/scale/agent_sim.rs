//! Simulated tunnel agents: each one agent id with its own token, one HTTP/2 connection to a
//! node's agent listener and one Connect stream on it carrying the Descriptor the real agent
//! sends (`dataplane/tunnel/src/agent/tunnel.rs`: `reusable`, its version). Thousands of them
//! live as tasks of one tokio runtime, so the harness holds as many tunnels as its open-file
//! limit allows. A simulated agent answers a call like an echo backend (Header, the request's
//! message back, Trailer OK) and keeps the tunnel for the next one, as the real agent does.
//! Reconnects follow the real agent (`agent/pool.rs`): at once when the node ended the tunnel
//! because it drains (UNAVAILABLE), after 1 s when the connection was lost, and a failed dial
//! waits 1 s doubling to 20 s (plus up to 20 % jitter) before the next.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::RecvStream;
use http::Request;
use prost::Message as _;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, ConnectResponse, Descriptor, Header,
    Message, Trailer,
};
use tokio::net::TcpStream;
use tokio::sync::watch;

const CONNECT_PATH: &str = "/sluice.tunnel.v1.ReverseTunnel/Connect";
/// What the real agent would put in its version header and Descriptor.
const AGENT_VERSION: &str = "sluice-perf-agent-sim";
/// Bounds what one simulated agent buffers of a call (a small echo message).
const MAX_CALL_BYTES: usize = 64 * 1024;
/// Connections the calls are spread over.
const CALLER_CONNECTIONS: usize = 8;
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(20);

/// The agent token of `id`: derived from the run's seed, so nothing per agent is stored.
pub fn token(seed: &str, id: u64) -> String {
    hex::encode(Sha256::digest(format!("{seed}/{id}").as_bytes()))
}

/// The digest a node lists for an agent's token.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// What the simulated agents saw, shared by all of them.
#[derive(Debug, Default)]
pub struct SimStats {
    /// Agents with their Connect accepted right now.
    pub connected: AtomicUsize,
    /// Connect streams accepted, first ones and after a reconnect.
    pub accepts: AtomicU64,
    /// Connections lost (the node went away or closed it): expected only at a restart.
    pub disconnects: AtomicU64,
    /// A refused Connect, a protocol surprise, a failed answer: never expected.
    pub errors: AtomicU64,
    /// Calls answered.
    pub calls: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

impl SimStats {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(what);
        }
    }
}

/// How a connection of one simulated agent ended.
enum End {
    Stop,
    /// The node drains: dial again at once (behind a load balancer, another node answers).
    Moved,
    /// The node closed it or went away: dial again after the back-off.
    Lost,
    /// The dial failed (node not listening yet): back-off doubles.
    Unreachable,
}

/// Runs one simulated agent until `stop` turns true.
pub async fn run_agent(
    id: u64,
    token: String,
    mut node: watch::Receiver<SocketAddr>,
    stats: Arc<SimStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = INITIAL_BACKOFF;
    loop {
        if *stop.borrow() {
            return;
        }
        let address = *node.borrow_and_update();
        let end = tokio::select! {
            end = session(id, &token, address, &stats) => end,
            _ = stop.changed() => End::Stop,
        };
        let wait = match end {
            End::Stop => return,
            End::Moved => {
                backoff = INITIAL_BACKOFF;
                continue;
            }
            End::Lost => {
                backoff = INITIAL_BACKOFF;
                backoff
            }
            End::Unreachable => {
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        let jitter = wait.mul_f64(jitter_fraction(id) * 0.2);
        tokio::select! {
            _ = tokio::time::sleep(wait + jitter) => {}
            _ = stop.changed() => return,
            // A node that moved (restarted on a new port) is dialled at once.
            _ = node.changed() => {}
        }
    }
}

/// A fraction in [0, 1) that differs between agents and between calls.
fn jitter_fraction(id: u64) -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mixed = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(nanos)) % 1_000;
    mixed as f64 / 1_000.0
}

async fn session(id: u64, token: &str, address: SocketAddr, stats: &SimStats) -> End {
    let Ok(tcp) = TcpStream::connect(address).await else {
        return End::Unreachable;
    };
    let _ = tcp.set_nodelay(true);
    let Ok((client, connection)) = h2::client::handshake(tcp).await else {
        return End::Unreachable;
    };
    let mut connection = Box::pin(connection);
    let served = serve(id, token, client, stats);
    tokio::pin!(served);
    tokio::select! {
        // The connection ended first: the node closed it or went away.
        _ = &mut connection => {}
        end = &mut served => return end,
    }
    End::Lost
}

/// Opens the Connect stream, then answers calls on it until it ends.
async fn serve(id: u64, token: &str, client: SendRequest<Bytes>, stats: &SimStats) -> End {
    let opened = open(token, client).await;
    let (mut recv, mut send) = match opened {
        Ok(Ok(streams)) => streams,
        Ok(Err(refusal)) => {
            stats.error(format!("agent {id}: Connect refused: {refusal}"));
            return End::Lost;
        }
        Err(_) => return End::Lost,
    };
    stats.accepts.fetch_add(1, Ordering::Relaxed);
    stats.connected.fetch_add(1, Ordering::Relaxed);
    let end = answer_calls(id, &mut recv, &mut send, stats).await;
    stats.connected.fetch_sub(1, Ordering::Relaxed);
    stats.disconnects.fetch_add(1, Ordering::Relaxed);
    end
}

type Streams = (RecvStream, h2::SendStream<Bytes>);

/// The Connect request as the real agent sends it; `Ok(Err(_))`: the node refused it.
async fn open(
    token: &str,
    client: SendRequest<Bytes>,
) -> Result<Result<Streams, String>, h2::Error> {
    let mut ready = client.ready().await?;
    let request = Request::post(format!("http://sluice{CONNECT_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header("sluice-agent-connection-id", "1")
        .header("sluice-agent-version", AGENT_VERSION)
        .body(())
        .map_err(|_| h2::Error::from(h2::Reason::INTERNAL_ERROR))?;
    let (response, mut send) = ready.send_request(request, false)?;
    let descriptor = ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor {
            services: Vec::new(),
            agent_version: AGENT_VERSION.to_string(),
            reusable: true,
        })),
    };
    send.send_data(grpc_frame(&descriptor), false)?;
    let response = response.await?;
    if let Some(status) = response.headers().get("grpc-status") {
        let message = response
            .headers()
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .unwrap_or("");
        return Ok(Err(format!("grpc-status {status:?} {message}")));
    }
    Ok(Ok((response.into_body(), send)))
}

/// Echoes each call (RequestInfo, Message, CloseSend) and waits for the next on the same
/// stream; ends when the node ends the stream or the connection goes.
async fn answer_calls(
    id: u64,
    recv: &mut RecvStream,
    send: &mut h2::SendStream<Bytes>,
    stats: &SimStats,
) -> End {
    let mut buffer = BytesMut::new();
    let mut message: Option<Bytes> = None;
    loop {
        let chunk = match recv.data().await {
            Some(Ok(chunk)) => chunk,
            // The node ended the tunnel: UNAVAILABLE when it drains (restart, retirement).
            None => return ended_by(recv).await,
            Some(Err(_)) => return End::Lost,
        };
        let _ = recv.flow_control().release_capacity(chunk.len());
        buffer.extend_from_slice(&chunk);
        if buffer.len() > MAX_CALL_BYTES {
            stats.error(format!("agent {id}: a call of over {MAX_CALL_BYTES} bytes"));
            return End::Lost;
        }
        while let Some(frame) = take_frame(&mut buffer) {
            let decoded = match ConnectResponse::decode(frame) {
                Ok(ConnectResponse { msg: Some(msg) }) => msg,
                _ => {
                    stats.error(format!("agent {id}: undecodable ConnectResponse"));
                    return End::Lost;
                }
            };
            match decoded {
                connect_response::Msg::RequestInfo(_) => message = None,
                connect_response::Msg::Message(m) => message = Some(m.data),
                connect_response::Msg::CloseSend(_) => {
                    let answer = echo_answer(message.take().unwrap_or_default());
                    if send.send_data(answer, false).is_err() {
                        return End::Lost;
                    }
                    stats.calls.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// How a tunnel the node ended with its trailers ends here: a drain (UNAVAILABLE) moves the
/// agent at once, as `closed_by_drain` in the real agent decides.
async fn ended_by(recv: &mut RecvStream) -> End {
    let trailers = tokio::time::timeout(Duration::from_secs(1), recv.trailers()).await;
    match trailers {
        Ok(Ok(Some(trailers))) if is_drain(&trailers) => End::Moved,
        _ => End::Lost,
    }
}

fn is_drain(trailers: &http::HeaderMap) -> bool {
    trailers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"14")
}

/// Header, the message back and Trailer OK, in one DATA frame (as the real agent gathers an
/// answer that arrived together).
fn echo_answer(data: Bytes) -> Bytes {
    let mut out = BytesMut::new();
    for msg in [
        connect_request::Msg::Header(Header {
            metadata: Vec::new(),
        }),
        connect_request::Msg::Message(Message {
            data,
            compressed: false,
        }),
        connect_request::Msg::Trailer(Trailer {
            grpc_status: 0,
            grpc_message: String::new(),
            metadata: Vec::new(),
        }),
    ] {
        out.extend_from_slice(&grpc_frame(&ConnectRequest { msg: Some(msg) }));
    }
    out.freeze()
}

/// A gRPC length-prefixed frame of `message`.
pub fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(body.len() as u32);
    out.extend_from_slice(&body);
    out.freeze()
}

/// The next complete gRPC frame's payload in `buffer`, if one is there.
pub fn take_frame(buffer: &mut BytesMut) -> Option<Bytes> {
    if buffer.len() < 5 {
        return None;
    }
    let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
    if buffer.len() < 5 + length {
        return None;
    }
    buffer.advance(5);
    Some(buffer.split_to(length).freeze())
}

/// One call through a node's external endpoint, as a client would make it: its latency, or
/// why it failed.
pub async fn call(
    client: &mut SendRequest<Bytes>,
    jwt: &str,
    agent: u64,
    payload: Bytes,
) -> Result<Duration, String> {
    let started = Instant::now();
    let request = Request::post("http://sluice/perf.Echo/Call")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::AUTHORIZATION, format!("Bearer {jwt}"))
        .header("sluice-agent-id", agent.to_string())
        .header("grpc-timeout", "25S")
        .body(())
        .map_err(|e| e.to_string())?;
    let mut ready = client.clone().ready().await.map_err(|e| e.to_string())?;
    let (response, mut send) = ready
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    let mut frame = BytesMut::with_capacity(5 + payload.len());
    frame.put_u8(0);
    frame.put_u32(payload.len() as u32);
    frame.extend_from_slice(&payload);
    send.send_data(frame.freeze(), true)
        .map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    if let Some(status) = response.headers().get("grpc-status") {
        return Err(format!(
            "agent {agent}: trailers-only grpc-status {status:?}"
        ));
    }
    let mut body = response.into_body();
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.map_err(|e| e.to_string())?;
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .map(|s| s.as_bytes().to_vec());
    if status.as_deref() != Some(b"0") {
        let message = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .and_then(|m| m.to_str().ok())
            .unwrap_or("")
            .to_string();
        return Err(format!("agent {agent}: grpc-status {status:?} {message}"));
    }
    if take_frame(&mut received).as_ref() != Some(&payload) {
        return Err(format!("agent {agent}: the echo did not come back"));
    }
    Ok(started.elapsed())
}

/// An HTTP/2 connection to a node's external endpoint for [`call`], driven by its own task.
pub async fn caller(address: SocketAddr) -> anyhow::Result<SendRequest<Bytes>> {
    let tcp = TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    // h2 guards against a flood of small DATA frames with a budget that follows the connection
    // window; the answers of hundreds of calls that waited for a restarting node's agents
    // arrive together, before this busy runtime reads them, and spent the default budget (the
    // client went away with ENHANCE_YOUR_CALM, failing every call in flight).
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(tcp)
        .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Calls {
    pub calls: usize,
    pub errors: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub last_error: Option<String>,
}

/// Calls at `rate` per second to agents spread over all of them, through `external`, for
/// `length` or until `done` turns true; each call on its own stream of one connection.
pub async fn calls_for(
    external: SocketAddr,
    jwt: String,
    agents: usize,
    rate: u32,
    length: Duration,
    mut done: Option<watch::Receiver<bool>>,
) -> anyhow::Result<Calls> {
    // Several connections, so a burst of answers is spread over several budgets (see `caller`).
    let mut clients = Vec::new();
    for _ in 0..CALLER_CONNECTIONS {
        clients.push(caller(external).await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < length {
        if let Some(done) = &mut done {
            if *done.borrow() {
                break;
            }
        }
        ticker.tick().await;
        sent += 1;
        // Spread over the agents: a stride coprime with most counts.
        let agent = (sent * 7_919) % agents as u64 + 1;
        let payload = bytes::Bytes::from(format!("call {sent}"));
        let slot = sent as usize % CALLER_CONNECTIONS;
        let (mut stream, jwt) = (clients[slot].clone(), jwt.clone());
        tasks.spawn(async move { call(&mut stream, &jwt, agent, payload).await });
        if sent.is_multiple_of(200) && clients[slot].clone().ready().await.is_err() {
            clients[slot] = caller(external).await?;
        }
    }
    let mut latencies = Vec::new();
    let mut result = Calls::default();
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Ok(latency) => latencies.push(latency.as_secs_f64() * 1_000.0),
            Err(error) => {
                result.errors += 1;
                result.last_error = Some(error);
            }
        }
    }
    result.calls = latencies.len() + result.errors;
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    result.p50_ms = at(0.5);
    result.p99_ms = at(0.99);
    result.max_ms = latencies.last().copied().unwrap_or(0.0);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_back_whole_and_only_when_complete() {
        let info = ConnectRequest {
            msg: Some(connect_request::Msg::Header(Header {
                metadata: Vec::new(),
            })),
        };
        let frame = grpc_frame(&info);
        let mut buffer = BytesMut::from(&frame[..3]);
        assert!(take_frame(&mut buffer).is_none(), "a partial prefix");
        buffer.extend_from_slice(&frame[3..]);
        buffer.extend_from_slice(&frame[..6]);
        let first = take_frame(&mut buffer).unwrap_or_default();
        assert_eq!(ConnectRequest::decode(first).ok(), Some(info));
        assert!(take_frame(&mut buffer).is_none(), "a partial second frame");
    }

    #[test]
    fn the_echo_answer_is_header_message_trailer_ok() {
        let mut answer = BytesMut::from(&echo_answer(Bytes::from_static(b"hi"))[..]);
        let mut kinds = Vec::new();
        while let Some(frame) = take_frame(&mut answer) {
            kinds.push(ConnectRequest::decode(frame).ok().and_then(|r| r.msg));
        }
        assert!(matches!(kinds[0], Some(connect_request::Msg::Header(_))));
        assert!(
            matches!(&kinds[1], Some(connect_request::Msg::Message(m)) if m.data.as_ref() == b"hi")
        );
        assert!(matches!(
            kinds[2],
            Some(connect_request::Msg::Trailer(Trailer {
                grpc_status: 0,
                ..
            }))
        ));
    }

    #[test]
    fn only_unavailable_trailers_move_the_agent_at_once() {
        let trailers = |code: &'static str| {
            let mut map = http::HeaderMap::new();
            map.insert("grpc-status", http::HeaderValue::from_static(code));
            map
        };
        assert!(is_drain(&trailers("14")));
        assert!(!is_drain(&trailers("0")));
        assert!(!is_drain(&http::HeaderMap::new()));
    }

    #[test]
    fn tokens_differ_per_agent_and_digests_are_hex_sha256() {
        assert_ne!(token("s", 1), token("s", 2));
        assert_eq!(token("s", 1), token("s", 1));
        // What `printf %s seven | sha256sum` prints, as the node's config lists it.
        assert_eq!(
            token_sha256("seven"),
            "3ba8d02b16fd2a01c1a8ba1a1f036d7ce386ed953696fa57331c2ac48a80b255"
        );
    }
}
