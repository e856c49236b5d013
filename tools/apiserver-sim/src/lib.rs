//! A kube-apiserver **simulator** for the gateway's tests, kubectl, the perf harness and the
//! `sluice up` demo. It is
//! not Kubernetes: it serves discovery, pods and configmaps (get, list, watch, create, delete)
//! from memory, TokenReview and SubjectAccessReview from rules the test registers, and health
//! endpoints. What it does for real: TLS with client-certificate or bearer-token authentication,
//! HTTP/1.1 and HTTP/2 (with a configurable SETTINGS_MAX_CONCURRENT_STREAMS), streamed watch
//! responses flushed per event, and it records every request's caller and `Impersonate-*`
//! headers and counts connections and concurrent streams so tests can assert them.
//!
//! `kubectl create` validates by default: the simulator serves a minimal OpenAPI v3 document that
//! tells kubectl the server validates fields itself (it accepts `fieldValidation` and does not).

mod api;
mod body;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use api::{SubjectAccessRule, TokenUser};

/// How to start an [`ApiServer`].
#[derive(Debug, Clone)]
pub struct ApiServerOptions {
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// CA whose client certificates are accepted (the caller is the certificate's CN).
    pub client_ca: PathBuf,
    /// Bearer tokens accepted as callers instead of a certificate: token -> caller name.
    pub caller_tokens: HashMap<String, String>,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS announced to clients; `None`: hyper's default.
    pub max_concurrent_streams: Option<u32>,
    /// Keep every request for [`ApiServer::requests`] (tests assert on them). A load test turns
    /// this off: millions of records would grow without bound and cost the simulator time.
    pub record_requests: bool,
    /// The address to listen on (port 0: any free port); loopback unless a test puts the
    /// simulator behind a network link of its own (partition tests).
    pub bind: std::net::IpAddr,
}

impl ApiServerOptions {
    /// The server's certificate and key, and the CA whose client certificates it accepts (all
    /// PEM files).
    pub fn new(server_cert: &Path, server_key: &Path, client_ca: &Path) -> Self {
        Self {
            server_cert: server_cert.to_path_buf(),
            server_key: server_key.to_path_buf(),
            client_ca: client_ca.to_path_buf(),
            caller_tokens: HashMap::new(),
            max_concurrent_streams: None,
            record_requests: true,
            bind: std::net::IpAddr::from([127, 0, 0, 1]),
        }
    }

    /// Listens on `ip` instead of loopback.
    pub fn bind(mut self, ip: std::net::IpAddr) -> Self {
        self.bind = ip;
        self
    }

    pub fn caller_token(mut self, token: &str, caller: &str) -> Self {
        self.caller_tokens
            .insert(token.to_string(), caller.to_string());
        self
    }

    pub fn max_concurrent_streams(mut self, streams: u32) -> Self {
        self.max_concurrent_streams = Some(streams);
        self
    }

    pub fn without_request_records(mut self) -> Self {
        self.record_requests = false;
        self
    }
}

/// Who called the simulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Common name of the verified client certificate.
    Certificate(String),
    /// Caller name registered for the bearer token.
    Token(String),
}

impl Caller {
    pub fn name(&self) -> &str {
        match self {
            Caller::Certificate(name) | Caller::Token(name) => name,
        }
    }
}

/// One request as the simulator saw it (refused ones included, with `caller: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub caller: Option<Caller>,
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub version: http::Version,
    pub impersonate_user: Option<String>,
    pub impersonate_groups: Vec<String>,
    pub impersonate_uid: Option<String>,
    /// Keys as sent after `Impersonate-Extra-` (lower case, still percent-encoded).
    pub impersonate_extra: BTreeMap<String, Vec<String>>,
    pub authorization: Option<String>,
    /// `X-Remote-*` headers (request-header authentication) and every header whose name holds
    /// a `_` (some stacks read `X_Remote_User` as `X-Remote-User`), as `name: value`, lower case.
    pub x_remote: Vec<String>,
}

/// Counters and records shared by the server tasks and the test.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) requests: Mutex<Vec<RecordedRequest>>,
    pub(crate) requests_served: AtomicUsize,
    pub(crate) accepted_connections: AtomicUsize,
    pub(crate) open_connections: AtomicUsize,
    pub(crate) open_streams: AtomicUsize,
    pub(crate) max_open_streams: AtomicUsize,
    pub(crate) not_ready: AtomicBool,
    pub(crate) token_reviews: AtomicUsize,
    /// Milliseconds each TokenReview takes before it answers (a slow authenticator).
    pub(crate) token_review_delay_ms: std::sync::atomic::AtomicU64,
    /// Milliseconds each read (a GET that is not a watch) takes before it answers.
    pub(crate) read_delay_ms: std::sync::atomic::AtomicU64,
    pub(crate) subject_access_reviews: AtomicUsize,
    pub(crate) store: Mutex<api::Store>,
}

