//! What a request is answered with, and the one place that turns it into an HTTP response.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt as _;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use sluice_apimachinery::StatusError;
use tokio::sync::mpsc;

/// Not `Sync`: a watch's body holds the store's watch stream, which only its connection's
/// stream task polls.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A handler's answer.
pub enum Reply {
    /// A JSON document; `warnings` become `Warning: 299 - "..."` headers (kubectl prints them).
    Json {
        status: StatusCode,
        body: Value,
        warnings: Vec<String>,
    },
    /// Prometheus text.
    Text(String),
    /// Bytes of a fixed content type (the protobuf `/openapi/v2`).
    Bytes {
        content_type: &'static str,
        body: Bytes,
    },
    /// A watch: newline-delimited JSON events as the stream produces them.
    Stream(BoxStream<'static, Bytes>),
}

impl Reply {
    pub fn ok(body: Value) -> Self {
        Self::json(StatusCode::OK, body)
    }

    pub fn json(status: StatusCode, body: Value) -> Self {
        Reply::Json {
            status,
            body,
            warnings: Vec::new(),
        }
    }

    pub fn with_warnings(self, more: Vec<String>) -> Self {
        match self {
            Reply::Json {
                status,
                body,
                mut warnings,
            } => {
                warnings.extend(more);
                Reply::Json {
                    status,
                    body,
                    warnings,
                }
            }
            other => other,
        }
    }
}

/// Renders a reply (or a failure as a `Status`) and returns it with its status code.
pub fn render(outcome: Result<Reply, StatusError>) -> Response<Body> {
    match outcome {
        Ok(Reply::Json {
            status,
            body,
            warnings,
        }) => json_response(status, &body, &warnings),
        Ok(Reply::Text(text)) => {
            let mut response = Response::new(full(Bytes::from(text)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        Ok(Reply::Bytes { content_type, body }) => {
            let mut response = Response::new(full(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            );
            response
        }
        Ok(Reply::Stream(receiver)) => stream_response(receiver),
        Err(error) => status_response(&error),
    }
}

pub fn status_response(error: &StatusError) -> Response<Body> {
    let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &error.to_json(), &[])
}

fn json_response(status: StatusCode, body: &Value, warnings: &[String]) -> Response<Body> {
    let mut bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes.push(b'\n');
    let mut response = Response::new(full(Bytes::from(bytes)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for warning in warnings {
        let text = format!("299 - {:?}", warning);
        if let Ok(value) = HeaderValue::from_str(&text) {
            headers.append(http::header::WARNING, value);
        }
    }
    response
}

/// The chunks a task sends on `receiver` as a watch's stream (a VM agent's span watch).
pub fn received(receiver: mpsc::Receiver<Bytes>) -> BoxStream<'static, Bytes> {
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        let chunk = receiver.recv().await?;
        Some((chunk, receiver))
    })
    .boxed()
}

/// A watch's body. The connection's stream task polls the watch itself, so a panic there is
/// contained here: it ends this watch's body (the client watches again), and is logged and
/// counted (`panics.rs`).
fn stream_response(stream: BoxStream<'static, Bytes>) -> Response<Body> {
    let frames = std::panic::AssertUnwindSafe(stream)
        .catch_unwind()
        .filter_map(|chunk| {
            if let Err(payload) = &chunk {
                let message = super::panics::message_of(payload.as_ref());
                super::panics::record(super::panics::Task::Watch, message);
            }
            std::future::ready(
                chunk
                    .ok()
                    .map(|chunk| Ok::<_, Infallible>(Frame::data(chunk))),
            )
        });
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn full(bytes: Bytes) -> Body {
    BodyExt::boxed_unsync(Full::new(bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use futures_util::StreamExt;

    use super::super::panics::{count, Task};
    use super::*;

    /// A watch whose stream panics after its first event: the client gets that event, then
    /// the body ends; the panic is counted, and the server (this test's runtime) goes on.
    #[tokio::test]
    async fn a_panicking_watch_ends_its_body_and_is_counted() {
        let before = count(Task::Watch);
        let stream = futures_util::stream::iter([Bytes::from_static(b"{\"type\":\"ADDED\"}\n")])
            .chain(futures_util::stream::once(async {
                panic!("planted in a watch")
            }))
            .boxed();
        let response = render(Ok(Reply::Stream(stream)));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"type\":\"ADDED\"}\n");
        assert_eq!(count(Task::Watch), before + 1);
    }
}
