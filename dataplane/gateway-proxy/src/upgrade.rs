//! HTTP/1.1 upgrades (exec, attach, port-forward over SPDY or WebSocket). They cannot ride the
//! shared HTTP/2 connections, so each gets its own HTTP/1.1 TLS connection to the apiserver,
//! after the same checks as any request; then bytes are copied both ways until one side ends.
//!
//! Hand-written rather than hyper's upgrade support: hyper hands back upgraded connections
//! only for `Send` I/O, and monoio's sockets are not `Send`. The first request head of every
//! HTTP/1.1 connection is read here; anything but an upgrade is replayed into hyper.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use sluice_gateway::request_info::RequestInfo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::admit::Admitted;
use crate::body::InFlight;
use crate::error::{ProxyError, UpstreamFailure};
use crate::handler::{
    decoded_path, request_info, request_labels, ClientConnection, GatewayHandler,
};
use crate::headers::{refuse_upgrade_body, upstream_headers};
use crate::state::Generation;

/// The client's side of an upgrade connection.
type ClientStream = tokio_rustls::server::TlsStream<sluice_grpc::transport::CompatStream>;

/// Largest request or response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in a head.
const MAX_HEADERS: usize = 128;
/// How long a non-101 answer to an upgrade may keep streaming before the connection closes.
const REFUSAL_DRAIN: Duration = Duration::from_secs(2);

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeHeadError {
    #[error("connection closed before a complete head")]
    Closed,
    #[error("head larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed head: {0}")]
    Syntax(#[from] httparse::Error),
    #[error("malformed head: incomplete")]
    Incomplete,
    #[error("malformed head: method")]
    Method,
    #[error("malformed head: request target")]
    Target,
    #[error("malformed head: header name {0:?}")]
    HeaderName(Box<str>),
    #[error("malformed head: value of {0}")]
    HeaderValue(HeaderName),
    #[error("malformed head: status")]
    Status,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads until `buffer` holds a complete head; returns its length (body bytes may follow).
pub async fn read_head<S: AsyncRead + Unpin>(
    io: &mut S,
    buffer: &mut BytesMut,
) -> Result<usize, UpgradeHeadError> {
    loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            return Ok(end + 4);
        }
        if buffer.len() >= MAX_HEAD_BYTES {
            return Err(UpgradeHeadError::TooLarge);
        }
        buffer.reserve(8 * 1024);
        if io.read_buf(buffer).await? == 0 {
            return Err(UpgradeHeadError::Closed);
        }
    }
}

/// A parsed request head, owned.
#[derive(Debug)]
pub struct RequestHead {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
}

/// Parses a complete request head (from [`read_head`]).
pub fn parse_request(head: &[u8]) -> Result<RequestHead, UpgradeHeadError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut lines);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(UpgradeHeadError::Incomplete),
        Err(error) => return Err(UpgradeHeadError::Syntax(error)),
    }
    let method = request
        .method
        .and_then(|method| http::Method::from_bytes(method.as_bytes()).ok())
        .ok_or(UpgradeHeadError::Method)?;
    let uri: http::Uri = request
        .path
        .and_then(|path| path.parse().ok())
        .ok_or(UpgradeHeadError::Target)?;
    // Only a path (origin form) or an http(s) URL with one (absolute form): `http::Uri` also
    // takes `://host?q` (empty scheme, no path) and `host:port`, whose path the request info
    // would see as empty while `upstream_head` sends `?q` or `/` (found by fuzz/upgrade_head).
    let scheme_ok = uri.scheme_str().is_none_or(|scheme| {
        scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
    });
    let path_ok = uri
        .path_and_query()
        .is_some_and(|path_and_query| path_and_query.as_str().starts_with('/'));
    if !(scheme_ok && path_ok) {
        return Err(UpgradeHeadError::Target);
    }
    let mut headers = HeaderMap::new();
    for line in request.headers.iter() {
        let name = HeaderName::from_bytes(line.name.as_bytes())
            .map_err(|_| UpgradeHeadError::HeaderName(line.name.into()))?;
        let value = HeaderValue::from_bytes(line.value)
            .map_err(|_| UpgradeHeadError::HeaderValue(name.clone()))?;
        headers.append(name, value);
    }
    Ok(RequestHead {
        method,
        uri,
        headers,
    })
}

