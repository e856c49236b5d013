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
