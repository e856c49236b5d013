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
use sluice_gateway::status::GatewayError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Largest request or response head accepted.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header lines in a head.
const MAX_HEADERS: usize = 128;
/// How long a non-101 answer to an upgrade may keep streaming before the connection closes.
const REFUSAL_DRAIN: Duration = Duration::from_secs(2);

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("connection closed before a complete head")]
    Closed,
    #[error("head larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("malformed head: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads until `buffer` holds a complete head; returns its length (body bytes may follow).
pub async fn read_head<S: AsyncRead + Unpin>(
    io: &mut S,
    buffer: &mut BytesMut,
) -> Result<usize, HeadError> {
    loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            return Ok(end + 4);
        }
        if buffer.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        buffer.reserve(8 * 1024);
        if io.read_buf(buffer).await? == 0 {
            return Err(HeadError::Closed);
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
pub fn parse_request(head: &[u8]) -> Result<RequestHead, HeadError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut lines);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HeadError::Malformed("incomplete".into())),
        Err(error) => return Err(HeadError::Malformed(error.to_string())),
    }
    let method = request
        .method
        .and_then(|method| http::Method::from_bytes(method.as_bytes()).ok())
        .ok_or_else(|| HeadError::Malformed("method".into()))?;
    let uri: http::Uri = request
        .path
        .and_then(|path| path.parse().ok())
        .ok_or_else(|| HeadError::Malformed("request target".into()))?;
    let mut headers = HeaderMap::new();
    for line in request.headers.iter() {
        let name = HeaderName::from_bytes(line.name.as_bytes())
            .map_err(|_| HeadError::Malformed(format!("header name {:?}", line.name)))?;
        let value = HeaderValue::from_bytes(line.value)
            .map_err(|_| HeadError::Malformed(format!("value of {name}")))?;
        headers.append(name, value);
    }
    Ok(RequestHead {
        method,
        uri,
        headers,
    })
}

/// The status of a complete response head.
pub fn parse_response_status(head: &[u8]) -> Result<u16, HeadError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut lines);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => response
            .code
            .ok_or_else(|| HeadError::Malformed("status".into())),
        Ok(httparse::Status::Partial) => Err(HeadError::Malformed("incomplete".into())),
        Err(error) => Err(HeadError::Malformed(error.to_string())),
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

/// A gateway error as an HTTP/1.1 response that closes the connection.
pub fn error_response(error: &GatewayError) -> Vec<u8> {
    let body = error.status_body();
    let status = error.http_status();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    if let Some(seconds) = error.retry_after_seconds() {
        head.push_str(&format!("retry-after: {seconds}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Relays an admitted upgrade: request head (and any early bytes) upstream, the answer back;
/// after a 101 both directions until either ends. Any other answer is passed on and the
/// connection closed: nothing more from the client reaches the apiserver on this connection
/// without the checks a request gets.
pub async fn relay<C, U>(
    client: &mut C,
    upstream: &mut U,
    head: Vec<u8>,
    early: Bytes,
) -> Result<u16, HeadError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    upstream.write_all(&head).await?;
    if !early.is_empty() {
        upstream.write_all(&early).await?;
    }
    upstream.flush().await?;
    let mut answer = BytesMut::with_capacity(4096);
    let head_length = read_head(upstream, &mut answer).await?;
    let status = parse_response_status(&answer[..head_length])?;
    client.write_all(&answer).await?;
    client.flush().await?;
    if status == 101 {
        let _ = tokio::io::copy_bidirectional(client, upstream).await;
    } else {
        let _ = monoio::time::timeout(REFUSAL_DRAIN, tokio::io::copy(upstream, client)).await;
    }
    let _ = client.shutdown().await;
    Ok(status)
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
    fn error_responses_close_the_connection() {
        let text = String::from_utf8(error_response(&GatewayError::Unauthorized)).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
        assert!(text.contains("connection: close\r\n"));
    }

    proptest! {
        #[test]
        fn arbitrary_heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&bytes);
            let _ = parse_response_status(&bytes);
        }
    }
}
