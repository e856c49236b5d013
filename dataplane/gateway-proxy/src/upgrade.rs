//! HTTP/1.1 upgrades (exec, attach, port-forward over SPDY or WebSocket). They cannot ride the
//! shared HTTP/2 connections, so each gets its own HTTP/1.1 TLS connection to the apiserver,
//! after the same checks as any request; then bytes are copied both ways until one side ends.
//!
//! Hand-written rather than hyper's upgrade support: hyper hands back upgraded connections
//! only for `Send` I/O, and monoio's sockets are not `Send`. The first request head of every
//! HTTP/1.1 connection is read and parsed by `head.rs`; anything but an upgrade is replayed into
//! hyper.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use sluice_gateway::identity::UserInfo;
use sluice_gateway::request_info::RequestInfo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::access::AccessNote;
use crate::admit::Admitted;
use crate::body::InFlight;
use crate::error::{ProxyError, UpgradeHeadError, UpstreamFailure};
use crate::forward_metrics::ServerKind;
use crate::handler::{
    decoded_path, request_info, request_labels, ClientConnection, GatewayHandler,
};
use crate::head::{parse_response_status, read_head, upstream_head, RequestHead};
use crate::headers::{refuse_upgrade_body, upstream_headers};
use crate::state::Generation;

/// The client's side of an upgrade connection.
type ClientStream = tokio_rustls::server::TlsStream<sluice_grpc::transport::CompatStream>;

/// How long a non-101 answer to an upgrade may keep streaming before the connection closes.
const REFUSAL_DRAIN: Duration = Duration::from_secs(2);

/// Relays an admitted upgrade: the request head upstream, the answer back. Only after a 101 do
/// the client's bytes flow (first those it sent behind its head, `early`), both directions until
/// either ends. Any other answer is passed on and the connection closed: the client's bytes
/// never reach the apiserver on a connection it would read as HTTP/1.1 requests (a second
/// request smuggled behind the first would run with the gateway's identity, unchecked).
pub async fn relay<C, U>(
    client: &mut C,
    upstream: &mut U,
    head: Vec<u8>,
    early: Bytes,
) -> Result<u16, UpgradeHeadError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    upstream.write_all(&head).await?;
    upstream.flush().await?;
    let mut answer = BytesMut::with_capacity(4096);
    let head_length = read_head(upstream, &mut answer).await?;
    let status = parse_response_status(&answer[..head_length])?;
    client.write_all(&answer).await?;
    client.flush().await?;
    if status == 101 {
        let early_sent = early.is_empty()
            || (upstream.write_all(&early).await.is_ok() && upstream.flush().await.is_ok());
        if early_sent {
            let _ = tokio::io::copy_bidirectional(client, upstream).await;
        }
    } else {
        let _ = monoio::time::timeout(REFUSAL_DRAIN, tokio::io::copy(upstream, client)).await;
    }
    let _ = client.shutdown().await;
    Ok(status)
}

