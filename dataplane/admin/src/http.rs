//! Request-head parsing for the admin endpoint: pure functions on bytes, no I/O.

/// Largest request head accepted; admin requests are a line and a few headers.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Other,
}

/// The parts of a request head the admin routes need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// Path without the query string.
    pub path: String,
    pub keep_alive: bool,
}

/// Why a request head was refused; each maps to a status and a bounded metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("request head larger than {MAX_HEAD_BYTES} bytes")]
    TooLarge,
    #[error("more than {MAX_HEADERS} request headers")]
    TooManyHeaders,
    #[error("admin routes take no request body")]
    BodyNotAllowed,
    #[error("request head not received in time")]
    Timeout,
    #[error("connection closed in the middle of a request head")]
    Truncated,
}

impl HeadError {
    pub fn status(&self) -> u16 {
        match self {
            HeadError::Malformed(_) | HeadError::Truncated => 400,
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
            HeadError::BodyNotAllowed => 413,
            HeadError::Timeout => 408,
        }
    }

    pub fn status_reason(&self) -> &'static str {
        match self.status() {
            400 => "Bad Request",
            408 => "Request Timeout",
            413 => "Content Too Large",
            _ => "Request Header Fields Too Large",
        }
    }

    /// Label for `sluice_admin_bad_requests_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            HeadError::Malformed(_) => "malformed",
            HeadError::TooLarge | HeadError::TooManyHeaders => "too_large",
            HeadError::BodyNotAllowed => "body",
            HeadError::Timeout => "timeout",
            HeadError::Truncated => "truncated",
        }
    }
}

/// Parses one request head from the front of `buffer`. `Ok(None)`: incomplete, read more.
/// On success also returns how many bytes the head took.
pub fn parse_head(buffer: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let consumed = match request.parse(buffer) {
        Ok(httparse::Status::Complete(consumed)) => consumed,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(error) => return Err(HeadError::Malformed(error.to_string())),
    };
    let method = match request.method {
        Some("GET") => Method::Get,
        Some("HEAD") => Method::Head,
        _ => Method::Other,
    };
    let target = request.path.unwrap_or("/");
    let path = target
        .split_once('?')
        .map_or(target, |(path, _)| path)
        .to_string();
    let http11 = request.version == Some(1);
    let mut keep_alive = http11;
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("connection") {
            let value = String::from_utf8_lossy(header.value);
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let length = std::str::from_utf8(header.value)
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
                .ok_or_else(|| HeadError::Malformed("invalid Content-Length".to_string()))?;
            if length > 0 {
                return Err(HeadError::BodyNotAllowed);
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HeadError::BodyNotAllowed);
        }
    }
    Ok(Some((
        RequestHead {
            method,
            path,
            keep_alive,
        },
        consumed,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Result<Option<(RequestHead, usize)>, HeadError> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn simple_get_keeps_alive_on_http11() {
        let (head, consumed) = parse("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next")
            .unwrap()
            .unwrap();
        assert_eq!(head.method, Method::Get);
        assert_eq!(head.path, "/metrics");
        assert!(head.keep_alive);
        assert_eq!(
            consumed,
            "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n".len()
        );
    }

    #[test]
    fn connection_header_and_version_decide_keep_alive() {
        let close = parse("HEAD /readyz HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(close.method, Method::Head);
        assert!(!close.keep_alive);
        let http10 = parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().0;
        assert!(!http10.keep_alive);
        let http10_keep = parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap()
            .0;
        assert!(http10_keep.keep_alive);
    }

    #[test]
    fn partial_head_asks_for_more() {
        assert_eq!(parse("GET /metrics HTTP/1.1\r\nHost:"), Ok(None));
        assert_eq!(parse(""), Ok(None));
    }

    #[test]
    fn bodies_and_garbage_are_refused_with_statuses() {
        let body = parse("POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").unwrap_err();
        assert_eq!((body.status(), body.reason()), (413, "body"));
        let chunked = parse("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap_err();
        assert_eq!(chunked.status(), 413);
        let bad_length = parse("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").unwrap_err();
        assert_eq!(
            (bad_length.status(), bad_length.reason()),
            (400, "malformed")
        );
        let garbage = parse("\x16\x03\x01\x02\x00 binary\r\n\r\n").unwrap_err();
        assert_eq!(garbage.status(), 400);
        let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
        let too_many = parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
        assert_eq!(too_many, HeadError::TooManyHeaders);
        assert_eq!(too_many.status(), 431);
    }

    #[test]
    fn other_methods_parse_as_other() {
        let (head, _) = parse("DELETE /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.method, Method::Other);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_head(&bytes);
        }

        #[test]
        fn mutated_requests_never_panic(
            prefix in "(GET|HEAD|POST|\\x00)? ?/[a-z?=&%]{0,20} HTTP/1\\.[0-9]",
            headers in prop::collection::vec("[A-Za-z-]{1,12}: [ -~]{0,20}", 0..8),
        ) {
            let text = format!("{prefix}\r\n{}\r\n\r\n", headers.join("\r\n"));
            if let Ok(Some((_, consumed))) = parse_head(text.as_bytes()) {
                prop_assert!(consumed <= text.len());
            }
        }
    }
}
