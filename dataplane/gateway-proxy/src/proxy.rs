//! The request pipeline, one phase after another; any phase may end the request with a
//! [`GatewayError`], answered as a Kubernetes `Status`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use monoio::net::TcpStream;
use sluice_gateway::flow_control::{CoreFlowControl, CoreShare, FlowPermit};
use sluice_gateway::identity::{
    impersonation_checks, requested_impersonation, strip_client_identity, user_from_certificate,
    write_impersonation_headers, UserInfo,
};
use sluice_gateway::request_info::RequestInfo;
use sluice_gateway::status::GatewayError;
use sluice_metrics::PerCoreCounter;
use sluice_runtime::{ConnectionContext, ConnectionHandler, HandlerFactory, WorkerContext};

use crate::auth::{CoreAuth, MAX_TOKEN_BYTES};
use crate::body::{Held, InFlight, ProxyBody};
use crate::pool::CorePool;
use crate::state::{Gateway, Generation};
use crate::tls::{accept, AcceptError};
use crate::upgrade::{is_upgrade, parse_request, read_head, Rewind};

/// Longest time a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Request-counter label sets a core caches; more are looked up each time.
const COUNTER_CACHE_LIMIT: usize = 2_000;

/// The gateway listener: builds one [`GatewayHandler`] per worker core.
#[derive(Debug, Clone)]
pub struct GatewayEndpoint {
    pub gateway: Arc<Gateway>,
    pub workers: usize,
}

impl HandlerFactory for GatewayEndpoint {
    fn create(&self, worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        let share = CoreShare {
            core_index: worker.index as u32,
            core_count: self.workers.max(1) as u32,
        };
        Rc::new(GatewayHandler {
            gateway: self.gateway.clone(),
            worker: worker.index,
            share,
            pool: CorePool::new(
                share,
                self.gateway.metrics.upstream_connections.clone(),
                worker.index,
            ),
            auth: CoreAuth::default(),
            flow: RefCell::new(None),
            round_robin: RefCell::default(),
            counters: RefCell::default(),
        })
    }
}

/// Flow-control state per cluster, for the generation (number) it was built for.
type FlowStates = Option<(u64, HashMap<Box<str>, Rc<CoreFlowControl>>)>;
/// (cluster, policy) -> round-robin cursor.
type Cursors = HashMap<(Box<str>, Box<str>), usize>;
/// (cluster, verb, resource, code) -> this core's cached request counter.
type CounterCache = HashMap<(Box<str>, &'static str, Box<str>, u16), PerCoreCounter>;

/// One core's gateway state: never shared with other cores.
struct GatewayHandler {
    gateway: Arc<Gateway>,
    worker: usize,
    share: CoreShare,
    pool: CorePool,
    auth: CoreAuth,
    /// Flow-control state of each cluster for the generation it was built for.
    flow: RefCell<FlowStates>,
    /// Round-robin cursor per (cluster, policy).
    round_robin: RefCell<Cursors>,
    counters: RefCell<CounterCache>,
}

/// A request that passed every check, with where it goes.
struct Admitted {
    cluster: usize,
    /// Index into the cluster's servers.
    server: usize,
    /// Who the apiserver will see (impersonated).
    user: UserInfo,
    permit: FlowPermit,
}

/// What is known about a client connection after its handshake.
struct ClientConnection {
    cluster: Box<str>,
    /// From a client certificate the cluster's client CA verified.
    certificate_user: Option<UserInfo>,
}

#[derive(Clone, Copy)]
struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, future: F) {
        monoio::spawn(future);
    }
}

