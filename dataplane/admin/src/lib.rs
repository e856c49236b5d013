//! The admin endpoint every Sluice role exposes on its own listener:
//!
//! - `GET /metrics`: Prometheus metrics (OpenMetrics text, which Prometheus negotiates);
//! - `GET /healthz`: 200 while the process is alive;
//! - `GET /readyz`: 200 once every listener is bound and config is loaded, 503 while starting,
//!   draining or overloaded (an overload action is active: load balancers move new traffic away
//!   while the process sheds; `/healthz` stays 200 so nothing restarts a process that copes).
//!
//! HTTP/1.1 with keep-alive, parsed by `httparse`. It runs on the runtime's dedicated thread so it
//! keeps answering while the data plane drains. Request heads are bounded in size and time;
//! bodies are refused (no admin route takes one).

mod http;
mod metrics;

/// Whether an overload action is active (the process is near its memory or descriptor limit).
fn overloaded() -> bool {
    sluice_overload::Action::ALL
        .into_iter()
        .any(sluice_overload::is_active)
}

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;
use prometheus_client::registry::Registry;
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, Phase, TcpStream, WorkerContext,
};

pub use http::{parse_head, HeadError, Method, RequestHead, MAX_HEAD_BYTES};
pub use metrics::AdminMetrics;
// Every role's own metrics, re-exported so the data-plane roles wire them with their endpoint.
pub use sluice_role_metrics::{
    earliest_not_after, register_build_info, CertificateError, CertificateExpiry, ProcError,
    ProcFile, ProcessCollector, REVISION,
};

/// Settings of the admin endpoint.
#[derive(Debug, Clone)]
pub struct AdminOptions {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Builds the admin handler on the thread that serves the admin listener.
#[derive(Debug, Clone)]
pub struct AdminEndpoint {
    registry: Arc<Registry>,
    metrics: AdminMetrics,
    options: AdminOptions,
}

impl AdminEndpoint {
    pub fn new(registry: Arc<Registry>, metrics: AdminMetrics, options: AdminOptions) -> Self {
        Self {
            registry,
            metrics,
            options,
        }
    }
}

impl HandlerFactory for AdminEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(self.clone())
    }
}

impl ConnectionHandler for AdminEndpoint {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let peer = conn.peer;
            if let Err(error) = self.serve(stream, conn).await {
                tracing::debug!(%peer, %error, "admin connection ended with an error");
            }
        })
    }
}

/// A response ready to be written.
struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
    extra_header: Option<&'static str>,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            extra_header: None,
        }
    }

    fn encode(&self, head_only: bool, keep_alive: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: {}\r\n{}\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len(),
            if keep_alive { "keep-alive" } else { "close" },
            self.extra_header.unwrap_or(""),
        )
        .into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

impl AdminEndpoint {
    async fn serve(&self, mut stream: TcpStream, conn: ConnectionContext) -> std::io::Result<()> {
        let mut buffer = Vec::with_capacity(1024);
        loop {
            let head = match self.read_head(&mut stream, &mut buffer, &conn).await? {
                Some(head) => head,
                None => return Ok(()),
            };
            let (head, consumed) = match head {
                Ok(parsed) => parsed,
                Err(error) => {
                    self.metrics.bad_request(error.reason());
                    let response =
                        Response::text(error.status(), error.status_reason(), format!("{error}\n"));
                    let (result, _) = stream.write_all(response.encode(false, false)).await;
                    return result.map(drop);
                }
            };
            buffer.drain(..consumed);
            let response = self.route(&head, &conn);
            let keep_alive = head.keep_alive && !conn.is_draining();
            let (result, _) = stream
                .write_all(response.encode(head.method == Method::Head, keep_alive))
                .await;
            result?;
            conn.request_served();
            if !keep_alive {
                return Ok(());
            }
        }
    }

    /// Reads until a whole request head is buffered. `Ok(None)`: the peer closed or the
    /// connection idled out (or the endpoint is stopping) between requests.
    async fn read_head(
        &self,
        stream: &mut TcpStream,
        buffer: &mut Vec<u8>,
        conn: &ConnectionContext,
    ) -> std::io::Result<Option<Result<(RequestHead, usize), HeadError>>> {
        use monoio::buf::IoBufMut;
        use monoio::io::AsyncReadRent;

        let mut head_deadline = None;
        loop {
            match parse_head(buffer) {
                Ok(Some(parsed)) => return Ok(Some(Ok(parsed))),
                Ok(None) => {}
                Err(error) => return Ok(Some(Err(error))),
            }
            if buffer.len() >= MAX_HEAD_BYTES {
                return Ok(Some(Err(HeadError::TooLarge)));
            }
            if buffer.capacity() == buffer.len() {
                buffer.reserve(1024);
            }
            let spare = std::mem::take(buffer);
            let start = spare.len();
            let end = spare.capacity().min(MAX_HEAD_BYTES);
            let read = stream.read(spare.slice_mut(start..end));
            let (result, slice) = if start == 0 {
                // Between requests: wait for the next one, the idle timeout, or the stop.
                if conn.is_draining() {
                    return Ok(None);
                }
                monoio::select! {
                    read = monoio::time::timeout(self.options.idle_timeout, read) => match read {
                        Ok(read) => read,
                        Err(_) => return Ok(None),
                    },
                    _ = conn.draining() => return Ok(None),
                }
            } else {
                let deadline = *head_deadline.get_or_insert_with(|| {
                    monoio::time::Instant::now() + self.options.header_timeout
                });
                match monoio::time::timeout_at(deadline, read).await {
                    Ok(read) => read,
                    Err(_) => return Ok(Some(Err(HeadError::Timeout))),
                }
            };
            *buffer = slice.into_inner();
            match result? {
                0 if buffer.is_empty() => return Ok(None),
                0 => return Ok(Some(Err(HeadError::Truncated))),
                _ => {
                    head_deadline.get_or_insert_with(|| {
                        monoio::time::Instant::now() + self.options.header_timeout
                    });
                }
            }
        }
    }

    fn route(&self, head: &RequestHead, conn: &ConnectionContext) -> Response {
        if !matches!(head.method, Method::Get | Method::Head) {
            self.metrics.bad_request("method");
            let mut response = Response::text(
                405,
                "Method Not Allowed",
                "only GET and HEAD are served here\n",
            );
            response.extra_header = Some("Allow: GET, HEAD\r\n");
            return response;
        }
        match head.path.as_str() {
            "/metrics" => {
                let mut text = String::with_capacity(8 * 1024);
                match prometheus_client::encoding::text::encode(&mut text, &self.registry) {
                    Ok(()) => Response {
                        status: 200,
                        reason: "OK",
                        content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body: text.into_bytes(),
                        extra_header: None,
                    },
                    Err(_) => Response::text(500, "Internal Server Error", "metrics encoding failed\n"),
                }
            }
            "/healthz" => Response::text(200, "OK", "ok\n"),
            "/readyz" => match conn.lifecycle().phase() {
                Phase::Ready if overloaded() => Response::text(503, "Service Unavailable", "overloaded\n"),
                Phase::Ready => Response::text(200, "OK", "ready\n"),
                phase => Response::text(503, "Service Unavailable", format!("{}\n", phase.as_str())),
            },
            "/" => Response::text(
                200,
                "OK",
                "Sluice admin endpoint\n  /metrics  Prometheus metrics\n  /healthz  liveness\n  /readyz   readiness\n",
            ),
            path => Response::text(404, "Not Found", format!("no admin route {path:?}; try /metrics, /healthz or /readyz\n")),
        }
    }
}
