//! The HTTP/1.1 request and response heads of an upgrade (exec, attach, port-forward), read and
//! parsed by hand (see `upgrade.rs` for why not by hyper), and the replay of a head already read
//! into hyper when the request is no upgrade after all.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::error::{UpgradeHeadError, MAX_HEAD_BYTES};

/// Most header lines in a head.
const MAX_HEADERS: usize = 128;

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

    proptest! {
        #[test]
        fn arbitrary_heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&bytes);
            let _ = parse_response_status(&bytes);
        }
    }
}
