//! The one place a [`ProxyError`] becomes what the client receives (a Kubernetes `Status`, as an
//! HTTP response on a served connection or as raw HTTP/1.1 on an upgrade connection) and what the
//! metrics and logs record.

use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::Response;

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::metrics::GatewayMetrics;

/// Refusal log lines a core writes per second; past it they are counted, not written.
pub const REFUSAL_LOGS_PER_SECOND: u32 = 10;
/// Bytes of a client's path a refusal log line shows.
const LOGGED_PATH_BYTES: usize = 200;

/// A per-core budget of refusal log lines: refusals are the client's to multiply, the log is
/// not.
#[derive(Debug)]
pub struct LogBudget {
    window: Instant,
    written: u32,
    suppressed: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        Self {
            window: Instant::now(),
            written: 0,
            suppressed: 0,
        }
    }
}

/// What to do with one refusal's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogDecision {
    /// Write it; `suppressed` lines were dropped since the last one written.
    Write {
        suppressed: u64,
    },
    Suppress,
}

impl LogBudget {
    pub fn decide(&mut self, now: Instant) -> LogDecision {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.written = 0;
        }
        if self.written >= REFUSAL_LOGS_PER_SECOND {
            self.suppressed += 1;
            return LogDecision::Suppress;
        }
        self.written += 1;
        LogDecision::Write {
            suppressed: std::mem::take(&mut self.suppressed),
        }
    }
}

/// At most `LOGGED_PATH_BYTES` of a path, cut at a character boundary.
pub fn loggable_path(path: &str) -> &str {
    if path.len() <= LOGGED_PATH_BYTES {
        return path;
    }
    let mut end = LOGGED_PATH_BYTES;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

/// A refusal, counted under its reason, and logged within the core's log budget (the lines
/// past it are counted in `sluice_gateway_refusal_logs_suppressed_total`).
pub fn record(
    error: &ProxyError,
    metrics: &GatewayMetrics,
    (worker, budget): (usize, &mut LogBudget),
    (cluster, method, path): (&str, &str, &str),
) {
    metrics.reject(error.metric_label(), worker);
    match budget.decide(Instant::now()) {
        LogDecision::Write { suppressed } => {
            let path = loggable_path(path);
            tracing::info!(cluster, method, path, status = error.http_status().as_u16(), side = ?error.side(), %error, suppressed_since_last = suppressed, "request refused");
        }
        LogDecision::Suppress => metrics.refusal_logs_suppressed.inc(worker),
    }
}

/// A client connection refused before any HTTP (unknown host, failed TLS handshake): counted
/// and logged; there is no one to answer.
pub fn record_connection(
    error: &ProxyError,
    metrics: &GatewayMetrics,
    worker: usize,
    peer: std::net::SocketAddr,
) {
    metrics.reject(error.metric_label(), worker);
    match error {
        // Scanners and clients giving up: not worth a line each at info.
        ProxyError::Handshake(_) => tracing::debug!(%peer, %error, "connection refused"),
        _ => tracing::info!(%peer, %error, "connection refused"),
    }
}

/// The error as an HTTP response (hyper encodes it for HTTP/1.1 or HTTP/2).
pub fn response(error: &ProxyError) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(error.status_body()));
    *response.status_mut() = error.http_status();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(seconds) = error.retry_after_seconds() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// [`response`] for a request with `method`: a `HEAD` gets the status and headers without the
/// body. A response to HEAD carries no content (RFC 9110 9.3.2); over HTTP/2 DATA frames on it
/// are a protocol error to the client, which then never sees the status.
pub fn response_to(method: &http::Method, error: &ProxyError) -> Response<ProxyBody> {
    let mut response = response(error);
    if method == http::Method::HEAD {
        *response.body_mut() = ProxyBody::Full(None);
    }
    response
}

/// The error as an HTTP/1.1 response that closes the connection (the upgrade path writes the
/// raw connection itself).
pub fn http1_bytes(error: &ProxyError) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_gateway::status::GatewayError;

    fn body_bytes(response: &Response<ProxyBody>) -> &[u8] {
        match response.body() {
            ProxyBody::Full(Some(bytes)) => bytes,
            other => panic!("not a full body: {other:?}"),
        }
    }

    #[test]
    fn a_response_carries_the_status_json_and_retry_after() {
        let error = ProxyError::from(GatewayError::NoHealthyUpstream {
            cluster: "c".into(),
        });
        let response = response(&error);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(body_bytes(&response), error.status_body());

        let response = super::response(&ProxyError::from(GatewayError::Unauthorized));
        assert_eq!(response.status(), 401);
        assert!(!response.headers().contains_key("retry-after"));
    }

    #[test]
    fn a_refused_head_gets_its_status_and_headers_without_a_body() {
        use http_body::Body as _;
        let error = ProxyError::from(GatewayError::NoHealthyUpstream {
            cluster: "c".into(),
        });
        let head = response_to(&http::Method::HEAD, &error);
        assert_eq!(head.status(), 503);
        assert_eq!(head.headers()["retry-after"], "1");
        assert!(head.body().is_end_stream(), "no DATA on a HEAD answer");
        let get = response_to(&http::Method::GET, &error);
        assert_eq!(body_bytes(&get), error.status_body());
    }

    #[test]
    fn refusal_logs_are_limited_per_second() {
        let start = Instant::now();
        let mut budget = LogBudget {
            window: start,
            written: 0,
            suppressed: 0,
        };
        for _ in 0..REFUSAL_LOGS_PER_SECOND {
            assert_eq!(budget.decide(start), LogDecision::Write { suppressed: 0 });
        }
        for _ in 0..5 {
            assert_eq!(budget.decide(start), LogDecision::Suppress);
        }
        assert_eq!(
            budget.decide(start + Duration::from_secs(1)),
            LogDecision::Write { suppressed: 5 },
            "the next line says how many were dropped"
        );
    }

    #[test]
    fn logged_paths_are_cut() {
        assert_eq!(loggable_path("/api/v1/pods"), "/api/v1/pods");
        let long = format!("/{}", "é".repeat(300));
        let cut = loggable_path(&long);
        assert!(cut.len() <= LOGGED_PATH_BYTES && long.starts_with(cut));
    }

    #[test]
    fn http1_refusals_close_the_connection() {
        let error = ProxyError::from(GatewayError::Unauthorized);
        let text = String::from_utf8(http1_bytes(&error)).unwrap();
        assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
        assert!(text.contains("connection: close\r\n"));
        assert!(!text.contains("retry-after"));
        let body = String::from_utf8(error.status_body()).unwrap();
        assert!(text.ends_with(&format!("\r\n\r\n{body}")), "{text}");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
    }

    #[test]
    fn http1_refusals_say_when_to_retry() {
        let error = ProxyError::from(GatewayError::TooManyRequests {
            schema: "slow".into(),
        });
        let text = String::from_utf8(http1_bytes(&error)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{text}"
        );
        assert!(text.contains("retry-after: 1\r\n"), "{text}");
    }
}