/// The status of a complete response head.
pub fn parse_response_status(head: &[u8]) -> Result<u16, UpgradeHeadError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut lines);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => response.code.ok_or(UpgradeHeadError::Status),
        Ok(httparse::Status::Partial) => Err(UpgradeHeadError::Incomplete),
        Err(error) => Err(UpgradeHeadError::Syntax(error)),
    }
}

/// `Connection: upgrade` (as one of its tokens) together with an `Upgrade` header.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(http::header::UPGRADE)
}

/// The request head sent upstream: the client's end-to-end headers (identity already replaced
/// by the caller) plus the upgrade pair and the upstream host.
pub fn upstream_head(head: &RequestHead, host: &str, port: u16) -> Vec<u8> {
    let target = head
        .uri
        .path_and_query()
        .map_or("/", |path_and_query| path_and_query.as_str());
    let mut out = format!(
        "{} {target} HTTP/1.1\r\nhost: {host}:{port}\r\n",
        head.method
    )
    .into_bytes();
    for (name, value) in &head.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Relays an admitted upgrade: the request head upstream, the answer back. Only after a 101 do
/// the client's bytes flow (first those it sent behind its head, `early`), both directions until
/// either ends. Any other answer is passed on and the connection closed: the client's bytes
/// never reach the apiserver on a connection it would read as HTTP/1.1 requests (a second
/// request smuggled behind the first would run with the gateway's identity, unchecked).
pub async fn relay<C, U>(
    client: &mut C,
    upstream: &mut U,
    head: Vec<u8>,
    early: Bytes,
) -> Result<u16, UpgradeHeadError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    upstream.write_all(&head).await?;
    upstream.flush().await?;
    let mut answer = BytesMut::with_capacity(4096);
    let head_length = read_head(upstream, &mut answer).await?;
    let status = parse_response_status(&answer[..head_length])?;
    client.write_all(&answer).await?;
    client.flush().await?;
    if status == 101 {
        let early_sent = early.is_empty()
            || (upstream.write_all(&early).await.is_ok() && upstream.flush().await.is_ok());
        if early_sent {
            let _ = tokio::io::copy_bidirectional(client, upstream).await;
        }
    } else {
        let _ = monoio::time::timeout(REFUSAL_DRAIN, tokio::io::copy(upstream, client)).await;
    }
    let _ = client.shutdown().await;
    Ok(status)
}

impl GatewayHandler {
    /// An HTTP/1.1 upgrade: the same checks as any request, then a dedicated HTTP/1.1 TLS
    /// connection to the apiserver and bytes relayed both ways; a refusal is written to the raw
    /// connection, which then closes.
    pub async fn upgrade(
        &self,
        client: &ClientConnection,
        mut stream: ClientStream,
        head: RequestHead,
        early: Bytes,
    ) {
        let started = std::time::Instant::now();
        let generation = self.gateway.current();
        let method = head.method.clone();
        let path = head.uri.path().to_string();
        let query = head.uri.query().unwrap_or("").to_string();
        let decoded = decoded_path(&path);
        let info = request_info(method.as_str(), &decoded, &query);
        let labels = request_labels(&info);
        let _in_flight = InFlight::new(&self.gateway.metrics, self.worker);
        let outcome = match (info, refuse_upgrade_body(&head.headers)) {
            (Ok(info), Ok(())) => {
                self.upgrade_admitted(client, &generation, &info, &mut stream, head, early)
                    .await
            }
            (Err(error), _) => Err(error.into()),
            (_, Err(error)) => Err(error.into()),
        };
        let resource = crate::handler::resource_label(labels.1, outcome.as_ref().err());
        let code = match outcome {
            Ok(status) => status,
            Err(error) => {
                self.refuse(&error, client, method.as_str(), &path);
                let _ = stream.write_all(&crate::answer::http1_bytes(&error)).await;
                let _ = stream.shutdown().await;
                error.http_status().as_u16()
            }
        };
        self.finish(&client.cluster, (labels.0, resource), code, started);
    }

