//! A small fake of the kube-like API server for one resource (`/apis/sluice.dev/v1/agents`),
//! over TLS with a bearer token: paged LIST, WATCH with bookmarks, compaction (410), a switch
//! to close open watches, a stop/start on the same port, and raw line injection.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::channel::Channel;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use sluice_kube_status::StatusReason;
use test_support::Certificates;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub const PATH: &str = "/apis/sluice.dev/v1/agents";
type Body = Either<Full<Bytes>, Channel<Bytes>>;

/// The server's data and switches.
#[derive(Debug, Default)]
pub struct State {
    pub rv: u64,
    pub objects: BTreeMap<String, Value>,
    /// (resourceVersion, type, object), oldest first.
    pub events: Vec<(u64, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410.
    pub compacted: u64,
    /// Answer an expired watch with HTTP 410 instead of an ERROR event.
    pub http_410: bool,
    /// The next LIST page asked with a continue token gets 410.
    pub expire_next_continue: bool,
    /// Resumed watches also replay the event at the requested resourceVersion (a sloppy
    /// server), to show the client does not report it twice.
    pub replay_inclusive: bool,
    /// Bumped to end every open watch.
    pub close_generation: u64,
    /// Lines written as they are into the next open watch.
    pub raw: Vec<Bytes>,
    /// Every request's path and query, in order.
    pub requests: Vec<String>,
    pub token: String,
    /// TLS handshakes the server refused (a client without the certificate it requires).
    pub refused_handshakes: usize,
    /// TLS connections accepted, and which ALPN protocol each agreed.
    pub connections: Vec<Option<Vec<u8>>>,
}

fn object(name: &str, rv: u64, spec: &Value) -> Value {
    json!({"apiVersion": "sluice.dev/v1", "kind": "Agent",
        "metadata": {"name": name, "resourceVersion": rv.to_string()}, "spec": spec})
}

impl State {
    pub fn put(&mut self, name: &str, spec: Value) {
        self.rv += 1;
        let kind = if self.objects.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let value = object(name, self.rv, &spec);
        self.objects.insert(name.into(), value.clone());
        self.events.push((self.rv, kind, value));
    }

    pub fn delete(&mut self, name: &str) {
        self.rv += 1;
        if let Some(mut last) = self.objects.remove(name) {
            last["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            self.events.push((self.rv, "DELETED", last));
        }
    }

    /// Other resources changed: the revision moves without an event for this one.
    pub fn bump(&mut self, by: u64) {
        self.rv += by;
    }

    pub fn bookmark(&mut self) {
        let marker = json!({"apiVersion": "sluice.dev/v1", "kind": "Agent",
            "metadata": {"resourceVersion": self.rv.to_string()}});
        self.events.push((self.rv, "BOOKMARK", marker));
    }

    /// Forgets history up to now: watches from older versions get 410.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
    }

    pub fn watch_requests(&self) -> Vec<String> {
        self.requests
            .iter()
            .filter(|request| request.contains("watch=1"))
            .cloned()
            .collect()
    }
}

struct Shared {
    state: Mutex<State>,
    /// Bumped on every change so open watches look again.
    version: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct FakeApi {
    shared: Arc<Shared>,
    pub certs: Certificates,
    pub token_file: PathBuf,
    pub addr: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    accept_task: Option<tokio::task::JoinHandle<()>>,
    /// Dropped (and so closed) by `stop`: every connection task watches it.
    stopped: Option<watch::Sender<()>>,
}

impl FakeApi {
    pub async fn start(token: &str) -> Self {
        Self::start_with(token, false).await
    }

    /// `mutual`: clients must present a certificate signed by the test CA.
    pub async fn start_with(token: &str, mutual: bool) -> Self {
        Self::start_alpn(token, mutual, &[]).await
    }

    /// Offers h2 (then HTTP/1.1) in ALPN and serves both, as the control plane does.
    pub async fn start_h2(token: &str) -> Self {
        Self::start_alpn(token, false, &[b"h2", b"http/1.1"]).await
    }