impl GatewayHandler {
    /// An HTTP/1.1 upgrade: the same checks as any request, then a dedicated HTTP/1.1 TLS
    /// connection to the apiserver and bytes relayed both ways; a refusal is written to the raw
    /// connection, which then closes.
    pub async fn upgrade(
        &self,
        client: &ClientConnection,
        mut stream: ClientStream,
        head: RequestHead,
        early: Bytes,
    ) {
        let started = std::time::Instant::now();
        let generation = self.gateway.current();
        let method = head.method.clone();
        let path = head.uri.path().to_string();
        let query = head.uri.query().unwrap_or("").to_string();
        let decoded = decoded_path(&path);
        let info = request_info(method.as_str(), &decoded, &query);
        let labels = request_labels(&info);
        let _in_flight = InFlight::new(&self.gateway.metrics, self.worker);
        // A reference count, not a copy: the head itself goes upstream.
        let request_id = crate::access::request_id(&head.headers).cloned();
        let note = AccessNote::default();
        let outcome = match (info, refuse_upgrade_body(&head.headers)) {
            (Ok(info), Ok(())) => {
                let admitted = (&mut stream, head, early);
                self.upgrade_admitted(client, &generation, (&info, &note), admitted)
                    .await
            }
            (Err(error), _) => Err(error.into()),
            (_, Err(error)) => Err(error.into()),
        };
        let resource = crate::handler::resource_label(labels.1, outcome.as_ref().err());
        let code = match outcome {
            Ok(status) => status,
            Err(error) => {
                self.refuse(&error, client, method.as_str(), &path);
                let _ = stream.write_all(&crate::answer::http1_bytes(&error)).await;
                let _ = stream.shutdown().await;
                error.http_status().as_u16()
            }
        };
        if sluice_access_log::wanted(sluice_access_log::Role::Gateway, code >= 400) {
            let target = match query.as_str() {
                "" => path.clone(),
                query => format!("{path}?{query}"),
            };
            let exchange = crate::access::Exchange {
                method: &method,
                target: &target,
                request_id: request_id.as_ref(),
                request_bytes: None,
                status: code,
                response_bytes: None,
            };
            crate::access::log(
                (client.peer, &client.cluster),
                &generation,
                &exchange,
                (&note, started),
            );
        }
        self.finish(&client.cluster, (labels.0, resource), code, started);
    }

    /// Admission, the upstream connection and the relay; the upstream's status once relayed.
    async fn upgrade_admitted(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        (info, note): (&RequestInfo<'_>, &AccessNote),
        (stream, head, early): (&mut ClientStream, RequestHead, Bytes),
    ) -> Result<u16, ProxyError> {
        let Admitted {
            cluster,
            server,
            user,
            // The flow-control permit lives as long as the upgraded stream.
            permit: _permit,
        } = self
            .admit(client, generation, info, (&head.headers, note))
            .await?;
        let compiled = &generation.snapshot.clusters()[cluster];
        let (kind, relayed) = match compiled.servers[server].agent {
            Some(agent) => (
                ServerKind::Agent,
                Box::pin(self.upgrade_via_agent(stream, (head, early), &user, agent)).await,
            ),
            None => (
                ServerKind::Apiserver,
                self.upgrade_direct(
                    generation,
                    (cluster, server),
                    info,
                    &user,
                    (stream, head, early),
                )
                .await,
            ),
        };
        self.record_forward((&compiled.name, kind), relayed.as_ref().map(|_| ()), None);
        relayed
    }

    /// An admitted upgrade to an apiserver this gateway dials: its own HTTP/1.1 TLS
    /// connection, the head, then bytes relayed both ways.
    async fn upgrade_direct(
        &self,
        generation: &Arc<Generation>,
        (cluster, server): (usize, usize),
        info: &RequestInfo<'_>,
        user: &UserInfo,
        (stream, mut head, early): (&mut ClientStream, RequestHead, Bytes),
    ) -> Result<u16, ProxyError> {
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];
        let server = &compiled.servers[server];
        let upstream_failed = |cause: UpstreamFailure| ProxyError::Upstream {
            server: server.endpoint.clone(),
            cause,
        };
        let protocol = head.headers.get(http::header::UPGRADE).cloned();
        let mut headers = upstream_headers(&head.headers, user, runtime.bearer.as_ref())?;
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("Upgrade"),
        );
        if let Some(protocol) = protocol {
            headers.insert(http::header::UPGRADE, protocol);
        }
        head.headers = headers;
        let request = upstream_head(&head, &server.host, server.port);
        let tcp = monoio::net::TcpStream::connect((server.host.as_ref(), server.port))
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeConnect(error)))?;
        let _ = tcp.set_nodelay(true);
        let tcp = sluice_grpc::transport::compat(tcp)
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeConnect(error)))?;
        let name = rustls_pki_types::ServerName::try_from(server.host.to_string())
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeServerName(error)))?;
        let mut upstream =
            tokio_rustls::TlsConnector::from(http1_client_config(&runtime.client_tls))
                .connect(name, tcp)
                .await
                .map_err(|error| upstream_failed(UpstreamFailure::UpgradeTls(error)))?;
        tracing::debug!(cluster = %compiled.name, user = %user.name, path = info.path, server = %server.endpoint, "upgrade");
        let had_early = !early.is_empty();
        let status = relay(stream, &mut upstream, request, early)
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::UpgradeRelay(error)))?;
        if had_early && status != 101 {
            // Bytes behind an upgrade the apiserver refused: dropped, never sent (a request
            // smuggled behind the first would otherwise run unchecked).
            self.gateway.metrics.upgrade_early_dropped.inc(self.worker);
        }
        Ok(status)
    }
}