/// Locks even after a panic in another test thread: the data is plain records.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running simulator on `127.0.0.1:<random port>`, stopped on drop.
pub struct ApiServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    pub fn start_with(options: ApiServerOptions) -> std::io::Result<Self> {
        let tls = tls_config(&options)?;
        let listener = std::net::TcpListener::bind((options.bind, 0))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let (shutdown, stopped) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let server = api::Server {
            shared: shared.clone(),
            caller_tokens: Arc::new(options.caller_tokens),
            max_concurrent_streams: options.max_concurrent_streams,
            record_requests: options.record_requests,
        };
        let thread = std::thread::Builder::new()
            .name(format!("apiserver-sim-{}", address.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => server.serve(listener, tls, stopped).await,
                        Err(error) => eprintln!("apiserver simulator: {error}"),
                    }
                });
                runtime.shutdown_background();
            })?;
        Ok(Self {
            address,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    /// TCP connections accepted since the start.
    pub fn accepted_connections(&self) -> usize {
        self.shared.accepted_connections.load(Ordering::SeqCst)
    }

    /// TCP connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections.load(Ordering::SeqCst)
    }

    /// Requests being served now (a watch counts until its response ends).
    pub fn open_streams(&self) -> usize {
        self.shared.open_streams.load(Ordering::SeqCst)
    }

    /// The most requests ever served at the same time.
    pub fn max_open_streams(&self) -> usize {
        self.shared.max_open_streams.load(Ordering::SeqCst)
    }

    /// `/readyz` answers 500 while not ready (`/healthz` and `/livez` stay ok).
    pub fn set_ready(&self, ready: bool) {
        self.shared.not_ready.store(!ready, Ordering::SeqCst);
    }

    /// A bearer token the TokenReview endpoint accepts for `user`.
    pub fn add_token(&self, token: &str, user: TokenUser) {
        lock(&self.shared.store)
            .tokens
            .insert(token.to_string(), user);
    }

    /// A permission the SubjectAccessReview endpoint grants.
    pub fn allow(&self, rule: SubjectAccessRule) {
        lock(&self.shared.store).access_rules.push(rule);
    }

    /// Every later TokenReview answers only after `delay` (a slow authentication backend).
    pub fn set_token_review_delay(&self, delay: std::time::Duration) {
        self.shared
            .token_review_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Every later read (a GET that is not a watch) answers only after `delay`: a slow
    /// apiserver, such as one listing many objects, so that requests hold their streams.
    pub fn set_read_delay(&self, delay: std::time::Duration) {
        self.shared
            .read_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn token_review_calls(&self) -> usize {
        self.shared.token_reviews.load(Ordering::SeqCst)
    }

    pub fn subject_access_review_calls(&self) -> usize {
        self.shared.subject_access_reviews.load(Ordering::SeqCst)
    }

    /// Stores a pod (as if created) and sends an `ADDED` event to its watchers.
    pub fn create_pod(&self, namespace: &str, name: &str) -> serde_json::Value {
        let pod = api::new_pod(namespace, name);
        lock(&self.shared.store).upsert("pods", pod, "ADDED")
    }

    /// Requests answered since the start (counted even when records are off).
    pub fn requests_served(&self) -> usize {
        self.shared.requests_served.load(Ordering::SeqCst)
    }

    /// Sends a watch event (`ADDED`, `MODIFIED` or `DELETED`) for a pod to its watchers,
    /// updating the store accordingly (a fresh pod object if it did not exist).
    pub fn emit_pod_event(&self, event_type: &str, namespace: &str, name: &str) {
        let mut store = lock(&self.shared.store);
        let pod = store
            .get("pods", namespace, name)
            .unwrap_or_else(|| api::new_pod(namespace, name));
        if event_type == "DELETED" {
            store.remove("pods", namespace, name);
        } else {
            store.upsert("pods", pod, event_type);
        }
    }

    /// Watch connections open now for `resource` (`pods`, `configmaps`).
    pub fn watchers(&self, resource: &str) -> usize {
        lock(&self.shared.store).watcher_count(resource)
    }

    /// A kubeconfig for this server using `client` (certificate and key files).
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        ca: &Path,
        client_cert: &Path,
        client_key: &Path,
    ) -> std::io::Result<()> {
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: user\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: user\n    namespace: default\ncurrent-context: sim\n",
            self.url(),
            ca.display(),
            client_cert.display(),
            client_key.display()
        );
        std::fs::write(path, config)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn tls_config(options: &ApiServerOptions) -> std::io::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificates = CertificateDer::pem_file_iter(&options.server_cert)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(std::io::Error::other)?;
    let key = PrivateKeyDer::from_pem_file(&options.server_key).map_err(std::io::Error::other)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&options.client_ca).map_err(std::io::Error::other)? {
        roots
            .add(ca.map_err(std::io::Error::other)?)
            .map_err(std::io::Error::other)?;
    }
    // Certificates are optional at the TLS layer so bearer-token callers can connect; a request
    // with neither is refused with 401 by the handler.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(std::io::Error::other)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates, key)
        .map_err(std::io::Error::other)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