    async fn start_alpn(token: &str, mutual: bool, alpn: &[&[u8]]) -> Self {
        let certs = Certificates::generate(&[]).expect("certificates");
        let token_file = certs.dir().join("token");
        std::fs::write(&token_file, format!("{token}\n")).expect("token file");
        let acceptor = acceptor(&certs, mutual, alpn);
        let (version, _) = watch::channel(0);
        let state = State {
            token: token.into(),
            ..State::default()
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            version,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut api = Self {
            shared,
            certs,
            token_file,
            addr,
            acceptor,
            accept_task: None,
            stopped: None,
        };
        api.serve(listener);
        api
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Changes the state and wakes the open watches.
    pub fn mutate<T>(&self, change: impl FnOnce(&mut State) -> T) -> T {
        let result = change(&mut self.shared.lock());
        self.shared.version.send_modify(|version| *version += 1);
        result
    }

    pub fn read<T>(&self, look: impl FnOnce(&State) -> T) -> T {
        look(&self.shared.lock())
    }

    /// Ends every open watch (the client should resume from its last resourceVersion).
    pub fn close_watches(&self) {
        self.mutate(|state| state.close_generation += 1);
    }

    /// Closes the listener and every connection: the server is down.
    pub fn stop(&mut self) {
        if let Some(task) = self.accept_task.take() {
            task.abort();
        }
        self.stopped = None;
        self.close_watches();
    }

    /// Listens again on the same address.
    pub async fn restart(&mut self) {
        // The aborted accept task drops the old listener at its next poll: wait for it.
        for _ in 0..100 {
            if let Ok(listener) = TcpListener::bind(self.addr).await {
                return self.serve(listener);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("cannot listen on {} again", self.addr);
    }

    fn serve(&mut self, listener: TcpListener) {
        let (stopped, _) = watch::channel(());
        let stop_signal = stopped.clone();
        self.stopped = Some(stopped);
        let shared = self.shared.clone();
        let acceptor = self.acceptor.clone();
        self.accept_task = Some(tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let mut stop = stop_signal.subscribe();
                let (shared, acceptor) = (shared.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        shared.lock().refused_handshakes += 1;
                        return;
                    };
                    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                    shared.lock().connections.push(alpn);
                    let service = service_fn(move |request| answer(shared.clone(), request));
                    // Serves HTTP/1.1, or h2 when the client sends its preface.
                    let builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    let connection = builder.serve_connection(TokioIo::new(tls), service);
                    tokio::select! {
                        _ = connection => {}
                        _ = stop.changed() => {}
                    }
                });
            }
        }));
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

fn acceptor(certs: &Certificates, mutual: bool, alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
    let chain = CertificateDer::pem_file_iter(&certs.server_cert)
        .expect("server cert")
        .collect::<Result<Vec<_>, _>>()
        .expect("server cert");
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).expect("server key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = if mutual {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&certs.ca_cert).expect("ca") {
            roots.add(ca.expect("ca")).expect("ca");
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("verifier");
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).expect("server config");
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body =
        sluice_kube_status::Status::failure_with_code(code.as_u16(), reason.to_string(), message);
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body.to_vec()))));
    *response.status_mut() = code;
    response
}

fn query(request: &Request<Incoming>) -> BTreeMap<String, String> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let query = query(&request);
    let authorized = {
        let mut state = shared.lock();
        let path = request.uri().path_and_query().map(|p| p.to_string());
        state.requests.push(path.unwrap_or_default());
        let expected = format!("Bearer {}", state.token);
        request.headers().get(http::header::AUTHORIZATION) == Some(&expected.parse().expect("h"))
    };
    if !authorized {
        return Ok(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized",
        ));
    }
    if request.uri().path() != PATH {
        return Ok(status(StatusCode::NOT_FOUND, "NotFound", "no such path"));
    }
    if query.get("watch").map(String::as_str) == Some("1") {
        return Ok(watch_answer(shared, &query));
    }
    Ok(list_answer(&shared, &query))
}

/// Continue tokens are `<offset>`; every page is read at the current version.
fn list_answer(shared: &Shared, query: &BTreeMap<String, String>) -> Response<Body> {
    let mut state = shared.lock();
    let offset = match query.get("continue") {
        Some(_) if state.expire_next_continue => {
            state.expire_next_continue = false;
            let message = "The provided continue parameter is too old";
            return status(StatusCode::GONE, "Expired", message);
        }
        Some(token) => token.parse().unwrap_or(0),
        None => 0,
    };
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(500);
    let items: Vec<Value> = state
        .objects
        .values()
        .skip(offset)
        .take(limit)
        .cloned()
        .collect();
    let mut metadata = json!({"resourceVersion": state.rv.to_string()});
    if offset + items.len() < state.objects.len() {
        metadata["continue"] = json!((offset + items.len()).to_string());
    }
    let list = json!({"apiVersion": "sluice.dev/v1", "kind": "AgentList",
        "metadata": metadata, "items": items});
    Response::new(Either::Left(Full::new(Bytes::from(list.to_string()))))
}

fn watch_answer(shared: Arc<Shared>, query: &BTreeMap<String, String>) -> Response<Body> {
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    let (compacted, http_410, inclusive) = shared.read_flags();
    if from < compacted && http_410 {
        return status(StatusCode::GONE, "Expired", "too old resource version");
    }
    let (mut sender, body) = Channel::<Bytes>::new(16);
    tokio::spawn(async move {
        let mut version = shared.version.subscribe();
        let generation = shared.lock().close_generation;
        // A sloppy server repeats the event at the resume point once.
        let mut position = if inclusive {
            from.saturating_sub(1)
        } else {
            from
        };
        loop {
            let (lines, end) = next_lines(&shared, &mut position, generation);
            for line in lines {
                if sender.send_data(line).await.is_err() {
                    return;
                }
            }
            if end || version.changed().await.is_err() {
                return;
            }
        }
    });
    Response::new(Either::Right(body))
}

impl Shared {
    fn read_flags(&self) -> (u64, bool, bool) {
        let state = self.lock();
        (state.compacted, state.http_410, state.replay_inclusive)
    }
}

/// What an open watch sends next, and whether it ends after that.
fn next_lines(shared: &Shared, position: &mut u64, generation: u64) -> (Vec<Bytes>, bool) {
    let mut state = shared.lock();
    if state.close_generation != generation {
        return (Vec::new(), true);
    }
    if *position < state.compacted {
        let message = format!("too old resource version: {position} ({})", state.compacted);
        let status = sluice_kube_status::Status::failure(StatusReason::Expired, message);
        let gone = json!({"type": "ERROR", "object": status.to_value()});
        return (vec![Bytes::from(format!("{gone}\n"))], true);
    }
    let mut lines: Vec<Bytes> = state.raw.drain(..).collect();
    for (rv, kind, object) in &state.events {
        if *rv > *position {
            let event = json!({"type": kind, "object": object});
            lines.push(Bytes::from(format!("{event}\n")));
        }
    }
    if let Some((last, _, _)) = state.events.last() {
        *position = (*position).max(*last);
    }
    (lines, false)
}
