//! The VM agent's admin endpoint: `/metrics`, `/healthz`, `/readyz` over HTTP/1.1, one
//! request per connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// How long an admin client may take to send its request head (and to take the answer).
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections served at once; more wait in the kernel backlog.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// `/metrics`, `/healthz`, `/readyz` over HTTP/1.1, one request per connection. A few lines
/// on tokio rather than a server framework: three fixed GET routes scraped every few seconds.
/// A client gets `ADMIN_REQUEST_TIMEOUT` for its head and the answer; a failing accept (out of
/// descriptors) backs off instead of spinning.
pub async fn serve_admin(
    listener: TcpListener,
    registry: Arc<Mutex<Registry>>,
    ready: Arc<AtomicBool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "admin accept failed; pausing 100ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let answered = tokio::time::timeout(
                ADMIN_REQUEST_TIMEOUT,
                answer_admin(&mut stream, &registry, &ready),
            );
            let _ = answered.await;
        });
    }
}

/// Reads one request head and answers it.
async fn answer_admin(
    stream: &mut tokio::net::TcpStream,
    registry: &Mutex<Registry>,
    ready: &AtomicBool,
) {
    let mut buf = vec![0u8; 4096];
    let mut filled = 0;
    let path = loop {
        let Ok(read) = stream.read(&mut buf[filled..]).await else {
            return;
        };
        if read == 0 {
            return;
        }
        filled += read;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(_)) => break request.path.unwrap_or("/").to_string(),
            Ok(httparse::Status::Partial) if filled < buf.len() => continue,
            _ => return,
        }
    };
    let (status, body) = match path.as_str() {
        "/metrics" => {
            let mut text = String::new();
            let encoded = match registry.lock() {
                Ok(registry) => prometheus_client::encoding::text::encode(&mut text, &registry),
                Err(_) => Err(std::fmt::Error),
            };
            match encoded {
                Ok(()) => ("200 OK", text),
                Err(_) => ("500 Internal Server Error", "encoding failed\n".to_string()),
            }
        }
        "/healthz" => ("200 OK", "ok\n".to_string()),
        "/readyz" if ready.load(Ordering::Acquire) => ("200 OK", "ready\n".to_string()),
        "/readyz" => ("503 Service Unavailable", "not realized yet\n".to_string()),
        _ => ("404 Not Found", "not found\n".to_string()),
    };
    let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
    let _ = stream.write_all(response.as_bytes()).await;
}
