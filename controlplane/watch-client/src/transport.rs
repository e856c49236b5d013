//! HTTPS GETs to the API server: TCP, rustls, hyper's HTTP/1.1 client, bearer token.
//!
//! One connection per LIST or WATCH: a watch holds its connection for minutes anyway, and a
//! fresh connection re-reads the token and re-checks the server certificate each time.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::WatchClientConfig;
use crate::decode::error_of;
use crate::error::WatchError;

/// How much of an error answer's body is read to find its `Status` message.
const MAX_ERROR_BODY: usize = 64 << 10;

/// A connected, authenticated way to send GETs to one server.
pub struct Transport {
    host: String,
    port: u16,
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    token_file: Option<PathBuf>,
    connect_timeout: Duration,
}

/// A 200 answer whose body is being streamed, and the task driving its connection.
pub struct Streaming {
    pub body: Incoming,
    _driver: AbortOnDrop,
}

impl Transport {
    /// Parses the URL and loads the CA and client certificate once (errors here are config
    /// errors: the files are not re-read).
    pub fn new(config: &WatchClientConfig) -> Result<Self, WatchError> {
        let (host, port) = parse_url(&config.url)?;
        let server_name = ServerName::try_from(host.clone())
            .map_err(|_| WatchError::Config(format!("{host:?} is not a valid server name")))?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Self {
            host,
            port,
            authority,
            server_name,
            tls: TlsConnector::from(Arc::new(tls_config(config)?)),
            token_file: config.token_file.clone(),
            connect_timeout: config.connect_timeout,
        })
    }

    /// GET `path_and_query`; a 200's body is returned for streaming, anything else becomes
    /// the error its `Status` body describes (410: [`WatchError::Expired`]).
    pub async fn get(&self, path_and_query: &str) -> Result<Streaming, WatchError> {
        self.send(
            Method::GET,
            path_and_query,
            Bytes::new(),
            "application/json",
        )
        .await
    }

    /// POSTs a JSON object (a create) and returns the server's answer, at most `limit` bytes.
    pub async fn post_json(
        &self,
        path: &str,
        body: Bytes,
        limit: usize,
    ) -> Result<Bytes, WatchError> {
        let mut answer = self
            .send(Method::POST, path, body, "application/json")
            .await?;
        read_body(&mut answer.body, limit, "answer").await
    }

    /// PATCHes with a JSON merge patch (a role reporting its view in an object's status) and
    /// returns the server's answer, at most `limit` bytes.
    pub async fn merge_patch(
        &self,
        path: &str,
        body: Bytes,
        limit: usize,
    ) -> Result<Bytes, WatchError> {
        let content_type = "application/merge-patch+json";
        let mut answer = self.send(Method::PATCH, path, body, content_type).await?;
        read_body(&mut answer.body, limit, "answer").await
    }

    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<Streaming, WatchError> {
        let token = self.read_token().await?;
        let (mut sender, driver) = self.connect().await?;
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::USER_AGENT, "sluice-watch-client");
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| WatchError::Http(format!("request: {error}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| WatchError::Http(format!("request failed: {error}")))?;
        if response.status().is_success() {
            return Ok(Streaming {
                body: response.into_body(),
                _driver: driver,
            });
        }
        Err(error_answer(response).await)
    }

    async fn read_token(&self) -> Result<Option<String>, WatchError> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|source| WatchError::Token {
                path: path.clone(),
                source,
            })?;
        let token = text.trim();
        // A header value cannot hold control characters; say so instead of failing in http.
        if token.is_empty() || token.bytes().any(|byte| byte.is_ascii_control()) {
            return Err(WatchError::Token {
                path: path.clone(),
                source: std::io::Error::other("empty, or not a single-line token"),
            });
        }
        Ok(Some(token.to_string()))
    }

    async fn connect(
        &self,
    ) -> Result<
        (
            hyper::client::conn::http1::SendRequest<Full<Bytes>>,
            AbortOnDrop,
        ),
        WatchError,
    > {
        let connect = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|error| WatchError::Connect {
                    address: self.authority.clone(),
                    reason: error.to_string(),
                })?;
            let _ = tcp.set_nodelay(true);
            self.tls
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|source| WatchError::Tls {
                    address: self.authority.clone(),
                    source,
                })
        };
        let tls = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| WatchError::Timeout {
                what: "connect",
                after: self.connect_timeout,
            })??;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|error| WatchError::Http(format!("handshake: {error}")))?;
        Ok((sender, spawn_contained("connection", connection)))
    }
}