    /// Admission, the upstream connection and the relay; the upstream's status once relayed.
    async fn upgrade_admitted(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        info: &RequestInfo<'_>,
        stream: &mut ClientStream,
        mut head: RequestHead,
        early: Bytes,
    ) -> Result<u16, ProxyError> {
        let Admitted {
            cluster,
            server,
            user,
            // The flow-control permit lives as long as the upgraded stream.
            permit: _permit,
        } = self.admit(client, generation, info, &head.headers).await?;
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];
        let server = &compiled.servers[server];
        let upstream_failed = |cause: UpstreamFailure| ProxyError::Upstream {
            server: server.endpoint.clone(),
            cause,
        };
        let protocol = head.headers.get(http::header::UPGRADE).cloned();
        let mut headers = upstream_headers(&head.headers, &user, runtime.bearer.as_ref())?;
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("Upgrade"),
        );
        if let Some(protocol) = protocol {
            headers.insert(http::header::UPGRADE, protocol);
        }
        head.headers = headers;
        let request = upstream_head(&head, &server.host, server.port);
        let tcp = monoio::net::TcpStream::connect((server.host.as_ref(), server.port))
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeConnect(error)))?;
        let _ = tcp.set_nodelay(true);
        let tcp = sluice_grpc::transport::compat(tcp)
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeConnect(error)))?;
        let name = rustls_pki_types::ServerName::try_from(server.host.to_string())
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeServerName(error)))?;
        let mut upstream =
            tokio_rustls::TlsConnector::from(http1_client_config(&runtime.client_tls))
                .connect(name, tcp)
                .await
                .map_err(|error| upstream_failed(UpstreamFailure::UpgradeTls(error)))?;
        tracing::debug!(cluster = %compiled.name, user = %user.name, path = info.path, server = %server.endpoint, "upgrade");
        let had_early = !early.is_empty();
        let status = relay(stream, &mut upstream, request, early)
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeRelay(error)))?;
        if had_early && status != 101 {
            // Bytes behind an upgrade the apiserver refused: dropped, never sent (a request
            // smuggled behind the first would otherwise run unchecked).
            self.gateway.metrics.upgrade_early_dropped.inc(self.worker);
        }
        Ok(status)
    }
}

/// Serves `prefix` (bytes already read) before reading from `inner`.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Self { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let take = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..take]);
            self.prefix.advance(take);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The gateway's client config for HTTP/1.1 upgrades (same identity, ALPN http/1.1).
