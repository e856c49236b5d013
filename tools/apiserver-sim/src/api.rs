//! Connection handling and the simulated Kubernetes API.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};

use super::body::{ResponseBody, StreamGuard};
use super::{lock, Caller, RecordedRequest, Shared};

mod answers;
mod reviews;
mod table;
mod websocket;

use answers::{json_bytes, not_found, object_not_found, ok_json, plain, status};
use table::table_of;

pub use reviews::{SubjectAccessRule, TokenUser};

struct Watcher {
    id: u64,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    table: bool,
    sender: tokio::sync::mpsc::UnboundedSender<Bytes>,
}

/// Objects, watchers and review rules.
#[derive(Default)]
pub(crate) struct Store {
    /// (resource, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    resource_version: u64,
    next_watcher: u64,
    watchers: Vec<Watcher>,
    pub(crate) tokens: HashMap<String, TokenUser>,
    pub(crate) access_rules: Vec<SubjectAccessRule>,
    /// Serialized LIST answers (not Tables: their age column moves) until the next change, so
    /// a load test's large LIST costs the simulator a copy rather than a JSON encode each time.
    list_cache: HashMap<ListKey, Bytes>,
}

/// (resource, namespace, `metadata.name` field selector) of a LIST.
type ListKey = (String, Option<String>, Option<String>);

/// Distinct LIST queries cached at once; past it the cache starts over.
const LIST_CACHE_LIMIT: usize = 64;

impl Store {
    pub(crate) fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&(
                resource.to_string(),
                namespace.to_string(),
                name.to_string(),
            ))
            .cloned()
    }

    /// Stores `object` with a new resourceVersion and tells the watchers.
    pub(crate) fn upsert(&mut self, resource: &str, mut object: Value, event: &str) -> Value {
        self.resource_version += 1;
        self.list_cache.clear();
        let metadata = &mut object["metadata"];
        metadata["resourceVersion"] = json!(self.resource_version.to_string());
        if metadata["uid"].is_null() {
            metadata["uid"] = json!(format!("sim-{}", self.resource_version));
        }
        if metadata["creationTimestamp"].is_null() {
            metadata["creationTimestamp"] =
                json!(humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
        }
        let key = (
            resource.to_string(),
            text(&object["metadata"]["namespace"]).to_string(),
            text(&object["metadata"]["name"]).to_string(),
        );
        self.objects.insert(key, object.clone());
        self.notify(resource, event, &object);
        object
    }

    pub(crate) fn remove(&mut self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        let mut object = self.objects.remove(&key)?;
        self.resource_version += 1;
        self.list_cache.clear();
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.notify(resource, "DELETED", &object);
        Some(object)
    }

    fn notify(&mut self, resource: &str, event: &str, object: &Value) {
        self.watchers.retain(|watcher| {
            if !watcher.wants(resource, object) {
                return !watcher.sender.is_closed();
            }
            watcher
                .sender
                .send(watch_event(event, object, watcher.table, resource))
                .is_ok()
        });
    }

    pub(crate) fn watcher_count(&self, resource: &str) -> usize {
        self.watchers
            .iter()
            .filter(|watcher| watcher.resource == resource && !watcher.sender.is_closed())
            .count()
    }

    fn list(&self, resource: &str, namespace: Option<&str>, name: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((kind, object_namespace, object_name), _)| {
                kind == resource
                    && namespace.is_none_or(|namespace| namespace == object_namespace)
                    && name.is_none_or(|name| name == object_name)
            })
            .map(|(_, object)| object.clone())
            .collect()
    }
}