/// The gateway's client config for HTTP/1.1 upgrades (same identity, ALPN http/1.1).
pub fn http1_client_config(http2: &Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    let mut config = (**http2).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Runs `future` on a monoio runtime with timers and no sockets.
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn a_refused_upgrade_is_passed_on_and_the_connection_closed() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let status = block_on(async {
            server
                .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno")
                .await
                .unwrap();
            server.shutdown().await.unwrap();
            relay(
                &mut client_peer,
                &mut upstream,
                b"POST /exec HTTP/1.1\r\n\r\n".to_vec(),
                Bytes::from_static(b"early"),
            )
            .await
            .unwrap()
        });
        assert_eq!(status, 403);
        drop(client_peer);
        drop(upstream);
        let (to_client, to_server) = block_on(async {
            let mut to_client = Vec::new();
            client.read_to_end(&mut to_client).await.unwrap();
            let mut to_server = Vec::new();
            server.read_to_end(&mut to_server).await.unwrap();
            (to_client, to_server)
        });
        assert_eq!(
            to_client,
            b"HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno"
        );
        assert_eq!(
            to_server, b"POST /exec HTTP/1.1\r\n\r\n",
            "the client's early bytes (a smuggled request) never reach the apiserver"
        );
    }

    #[test]
    fn early_bytes_go_upstream_only_after_the_101() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let (status, seen_before_answer) = block_on(async {
            let server_side = async {
                // Everything the gateway wrote before the apiserver answers.
                let mut head = BytesMut::new();
                let length = read_head(&mut server, &mut head).await.unwrap();
                assert_eq!(length, head.len(), "nothing but the head before the answer");
                server
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
                    .await
                    .unwrap();
                let mut early = [0u8; 5];
                server.read_exact(&mut early).await.unwrap();
                assert_eq!(&early, b"early");
                server.shutdown().await.unwrap();
                head
            };
            let relay_side = async {
                let status = relay(
                    &mut client_peer,
                    &mut upstream,
                    b"POST /exec HTTP/1.1\r\n\r\n".to_vec(),
                    Bytes::from_static(b"early"),
                )
                .await
                .unwrap();
                drop(client_peer);
                status
            };
            let client_side = async {
                client.shutdown().await.unwrap();
                let mut all = Vec::new();
                client.read_to_end(&mut all).await.unwrap();
                all
            };
            let (head, status, _) =
                futures_util::future::join3(server_side, relay_side, client_side).await;
            (status, head)
        });
        assert_eq!(status, 101);
        assert_eq!(&seen_before_answer[..], b"POST /exec HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_malformed_answer_is_an_error_before_anything_reaches_the_client() {
        let (mut client, mut client_peer) = tokio::io::duplex(64 * 1024);
        let (mut upstream, mut server) = tokio::io::duplex(64 * 1024);
        let outcome = block_on(async {
            server.write_all(b"garbage\r\n\r\n").await.unwrap();
            relay(
                &mut client_peer,
                &mut upstream,
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
                Bytes::new(),
            )
            .await
        });
        assert!(
            matches!(outcome, Err(UpgradeHeadError::Syntax(_))),
            "{outcome:?}"
        );
        drop(client_peer);
        let to_client = block_on(async {
            let mut to_client = Vec::new();
            client.read_to_end(&mut to_client).await.unwrap();
            to_client
        });
        assert!(to_client.is_empty());
    }
}