impl ConnectionHandler for GatewayHandler {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let local_ip = stream
                .local_addr()
                .map(|address| address.ip())
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
            let _ = stream.set_nodelay(true);
            let io = sluice_grpc::transport::compat(stream);
            let accepted = monoio::select! {
                accepted = accept(&self.gateway, io, local_ip) => accepted,
                _ = monoio::time::sleep(HANDSHAKE_TIMEOUT) => return,
                _ = conn.draining() => return,
            };
            let accepted = match accepted {
                Ok(accepted) => accepted,
                Err(AcceptError::UnknownHost(host)) => {
                    self.gateway.metrics.reject("unknown_host", self.worker);
                    tracing::info!(peer = %conn.peer, %host, "TLS connection for a host no cluster serves refused");
                    return;
                }
                Err(AcceptError::Handshake(error)) => {
                    self.gateway.metrics.reject("tls_handshake", self.worker);
                    tracing::debug!(peer = %conn.peer, %error, "TLS handshake failed");
                    return;
                }
            };
            let (_, session) = accepted.stream.get_ref();
            let certificate_user = session
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|der| user_from_certificate(der).ok());
            let http2 = session.alpn_protocol() == Some(sluice_grpc::tls::ALPN_H2);
            let client = Rc::new(ClientConnection {
                cluster: accepted.generation.snapshot.clusters()[accepted.cluster]
                    .name
                    .clone(),
                certificate_user,
            });
            let handler = self.clone();
            let upgrade_client = client.clone();
            let service = hyper::service::service_fn(move |request| {
                let handler = handler.clone();
                let client = client.clone();
                async move { Ok::<_, Infallible>(handler.serve(&client, request).await) }
            });
            if http2 {
                let io = TokioIo::new(accepted.stream);
                let connection = hyper::server::conn::http2::Builder::new(LocalExec)
                    .max_concurrent_streams(1000)
                    .serve_connection(io, service);
                let mut connection = std::pin::pin!(connection);
                monoio::select! {
                    _ = connection.as_mut() => return,
                    _ = conn.draining() => connection.as_mut().graceful_shutdown(),
                }
                let _ = connection.await;
            } else {
                // Upgrades (exec, attach, port-forward) need the raw connection: read the first
                // request head ourselves, and hand anything else to hyper with the head replayed.
                let mut stream = accepted.stream;
                let mut buffer = bytes::BytesMut::with_capacity(8 * 1024);
                let head_length = monoio::select! {
                    read = read_head(&mut stream, &mut buffer) => match read {
                        Ok(length) => length,
                        Err(_) => return,
                    },
                    _ = monoio::time::sleep(HANDSHAKE_TIMEOUT) => return,
                    _ = conn.draining() => return,
                };
                if let Ok(head) = parse_request(&buffer[..head_length]) {
                    if is_upgrade(&head.headers) {
                        let early = buffer.split_off(head_length).freeze();
                        self.upgrade(&upgrade_client, stream, head, early).await;
                        return;
                    }
                }
                let io = TokioIo::new(Rewind::new(buffer.freeze(), stream));
                let connection =
                    hyper::server::conn::http1::Builder::new().serve_connection(io, service);
                let mut connection = std::pin::pin!(connection);
                monoio::select! {
                    _ = connection.as_mut() => return,
                    _ = conn.draining() => connection.as_mut().graceful_shutdown(),
                }
                let _ = connection.await;
            }
        })
    }
}

fn error_response(error: &GatewayError) -> Response<ProxyBody> {
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

fn reject_reason(error: &GatewayError) -> &'static str {
    match error {
        GatewayError::UnknownHost { .. } => "unknown_host",
        GatewayError::BadRequest { .. } => "bad_request",
        GatewayError::Unauthorized => "unauthorized",
        GatewayError::ImpersonationForbidden { .. } => "impersonation_forbidden",
        GatewayError::NoDispatchPolicy { .. } => "no_dispatch_policy",
        GatewayError::TooManyRequests { .. } => "too_many_requests",
        GatewayError::NoHealthyUpstream { .. } => "no_healthy_upstream",
        GatewayError::AuthenticationUnavailable { .. } => "authentication_unavailable",
        GatewayError::UpstreamFailed { .. } => "upstream_failed",
        GatewayError::Internal { .. } => "internal",
    }
}

/// Hop-by-hop headers (RFC 9110 7.6.1) and `host` (HTTP/2 carries it as :authority).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_by_hop(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

impl GatewayHandler {
    async fn serve(
        &self,
        client: &ClientConnection,
        request: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let generation = self.gateway.current();
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let info = RequestInfo::parse(method.as_str(), &path, &query);
        let (verb, resource) = match &info {
            Ok(info) => (info.verb.as_str(), info.resource.to_string()),
            Err(_) => ("unknown", String::new()),
        };
        let response = match info {
            Ok(info) => match self.forward(client, &generation, &info, request).await {
                Ok(response) => response,
                Err(error) => self.refuse(&error, client, method.as_str(), &path),
            },
            Err(error) => self.refuse(
                &GatewayError::BadRequest {
                    reason: error.to_string(),
                },
                client,
                method.as_str(),
                &path,
            ),
        };
        self.count(&client.cluster, verb, &resource, response.status().as_u16());
        self.gateway
            .metrics
            .duration
            .observe(self.worker, started.elapsed().as_secs_f64());
        response
    }