impl Watcher {
    fn wants(&self, resource: &str, object: &Value) -> bool {
        self.resource == resource
            && self
                .namespace
                .as_deref()
                .is_none_or(|namespace| namespace == text(&object["metadata"]["namespace"]))
            && self
                .name
                .as_deref()
                .is_none_or(|name| name == text(&object["metadata"]["name"]))
    }
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

fn watch_event(event: &str, object: &Value, table: bool, resource: &str) -> Bytes {
    let object = if table {
        table_of(resource, std::slice::from_ref(object), "")
    } else {
        object.clone()
    };
    let mut line = json!({"type": event, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// A pod as the simulator stores it.
pub(crate) fn new_pod(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/sim:1"}]},
        "status": {"phase": "Running"},
    })
}

struct ResourceKind {
    name: &'static str,
    kind: &'static str,
    short: &'static str,
}

const RESOURCES: [ResourceKind; 2] = [
    ResourceKind {
        name: "pods",
        kind: "Pod",
        short: "po",
    },
    ResourceKind {
        name: "configmaps",
        kind: "ConfigMap",
        short: "cm",
    },
];

fn kind_of(resource: &str) -> Option<&'static ResourceKind> {
    RESOURCES.iter().find(|kind| kind.name == resource)
}

/// The TLS listener's per-connection and per-request work.
pub(crate) struct Server {
    pub(crate) shared: Arc<Shared>,
    pub(crate) caller_tokens: Arc<HashMap<String, String>>,
    pub(crate) max_concurrent_streams: Option<u32>,
    pub(crate) record_requests: bool,
}

struct ConnectionGuard(Arc<Shared>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    pub(crate) async fn serve(
        self,
        listener: tokio::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
        mut stopped: tokio::sync::oneshot::Receiver<()>,
    ) {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let server = Arc::new(self);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => {
                    let Ok((tcp, _)) = accepted else { continue };
                    server.shared.accepted_connections.fetch_add(1, Ordering::SeqCst);
                    server.shared.open_connections.fetch_add(1, Ordering::SeqCst);
                    let guard = ConnectionGuard(server.shared.clone());
                    tokio::spawn(server.clone().connection(tcp, acceptor.clone(), guard));
                }
            }
        }
    }

    async fn connection(
        self: Arc<Self>,
        tcp: tokio::net::TcpStream,
        acceptor: tokio_rustls::TlsAcceptor,
        _guard: ConnectionGuard,
    ) {
        let _ = tcp.set_nodelay(true);
        let Ok(tls) = acceptor.accept(tcp).await else {
            return;
        };
        let common_name = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certificates| certificates.first())
            .and_then(|certificate| common_name(certificate));
        let server = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let server = server.clone();
            let common_name = common_name.clone();
            async move { Ok::<_, Infallible>(server.handle(request, common_name).await) }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        if let Some(streams) = self.max_concurrent_streams {
            builder.http2().max_concurrent_streams(streams);
        }
        let _ = builder
            .serve_connection_with_upgrades(TokioIo::new(tls), service)
            .await;
    }

    async fn handle(
        &self,
        request: Request<Incoming>,
        common_name: Option<String>,
    ) -> Response<ResponseBody> {
        let guard = StreamGuard::open(&self.shared);
        self.shared.requests_served.fetch_add(1, Ordering::Relaxed);
        let headers = request.headers();
        let header = |name: &str| header_text(headers, name);
        let authorization = header("authorization");
        let caller = match common_name {
            Some(name) => Some(Caller::Certificate(name)),
            None => authorization
                .as_deref()
                .and_then(|value| value.strip_prefix("Bearer "))
                .and_then(|token| self.caller_tokens.get(token))
                .map(|name| Caller::Token(name.clone())),
        };
        if self.record_requests {
            self.record(&request, caller.clone(), authorization);
        }
        if caller.is_none() {
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
        // exec / attach / portforward: a real apiserver switches to SPDY or WebSocket here; the
        // simulator switches to an echo of whatever the client sends, enough to prove a proxy
        // carries the upgraded stream both ways.
        let streaming = ["/exec", "/attach", "/portforward"]
            .iter()
            .any(|suffix| request.uri().path().ends_with(suffix));
        if streaming && websocket::is_websocket(request.headers()) {
            let command = request
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .filter_map(|pair| pair.strip_prefix("command="))
                .map(decode)
                .collect();
            return websocket::accept(request, command);
        }
        if let (true, Some(protocol)) = (streaming, header("upgrade")) {
            tokio::spawn(async move {
                if let Ok(upgraded) = hyper::upgrade::on(request).await {
                    let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut reader, &mut writer).await;
                }
            });
            return Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "Upgrade")
                .header("upgrade", protocol)
                .body(ResponseBody::full(Bytes::new()))
                .unwrap_or_else(|_| Response::new(ResponseBody::full(Bytes::new())));
        }
        let table = header("accept").is_some_and(|accept| accept.contains("as=Table"));
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = parse_query(request.uri().query().unwrap_or(""));
        let body = match request.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => Bytes::new(),
        };
        let review_delay = self.shared.token_review_delay_ms.load(Ordering::SeqCst);
        if review_delay > 0 && path.ends_with("/tokenreviews") {
            tokio::time::sleep(Duration::from_millis(review_delay)).await;
        }
        let read_delay = self.shared.read_delay_ms.load(Ordering::SeqCst);
        if read_delay > 0 && method == http::Method::GET && !query.contains_key("watch") {
            tokio::time::sleep(Duration::from_millis(read_delay)).await;
        }
        self.route(&method, &path, &query, &body, table)
            .map(|body| body.with_guard(guard))
    }

    fn record(
        &self,
        request: &Request<Incoming>,
        caller: Option<Caller>,
        authorization: Option<String>,
    ) {
        let headers = request.headers();
        let header = |name: &str| header_text(headers, name);
        let mut impersonate_extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
                impersonate_extra
                    .entry(key.to_string())
                    .or_default()
                    .push(value.to_str().unwrap_or("").to_string());
            }
        }
        let record = RecordedRequest {
            caller,
            method: request.method().to_string(),
            uri: request
                .uri()
                .path_and_query()
                .map_or_else(|| request.uri().path().to_string(), |path| path.to_string()),
            version: request.version(),
            impersonate_user: header("impersonate-user"),
            impersonate_groups: headers
                .get_all("impersonate-group")
                .iter()
                .map(|value| value.to_str().unwrap_or("").to_string())
                .collect(),
            impersonate_uid: header("impersonate-uid"),
            impersonate_extra,
            authorization,
            x_remote: headers
                .iter()
                .filter(|(name, _)| {
                    name.as_str().starts_with("x-remote-") || name.as_str().contains('_')
                })
                .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("")))
                .collect(),
        };
        lock(&self.shared.requests).push(record);
    }

    fn route(
        &self,
        method: &http::Method,
        path: &str,
        query: &HashMap<String, String>,
        body: &[u8],
        table: bool,
    ) -> Response<ResponseBody> {
        let get = method == http::Method::GET;
        match path {
            "/healthz" | "/livez" if get => plain(StatusCode::OK, "ok"),
            "/readyz" if get => {
                if self.shared.not_ready.load(Ordering::SeqCst) {
                    plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "[-]simulator not ready\nreadyz check failed",
                    )
                } else {
                    plain(StatusCode::OK, "ok")
                }
            }
            "/version" if get => ok_json(json!({
                "major": "1", "minor": "29", "gitVersion": "v1.29.0-sluice-simulator",
                "gitCommit": "simulator", "gitTreeState": "clean",
                "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.21.0",
                "compiler": "gc", "platform": "linux/amd64",
            })),
            "/api" if get => ok_json(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            })),
            "/api/v1" if get => ok_json(resource_list(
                "v1",
                RESOURCES
                    .iter()
                    .map(|kind| {
                        json!({
                            "name": kind.name, "singularName": kind.kind.to_lowercase(),
                            "namespaced": true, "kind": kind.kind,
                            "verbs": ["create", "delete", "get", "list", "watch"],
                            "shortNames": [kind.short],
                        })
                    })
                    .collect(),
            )),
            "/apis" if get => {
                let groups: Vec<Value> = ["authentication.k8s.io", "authorization.k8s.io"]
                    .iter()
                    .map(|group| {
                        let version =
                            json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
                        json!({"name": group, "versions": [version], "preferredVersion": version})
                    })
                    .collect();
                ok_json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
            }
            "/apis/authentication.k8s.io/v1" if get => ok_json(resource_list(
                "authentication.k8s.io/v1",
                vec![
                    json!({"name": "tokenreviews", "singularName": "tokenreview", "namespaced": false, "kind": "TokenReview", "verbs": ["create"]}),
                ],
            )),
            "/apis/authorization.k8s.io/v1" if get => ok_json(resource_list(
                "authorization.k8s.io/v1",
                vec![
                    json!({"name": "subjectaccessreviews", "singularName": "subjectaccessreview", "namespaced": false, "kind": "SubjectAccessReview", "verbs": ["create"]}),
                ],
            )),
            // Just enough OpenAPI v3 for kubectl to see that the server validates fields
            // itself (`fieldValidation` on PATCH), so `kubectl create` needs no client-side
            // schema. The simulator accepts the parameter and does not validate.
            "/openapi/v3" if get => ok_json(json!({
                "paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=sluice-simulator"}},
            })),
            "/openapi/v3/api/v1" if get => ok_json(openapi_v3_core()),
            "/apis/authentication.k8s.io/v1/tokenreviews" if method == http::Method::POST => {
                self.token_review(body)
            }
            "/apis/authorization.k8s.io/v1/subjectaccessreviews"
                if method == http::Method::POST =>
            {
                self.subject_access_review(body)
            }
            _ => self.resource(method, path, query, body, table),
        }
    }

    fn token_review(&self, body: &[u8]) -> Response<ResponseBody> {
        self.shared.token_reviews.fetch_add(1, Ordering::SeqCst);
        let Ok(review) = serde_json::from_slice::<Value>(body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid TokenReview");
        };
        let token = text(&review["spec"]["token"]);
        let found = lock(&self.shared.store).tokens.get(token).cloned();
        let status_field = match found {
            Some(user) => json!({
                "authenticated": true,
                "user": {"username": user.username, "uid": user.uid, "groups": user.groups, "extra": user.extra},
            }),
            None => {
                json!({"authenticated": false, "error": "token not registered with the simulator"})
            }
        };
        ok_json(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {"creationTimestamp": null}, "spec": {}, "status": status_field,
        }))
    }

    fn subject_access_review(&self, body: &[u8]) -> Response<ResponseBody> {
        self.shared
            .subject_access_reviews
            .fetch_add(1, Ordering::SeqCst);
        let Ok(review) = serde_json::from_slice::<Value>(body) else {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "invalid SubjectAccessReview",
            );
        };
        let spec = &review["spec"];
        let attributes = if spec["resourceAttributes"].is_object() {
            spec["resourceAttributes"].clone()
        } else {
            let non_resource = &spec["nonResourceAttributes"];
            json!({"verb": non_resource["verb"], "resource": non_resource["path"]})
        };
        let allowed = lock(&self.shared.store)
            .access_rules
            .iter()
            .any(|rule| rule.allows(spec, &attributes));
        ok_json(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "metadata": {"creationTimestamp": null}, "spec": spec,
            "status": {"allowed": allowed, "reason": if allowed { "allowed by a simulator rule" } else { "no simulator rule allows it" }},
        }))
    }

    fn resource(
        &self,
        method: &http::Method,
        path: &str,
        query: &HashMap<String, String>,
        body: &[u8],
        table: bool,
    ) -> Response<ResponseBody> {
        let steps: Vec<&str> = path.trim_matches('/').split('/').collect();
        // /api/v1/<resource> or /api/v1/namespaces/<ns>/<resource>[/<name>]
        let (namespace, resource, name) = match steps.as_slice() {
            ["api", "v1", resource] => (None, *resource, None),
            ["api", "v1", "namespaces", namespace, resource] => (Some(*namespace), *resource, None),
            ["api", "v1", "namespaces", namespace, resource, name] => {
                (Some(*namespace), *resource, Some(*name))
            }
            _ => return not_found(path),
        };
        let Some(kind) = kind_of(resource) else {
            return not_found(path);
        };
        let selected_name = query
            .get("fieldSelector")
            .and_then(|selector| selector.strip_prefix("metadata.name="))
            .map(str::to_string);
        let watch = query
            .get("watch")
            .is_some_and(|value| value == "true" || value == "1");
        let mut store = lock(&self.shared.store);
        match (method.as_str(), name) {
            ("GET", None) if watch => {
                let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
                // Without a resourceVersion (or with "0") a watch starts with the current state,
                // as the apiserver does.
                let from_now = query
                    .get("resourceVersion")
                    .is_some_and(|version| !version.is_empty() && version != "0");
                if !from_now {
                    for object in store.list(resource, namespace, selected_name.as_deref()) {
                        let _ = sender.send(watch_event("ADDED", &object, table, resource));
                    }
                }
                store.next_watcher += 1;
                let id = store.next_watcher;
                store.watchers.push(Watcher {
                    id,
                    resource: resource.to_string(),
                    namespace: namespace.map(str::to_string),
                    name: selected_name,
                    table,
                    sender,
                });
                if let Some(seconds) = query
                    .get("timeoutSeconds")
                    .and_then(|seconds| seconds.parse::<u64>().ok())
                {
                    let shared = self.shared.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(seconds)).await;
                        lock(&shared.store)
                            .watchers
                            .retain(|watcher| watcher.id != id);
                    });
                }
                let mut response = Response::new(ResponseBody::stream(receiver));
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            ("GET", None) if table => {
                let items = store.list(resource, namespace, selected_name.as_deref());
                let version = store.resource_version.to_string();
                ok_json(table_of(resource, &items, &version))
            }
            ("GET", None) => {
                let key = (
                    resource.to_string(),
                    namespace.map(str::to_string),
                    selected_name,
                );
                if let Some(body) = store.list_cache.get(&key) {
                    return json_bytes(StatusCode::OK, body.clone());
                }
                let items = store.list(resource, namespace, key.2.as_deref());
                let version = store.resource_version.to_string();
                let body = Bytes::from(
                    json!({
                        "kind": format!("{}List", kind.kind), "apiVersion": "v1",
                        "metadata": {"resourceVersion": version}, "items": items,
                    })
                    .to_string(),
                );
                if store.list_cache.len() >= LIST_CACHE_LIMIT {
                    store.list_cache.clear();
                }
                store.list_cache.insert(key, body.clone());
                json_bytes(StatusCode::OK, body)
            }
            ("GET", Some(name)) => match store.get(resource, namespace.unwrap_or(""), name) {
                Some(object) if table => ok_json(table_of(
                    resource,
                    &[object],
                    &store.resource_version.to_string(),
                )),
                Some(object) => ok_json(object),
                None => object_not_found(resource, name),
            },
            ("POST", None) => {
                let Some(namespace) = namespace else {
                    return status(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "MethodNotAllowed",
                        "create in a namespace",
                    );
                };
                let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "body is not JSON");
                };
                let name = text(&object["metadata"]["name"]).to_string();
                if name.is_empty() {
                    return status(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        "metadata.name is required",
                    );
                }
                if store.get(resource, namespace, &name).is_some() {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("{resource} \"{name}\" already exists"),
                    );
                }
                object["metadata"]["namespace"] = json!(namespace);
                object["apiVersion"] = json!("v1");
                object["kind"] = json!(kind.kind);
                if resource == "pods" && object["status"]["phase"].is_null() {
                    object["status"] = json!({"phase": "Running"});
                }
                let created = store.upsert(resource, object, "ADDED");
                let mut response = ok_json(created);
                *response.status_mut() = StatusCode::CREATED;
                response
            }
            ("DELETE", Some(name)) => match store.remove(resource, namespace.unwrap_or(""), name) {
                Some(object) => ok_json(object),
                None => object_not_found(resource, name),
            },
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "the simulator does not support this method here",
            ),
        }
    }
}

fn openapi_v3_core() -> Value {
    let mut paths = serde_json::Map::new();
    for kind in &RESOURCES {
        let field_validation = json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let gvk = json!({"group": "", "version": "v1", "kind": kind.kind});
        paths.insert(
            format!("/api/v1/namespaces/{{namespace}}/{}/{{name}}", kind.name),
            json!({
                "patch": {
                    "operationId": format!("patchNamespaced{}", kind.kind),
                    "parameters": [field_validation],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                },
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (sluice simulator)", "version": "v1.29.0"},
        "paths": paths,
        "components": {"schemas": {}},
    })
}

fn resource_list(group_version: &str, resources: Vec<Value>) -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// Query parameters, percent-decoded, first value wins.
fn parse_query(query: &str) -> HashMap<String, String> {
    let mut parameters = HashMap::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        parameters
            .entry(decode(key))
            .or_insert_with(|| decode(value));
    }
    parameters
}

fn decode(text: &str) -> String {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

fn common_name(certificate: &[u8]) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate).ok()?;
    let common_name = parsed.subject().iter_common_name().next()?;
    common_name.as_str().ok().map(str::to_string)
}

/// A header's value as text; `None` if absent or not visible ASCII.
fn header_text(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}