pub fn http1_client_config(http2: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**http2).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn upgrade_needs_both_headers() {
        let head = parse_request(
            b"POST /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n",
        )
        .unwrap();
        assert!(is_upgrade(&head.headers));
        assert_eq!(head.uri.query(), Some("command=sh"));
        let plain = parse_request(b"GET /api HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n").unwrap();
        assert!(!is_upgrade(&plain.headers));
    }

    #[test]
    fn upstream_head_carries_the_rewritten_headers() {
        let mut head =
            parse_request(b"POST /x HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
                .unwrap();
        head.headers
            .insert("impersonate-user", HeaderValue::from_static("alice"));
        let text = String::from_utf8(upstream_head(&head, "10.0.0.1", 6443)).unwrap();
        assert!(
            text.starts_with("POST /x HTTP/1.1\r\nhost: 10.0.0.1:6443\r\n"),
            "{text}"
        );
        assert!(text.contains("impersonate-user: alice\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
    }

    #[test]
    fn request_targets_without_a_path_are_refused() {
        for target in ["://-?'ds+", "://x?a", "x:443", "ftp://x/a", "*"] {
            let head = format!(
                "GET {target} HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            );
            let error = parse_request(head.as_bytes()).unwrap_err();
            assert!(
                matches!(error, UpgradeHeadError::Target),
                "{target}: {error:?}"
            );
        }
        for target in [
            "/api/v1/pods",
            "https://gw.example/api?watch=1",
            "HTTP://gw/",
        ] {
            let head = format!("GET {target} HTTP/1.1\r\n\r\n");
            let parsed = parse_request(head.as_bytes()).unwrap();
            let upstream = upstream_head(&parsed, "10.0.0.1", 6443);
            assert!(upstream.starts_with(b"GET /"), "{target}");
        }
    }

    #[test]
    fn malformed_heads_say_what_is_wrong() {
        let error = parse_request(b"GET / HTTP/1.1\r\nbad name: x\r\n\r\n").unwrap_err();
        assert!(matches!(error, UpgradeHeadError::Syntax(_)), "{error:?}");
        let error = parse_request(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert!(matches!(error, UpgradeHeadError::Incomplete), "{error:?}");
        assert_eq!(error.to_string(), "malformed head: incomplete");
        let error = parse_response_status(b"HTTP/1.1 abc\r\n\r\n").unwrap_err();
        assert!(matches!(error, UpgradeHeadError::Syntax(_)), "{error:?}");
    }

    #[test]
    fn rewind_serves_the_bytes_already_read_first() {
        use futures_util::FutureExt;
        let mut rewound = Rewind::new(Bytes::from_static(b"GET / HTTP/1.1\r\n"), &b"rest"[..]);
        let mut all = Vec::new();
        rewound
            .read_to_end(&mut all)
            .now_or_never()
            .expect("in-memory reads are ready")
            .unwrap();
        assert_eq!(all, b"GET / HTTP/1.1\r\nrest");
    }

    /// Runs `future` on a monoio runtime with timers and no sockets.
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn a_refused_upgrade_is_passed_on_and_the_connection_closed() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let status = block_on(async {
            server
                .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno")
                .await
                .unwrap();
            server.shutdown().await.unwrap();
            relay(
                &mut client_peer,
                &mut upstream,
                b"POST /exec HTTP/1.1\r\n\r\n".to_vec(),
                Bytes::from_static(b"early"),
            )
            .await
            .unwrap()
        });
        assert_eq!(status, 403);
        drop(client_peer);
        drop(upstream);
        let (to_client, to_server) = block_on(async {
            let mut to_client = Vec::new();
            client.read_to_end(&mut to_client).await.unwrap();
            let mut to_server = Vec::new();
            server.read_to_end(&mut to_server).await.unwrap();
            (to_client, to_server)
        });
        assert_eq!(
            to_client,
            b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno"
        );
        assert_eq!(
            to_server, b"POST /exec HTTP/1.1\r\n\r\n",
            "the client's early bytes (a smuggled request) never reach the apiserver"
        );
    }

    #[test]
    fn early_bytes_go_upstream_only_after_the_101() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let (status, seen_before_answer) = block_on(async {
            let server_side = async {
                // Everything the gateway wrote before the apiserver answers.
                let mut head = BytesMut::new();
                let length = read_head(&mut server, &mut head).await.unwrap();
                assert_eq!(length, head.len(), "nothing but the head before the answer");
                server
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
                    .await
                    .unwrap();
                let mut early = [0u8; 5];
                server.read_exact(&mut early).await.unwrap();
                assert_eq!(&early, b"early");
                server.shutdown().await.unwrap();
                head
            };
            let relay_side = async {
                let status = relay(
                    &mut client_peer,
                    &mut upstream,
                    b"POST /exec HTTP/1.1\r\n\r\n".to_vec(),
                    Bytes::from_static(b"early"),
                )
                .await
                .unwrap();
                drop(client_peer);
                status
            };
            let client_side = async {
                client.shutdown().await.unwrap();
                let mut all = Vec::new();
                client.read_to_end(&mut all).await.unwrap();
                all
            };
            let (head, status, _) =
                futures_util::future::join3(server_side, relay_side, client_side).await;
            (status, head)
        });
        assert_eq!(status, 101);
        assert_eq!(&seen_before_answer[..], b"POST /exec HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_malformed_answer_is_an_error_before_anything_reaches_the_client() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let outcome = block_on(async {
            server.write_all(b"garbage\r\n\r\n").await.unwrap();
            relay(
                &mut client_peer,
                &mut upstream,
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
                Bytes::new(),
            )
            .await
        });
        assert!(
            matches!(outcome, Err(UpgradeHeadError::Syntax(_))),
            "{outcome:?}"
        );
        drop(client_peer);
        let to_client = block_on(async {
            let mut to_client = Vec::new();
            client.read_to_end(&mut to_client).await.unwrap();
            to_client
        });
        assert!(to_client.is_empty());
    }

    proptest! {
        #[test]
        fn arbitrary_heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&bytes);
            let _ = parse_response_status(&bytes);
        }
    }
}