    fn refuse(
        &self,
        error: &GatewayError,
        client: &ClientConnection,
        method: &str,
        path: &str,
    ) -> Response<ProxyBody> {
        let reason = reject_reason(error);
        self.gateway.metrics.reject(reason, self.worker);
        tracing::info!(cluster = %client.cluster, method, path, status = error.http_status().as_u16(), %error, "request refused");
        error_response(error)
    }

    fn count(&self, cluster: &str, verb: &'static str, resource: &str, code: u16) {
        let mut counters = self.counters.borrow_mut();
        let key = (Box::from(cluster), verb, Box::from(resource), code);
        if let Some(counter) = counters.get(&key) {
            counter.inc(self.worker);
            return;
        }
        let counter = self.gateway.metrics.requests(cluster, verb, resource, code);
        counter.inc(self.worker);
        if counters.len() < COUNTER_CACHE_LIMIT {
            counters.insert(key, counter);
        }
    }

    /// This core's flow-control state for `cluster` in `generation` (rebuilt once per reload,
    /// carrying in-flight counts of unchanged schemas over).
    fn flow_control(&self, generation: &Generation, cluster: usize) -> Rc<CoreFlowControl> {
        let compiled = &generation.snapshot.clusters()[cluster];
        let mut flow = self.flow.borrow_mut();
        let stale = flow
            .as_ref()
            .is_none_or(|(number, _)| *number != generation.number);
        if stale {
            let previous = flow.take().map(|(_, states)| states).unwrap_or_default();
            let states = generation
                .snapshot
                .clusters()
                .iter()
                .map(|cluster| {
                    let state = CoreFlowControl::new(
                        &cluster.schemas,
                        self.share,
                        previous.get(&cluster.name).map(|state| state.as_ref()),
                    );
                    (cluster.name.clone(), Rc::new(state))
                })
                .collect();
            *flow = Some((generation.number, states));
        }
        flow.as_ref()
            .and_then(|(_, states)| states.get(&compiled.name).cloned())
            .unwrap_or_else(|| Rc::new(CoreFlowControl::new(&compiled.schemas, self.share, None)))
    }

    async fn authenticate(
        &self,
        client: &ClientConnection,
        generation: &Generation,
        cluster: usize,
        headers: &HeaderMap,
    ) -> Result<UserInfo, GatewayError> {
        if let Some(user) = &client.certificate_user {
            return Ok(user.clone());
        }
        let compiled = &generation.snapshot.clusters()[cluster];
        if let Some(token) = bearer_token(headers) {
            if token.len() > MAX_TOKEN_BYTES {
                return Err(GatewayError::Unauthorized);
            }
            let metrics = &self.gateway.metrics;
            return match self
                .auth
                .user_for_token(
                    &self.pool,
                    generation,
                    cluster,
                    token,
                    (metrics, self.worker),
                )
                .await
            {
                Ok(Some(user)) => Ok(user),
                Ok(None) => Err(GatewayError::Unauthorized),
                Err(reason) => Err(GatewayError::AuthenticationUnavailable {
                    cluster: compiled.name.to_string(),
                    reason,
                }),
            };
        }
        if compiled.authentication.allow_anonymous {
            Ok(UserInfo::anonymous())
        } else {
            Err(GatewayError::Unauthorized)
        }
    }

    /// Every phase before forwarding: host -> cluster, authentication, client impersonation,
    /// dispatch, flow control, upstream pick.
    async fn admit(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        info: &RequestInfo<'_>,
        headers: &HeaderMap,
    ) -> Result<Admitted, GatewayError> {
        // Host -> cluster: the one the TLS server name chose (if a reload removed it, the
        // connection's host is no longer served).
        let Some(cluster) = generation
            .snapshot
            .clusters()
            .iter()
            .position(|cluster| cluster.name == client.cluster)
        else {
            return Err(GatewayError::UnknownHost {
                host: client.cluster.to_string(),
            });
        };
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];

