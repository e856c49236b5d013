//! HTTPS requests to the API server: TCP, rustls, hyper, bearer token.
//!
//! Over h2 (when the server picks it) every request of one Transport is a stream of one
//! shared connection, so a role that watches several resources and reports holds one
//! connection (see [`crate::connection`]); over HTTP/1.1 each request dials its own. The token
//! is read again for every request either way.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;

use crate::config::WatchClientConfig;
use crate::connection::{AbortOnDrop, Connector, Sender};
use crate::decode::error_of;
use crate::error::WatchError;

/// How much of an error answer's body is read to find its `Status` message.
const MAX_ERROR_BODY: usize = 64 << 10;

/// A way to send authenticated requests to one server. Share it (`Arc<Transport>`) between
/// clients of one identity to put their requests on one h2 connection.
pub struct Transport {
    authority: String,
    token_file: Option<PathBuf>,
    connector: Connector,
}

/// A 200 answer whose body is being streamed, and the task driving its connection. Dropping
/// it ends the request: over h2 its stream is reset, the shared connection stays.
pub struct Streaming {
    pub body: Incoming,
    _driver: Arc<AbortOnDrop>,
}

impl Transport {
    /// Parses the URL and loads the CA and client certificate once (errors here are config
    /// errors: the files are not re-read). Nothing is dialled until the first request.
    pub fn new(config: &WatchClientConfig) -> Result<Self, WatchError> {
        let (host, port) = parse_url(&config.url)?;
        let server_name = ServerName::try_from(host.clone())
            .map_err(|_| WatchError::Config(format!("{host:?} is not a valid server name")))?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tls = TlsConnector::from(Arc::new(tls_config(config)?));
        Ok(Self {
            authority: authority.clone(),
            token_file: config.token_file.clone(),
            connector: Connector::new(
                host,
                port,
                authority,
                server_name,
                tls,
                config.connect_timeout,
                config.http2,
            ),
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
        let failed = |error: hyper::Error| WatchError::Http(format!("request failed: {error}"));
        let mut retried = false;
        loop {
            let connection = self.connector.connection().await?;
            let request = self.request(
                &connection.sender,
                method.clone(),
                path_and_query,
                body.clone(),
                content_type,
                token.as_deref(),
            )?;
            let response = match connection.sender {
                Sender::Http1(mut sender) => sender.send_request(request).await.map_err(failed)?,
                Sender::Http2(mut sender) => match sender.try_send_request(request).await {
                    Ok(response) => response,
                    Err(mut error) => {
                        // Never sent: the shared connection closed (an idle GOAWAY) between
                        // the check and the send. Safe to send once more, on a new connection.
                        if !retried && error.take_message().is_some() {
                            retried = true;
                            self.connector.discard(&connection.driver).await;
                            continue;
                        }
                        return Err(failed(error.into_error()));
                    }
                },
            };
            if response.status().is_success() {
                return Ok(Streaming {
                    body: response.into_body(),
                    _driver: connection.driver,
                });
            }
            return Err(error_answer(response).await);
        }
    }

    /// The request for `sender`'s protocol: h2 names the server in `:authority`, which hyper
    /// takes from an absolute URI; HTTP/1.1 in `Host`.
    fn request(
        &self,
        sender: &Sender,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        content_type: &str,
        token: Option<&str>,
    ) -> Result<Request<Full<Bytes>>, WatchError> {
        let mut request = Request::builder()
            .method(method)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::USER_AGENT, "sluice-watch-client");
        request = match sender {
            Sender::Http1(_) => request
                .uri(path_and_query)
                .header(http::header::HOST, &self.authority),
            Sender::Http2(_) => request.uri(format!("https://{}{path_and_query}", self.authority)),
        };
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request
            .body(Full::new(body))
            .map_err(|error| WatchError::Http(format!("request: {error}")))
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
    tls.alpn_protocols = if config.http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
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
