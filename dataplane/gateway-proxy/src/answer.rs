//! The one place a [`ProxyError`] becomes what the client receives (a Kubernetes `Status`, as an
//! HTTP response on a served connection or as raw HTTP/1.1 on an upgrade connection) and what the
//! metrics and logs record.

use http::header::{self, HeaderValue};
use http::Response;

use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::metrics::GatewayMetrics;

/// A refusal, counted under its reason and logged once.
pub fn record(
    error: &ProxyError,
    metrics: &GatewayMetrics,
    worker: usize,
    (cluster, method, path): (&str, &str, &str),
) {
    metrics.reject(error.metric_label(), worker);
    tracing::info!(cluster, method, path, status = error.http_status().as_u16(), side = ?error.side(), %error, "request refused");
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