        // Authentication, then a client's own impersonation request (SubjectAccessReview).
        let authenticated = self
            .authenticate(client, generation, cluster, headers)
            .await?;
        let user = match requested_impersonation(headers) {
            Err(error) => {
                return Err(GatewayError::BadRequest {
                    reason: error.to_string(),
                })
            }
            Ok(None) => authenticated,
            Ok(Some(requested)) => {
                for check in impersonation_checks(&requested) {
                    let allowed = self
                        .auth
                        .may_impersonate(&self.pool, generation, cluster, &authenticated, &check)
                        .await
                        .map_err(|reason| GatewayError::AuthenticationUnavailable {
                            cluster: compiled.name.to_string(),
                            reason,
                        })?;
                    if !allowed {
                        return Err(GatewayError::ImpersonationForbidden {
                            user: authenticated.name.clone(),
                            kind: check.kind(),
                            value: check.name.clone(),
                        });
                    }
                }
                requested
            }
        };

        // Dispatch, flow control, upstream pick.
        let policy = compiled.dispatch.dispatch(info, &user).ok_or_else(|| {
            GatewayError::NoDispatchPolicy {
                cluster: compiled.name.to_string(),
                verb: info.verb.as_str(),
                path: info.path.to_string(),
            }
        })?;
        let permit: FlowPermit = self.flow_control(generation, cluster).admit(
            policy.flow_control_schema,
            info.is_long_running(),
            Instant::now(),
        )?;
        let candidates: Vec<usize> = policy
            .servers
            .iter()
            .copied()
            .filter(|&index| {
                compiled
                    .servers
                    .get(index)
                    .is_some_and(|server| !server.disabled)
                    && runtime
                        .health
                        .get(index)
                        .is_some_and(|health| health.is_healthy())
            })
            .collect();
        if candidates.is_empty() {
            return Err(GatewayError::NoHealthyUpstream {
                cluster: compiled.name.to_string(),
            });
        }
        let turn = {
            let mut cursors = self.round_robin.borrow_mut();
            let cursor = cursors
                .entry((compiled.name.clone(), policy.name.clone()))
                .or_insert(0);
            *cursor = cursor.wrapping_add(1);
            *cursor
        };
        Ok(Admitted {
            cluster,
            server: candidates[turn % candidates.len()],
            user,
            permit,
        })
    }

    async fn forward(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        info: &RequestInfo<'_>,
        request: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, GatewayError> {
        let Admitted {
            cluster,
            server,
            user,
            permit,
        } = self
            .admit(client, generation, info, request.headers())
            .await?;
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];
        let server = &compiled.servers[server];
        let upstream_failed = |reason: String| GatewayError::UpstreamFailed {
            server: server.endpoint.to_string(),
            reason,
        };

        // Forward on a shared HTTP/2 connection, as the gateway plus Impersonate-* headers.
        let (send, slot) = self
            .pool
            .stream(
                &compiled.name,
                server,
                &runtime.client_tls,
                &compiled.connection_pool,
            )
            .await
            .map_err(upstream_failed)?;
        let (parts, body) = request.into_parts();
        let scheme = if server.tls { "https" } else { "http" };
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |path_and_query| path_and_query.as_str());
        let mut upstream = Request::builder()
            .method(parts.method.clone())
            .uri(format!(
                "{scheme}://{}:{}{path_and_query}",
                server.host, server.port
            ))
            .body(())
            .map_err(|error| GatewayError::BadRequest {
                reason: error.to_string(),
            })?;
        let headers = upstream.headers_mut();
        copy_end_to_end(&parts.headers, headers);
        strip_client_identity(headers);
        write_impersonation_headers(&user, headers).map_err(|error| GatewayError::BadRequest {
            reason: error.to_string(),
        })?;
        if let Some(bearer) = &runtime.bearer {
            headers.insert(header::AUTHORIZATION, bearer.clone());
        }
        let mut send = send
            .ready()
            .await
            .map_err(|error| upstream_failed(error.to_string()))?;
        let empty = http_body::Body::is_end_stream(&body);
        let (response, stream) = send
            .send_request(upstream, empty)
            .map_err(|error| upstream_failed(error.to_string()))?;
        if !empty {
            monoio::spawn(pump_request(body, stream));
        }
        let response = response
            .await
            .map_err(|error| upstream_failed(error.to_string()))?;
        let (head, recv) = response.into_parts();
        let mut answer = Response::new(ProxyBody::Upstream {
            recv,
            data_done: false,
            finished: false,
            _held: Held {
                _slot: slot,
                _permit: permit,
                _in_flight: InFlight::new(&self.gateway.metrics, self.worker),
            },
        });
        *answer.status_mut() = head.status;
        copy_end_to_end(&head.headers, answer.headers_mut());
        tracing::debug!(cluster = %compiled.name, user = %user.name, verb = info.verb.as_str(), path = info.path, server = %server.endpoint, status = head.status.as_u16(), "forwarded");
        Ok(answer)
    }
}