/// Reads `body` whole, refusing more than `limit` bytes.
pub async fn read_body(
    body: &mut Incoming,
    limit: usize,
    what: &'static str,
) -> Result<Bytes, WatchError> {
    let mut buffer = BytesMut::new();
    while let Some(chunk) = next_chunk(body).await? {
        if buffer.len().saturating_add(chunk.len()) > limit {
            return Err(WatchError::TooLarge { what, limit });
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

/// The next data chunk of `body` (trailers skipped); `None` at its end.
pub async fn next_chunk(body: &mut Incoming) -> Result<Option<Bytes>, WatchError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| WatchError::Http(format!("body: {error}")))?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return Ok(Some(data));
            }
        }
    }
    Ok(None)
}

async fn error_answer(response: Response<Incoming>) -> WatchError {
    let status = response.status();
    let mut body = response.into_body();
    let text = tokio::time::timeout(
        Duration::from_secs(5),
        read_body(&mut body, MAX_ERROR_BODY, "error body"),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default();
    if status == StatusCode::GONE {
        return WatchError::Expired(String::from_utf8_lossy(&text).chars().take(512).collect());
    }
    match sluice_kube_status::Status::decode(&text) {
        Ok(decoded) => match error_of(&decoded) {
            WatchError::Status { message, .. } => WatchError::Status {
                status: status.as_u16(),
                message,
            },
            other => other,
        },
        Err(_) => WatchError::Status {
            status: status.as_u16(),
            message: String::from_utf8_lossy(&text).chars().take(512).collect(),
        },
    }
}

/// Aborts a spawned task when dropped, so a connection never outlives its request.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Spawns `future` with its panics caught and logged: a panic in hyper's connection driver
/// ends that connection (the request sees an error and is retried), not the thread.
fn spawn_contained<F, E>(what: &'static str, future: F) -> AbortOnDrop
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    AbortOnDrop(tokio::spawn(async move {
        match std::panic::AssertUnwindSafe(future).catch_unwind().await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "watch client {what} ended"),
            Err(_) => tracing::error!("watch client {what} task panicked"),
        }
    }))
}

fn parse_url(url: &str) -> Result<(String, u16), WatchError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|error| WatchError::Config(format!("url {url:?}: {error}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(WatchError::Config(format!(
            "url {url:?}: only https is supported (the bearer token must not travel in clear)"
        )));
    }
    if uri
        .path_and_query()
        .is_some_and(|path| path.as_str() != "/")
    {
        return Err(WatchError::Config(format!(
            "url {url:?}: a base URL has no path or query"
        )));
    }
    let host = uri
        .host()
        .filter(|host| !host.is_empty())
        .ok_or_else(|| WatchError::Config(format!("url {url:?}: no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), uri.port_u16().unwrap_or(443)))
}

fn tls_config(config: &WatchClientConfig) -> Result<rustls::ClientConfig, WatchError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let file_error = |path: &PathBuf, error: &dyn std::fmt::Display| {
        WatchError::Config(format!("{}: {error}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(&config.ca_file)
        .map_err(|error| file_error(&config.ca_file, &error))?
    {
        let certificate = certificate.map_err(|error| file_error(&config.ca_file, &error))?;
        roots
            .add(certificate)
            .map_err(|error| file_error(&config.ca_file, &error))?;
    }
    if roots.is_empty() {
        return Err(file_error(
            &config.ca_file,
            &"no CA certificate in the file",
        ));
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| WatchError::Config(format!("TLS: {error}")))?
        .with_root_certificates(roots);
    let mut tls = match &config.client_cert {
        None => builder.with_no_client_auth(),
        Some(files) => {
            let chain = CertificateDer::pem_file_iter(&files.cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|error| file_error(&files.cert, &error))?;
            let key = PrivateKeyDer::from_pem_file(&files.key)
                .map_err(|error| file_error(&files.key, &error))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| WatchError::Config(format!("client certificate: {error}")))?
        }
    };
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_https_bases() {
        assert_eq!(
            parse_url("https://127.0.0.1:6443").expect("ip"),
            ("127.0.0.1".into(), 6443)
        );
        assert_eq!(
            parse_url("https://api.example/").expect("name"),
            ("api.example".into(), 443)
        );
        assert_eq!(
            parse_url("https://[::1]:8443").expect("v6"),
            ("::1".into(), 8443)
        );
        for bad in [
            "http://a:1",
            "https://a:1/apis",
            "https://a?x=1",
            "a:1",
            "://",
        ] {
            assert!(
                matches!(parse_url(bad), Err(WatchError::Config(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn missing_ca_is_a_config_error() {
        let config = WatchClientConfig::new("https://127.0.0.1:1", "/nonexistent/ca.pem");
        assert!(matches!(
            Transport::new(&config),
            Err(WatchError::Config(_))
        ));
    }
}