impl GatewayHandler {
    /// An HTTP/1.1 upgrade: the same checks as any request, then a dedicated HTTP/1.1 TLS
    /// connection to the apiserver (see `upgrade.rs`).
    async fn upgrade(
        &self,
        client: &ClientConnection,
        mut stream: tokio_rustls::server::TlsStream<monoio_compat::TcpStreamCompat>,
        mut head: crate::upgrade::RequestHead,
        early: Bytes,
    ) {
        use tokio::io::AsyncWriteExt;
        let started = Instant::now();
        let generation = self.gateway.current();
        let path = head.uri.path().to_string();
        let query = head.uri.query().unwrap_or("").to_string();
        let info = RequestInfo::parse(head.method.as_str(), &path, &query);
        let (verb, resource) = match &info {
            Ok(info) => (info.verb.as_str(), info.resource.to_string()),
            Err(_) => ("unknown", String::new()),
        };
        let _in_flight = InFlight::new(&self.gateway.metrics, self.worker);
        let outcome: Result<u16, GatewayError> = async {
            let info = info.map_err(|error| GatewayError::BadRequest {
                reason: error.to_string(),
            })?;
            let admitted = self.admit(client, &generation, &info, &head.headers).await?;
            let compiled = &generation.snapshot.clusters()[admitted.cluster];
            let runtime = &generation.clusters[admitted.cluster];
            let server = &compiled.servers[admitted.server];
            let upstream_failed = |reason: String| GatewayError::UpstreamFailed {
                server: server.endpoint.to_string(),
                reason,
            };
            let protocol = head.headers.get(header::UPGRADE).cloned();
            let mut headers = HeaderMap::new();
            copy_end_to_end(&head.headers, &mut headers);
            strip_client_identity(&mut headers);
            write_impersonation_headers(&admitted.user, &mut headers).map_err(|error| {
                GatewayError::BadRequest {
                    reason: error.to_string(),
                }
            })?;
            if let Some(bearer) = &runtime.bearer {
                headers.insert(header::AUTHORIZATION, bearer.clone());
            }
            headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            if let Some(protocol) = protocol {
                headers.insert(header::UPGRADE, protocol);
            }
            head.headers = headers;
            let request = crate::upgrade::upstream_head(&head, &server.host, server.port);
            let tcp = TcpStream::connect((server.host.as_ref(), server.port))
                .await
                .map_err(|error| upstream_failed(error.to_string()))?;
            let _ = tcp.set_nodelay(true);
            let name = rustls_pki_types::ServerName::try_from(server.host.to_string())
                .map_err(|error| upstream_failed(error.to_string()))?;
            let mut upstream = tokio_rustls::TlsConnector::from(
                crate::upgrade::http1_client_config(&runtime.client_tls),
            )
            .connect(name, sluice_grpc::transport::compat(tcp))
            .await
            .map_err(|error| upstream_failed(error.to_string()))?;
            // The flow-control permit lives as long as the upgraded stream.
            let _permit = admitted.permit;
            tracing::debug!(cluster = %compiled.name, user = %admitted.user.name, path = %path, server = %server.endpoint, "upgrade");
            crate::upgrade::relay(&mut stream, &mut upstream, request, early)
                .await
                .map_err(|error| upstream_failed(error.to_string()))
        }
        .await;
        let code = match outcome {
            Ok(status) => status,
            Err(error) => {
                let reason = reject_reason(&error);
                self.gateway.metrics.reject(reason, self.worker);
                tracing::info!(cluster = %client.cluster, path = %path, status = error.http_status().as_u16(), %error, "upgrade refused");
                let _ = stream
                    .write_all(&crate::upgrade::error_response(&error))
                    .await;
                let _ = stream.shutdown().await;
                error.http_status().as_u16()
            }
        };
        self.count(&client.cluster, verb, &resource, code);
        self.gateway
            .metrics
            .duration
            .observe(self.worker, started.elapsed().as_secs_f64());
    }
}

/// Client request body -> upstream stream, frame by frame with HTTP/2 flow control.
async fn pump_request(mut body: Incoming, mut stream: h2::SendStream<Bytes>) {
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(_) => {
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if sluice_grpc::transport::send_data(&mut stream, data, false)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                }
                return;
            }
        }
    }
    let _ = sluice_grpc::transport::send_data(&mut stream, Bytes::new(), true).await;
}
