//! The rig the gateway's allocation and memory tests share: certificates, an HTTP/2
//! apiserver answering every request with [`BODY`], the gateway on one worker core in front of
//! it, and a kubectl-like GET.

#![allow(dead_code)] // each test binary uses its own part of the rig

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use sluice_config::ListenerConfig;
use sluice_gateway_proxy::{Gateway, GatewayEndpoint, GatewayMetrics};
use sluice_grpc::transport::{ClientConnection, H2Settings};
use sluice_runtime::{
    ConnectionLimits, Driver, DriverSelection, HandlerFactory, Lifecycle, Placement, RunningServer,
    RuntimeOptions, ServerBuilder,
};

pub const CLUSTER: &str = "gw.allocations.test";
pub const BODY: &[u8] =
    br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}"#;

/// PEM files: a CA, a serving certificate (the gateway's cluster name, and the loopback
/// address the apiserver is dialled at), a client certificate for `alice` in `dev` and the
/// gateway's own identity towards the apiserver.
pub struct Files {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub gateway_cert: PathBuf,
    pub gateway_key: PathBuf,
}

pub fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let names = vec![CLUSTER.to_string(), "127.0.0.1".to_string()];
    let mut server = CertificateParams::new(names).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name.push(DnType::CommonName, "alice");
    client
        .distinguished_name
        .push(DnType::OrganizationName, "dev");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &issuer).unwrap();
    let mut gateway = CertificateParams::new(Vec::<String>::new()).unwrap();
    gateway
        .distinguished_name
        .push(DnType::CommonName, "sluice-gateway");
    gateway.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let gateway_key = KeyPair::generate().unwrap();
    let gateway_cert = gateway.signed_by(&gateway_key, &issuer).unwrap();
    Files {
        ca: write("ca.pem", issuer.pem()),
        server_cert: write("server.pem", server_cert.pem()),
        server_key: write("server-key.pem", server_key.serialize_pem()),
        client_cert: write("client.pem", client_cert.pem()),
        client_key: write("client-key.pem", client_key.serialize_pem()),
        gateway_cert: write("gateway.pem", gateway_cert.pem()),
        gateway_key: write("gateway-key.pem", gateway_key.serialize_pem()),
        _dir: dir,
    }
}

/// The cluster directory: one cluster in front of `apiserver`, client certificates verified
/// against the CA, one dispatch policy for everyone with a flow-control schema.
pub fn clusters_dir(files: &Files, apiserver: SocketAddr) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = (
        files.ca.display(),
        files.server_cert.display(),
        files.server_key.display(),
    );
    let (identity, identity_key) = (files.gateway_cert.display(), files.gateway_key.display());
    let yaml = format!(
        "apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata:
  name: {CLUSTER}
spec:
  servers:
  - endpoint: https://{apiserver}
  clientConfig: {{caFile: {ca}, certFile: {identity}, keyFile: {identity_key}}}
  secureServing: {{certFile: {cert}, keyFile: {key}, clientCAFile: {ca}}}
  flowControl:
    schemas:
    - name: everyone
      maxRequestsInflight: {{max: 100}}
  dispatchPolicies:
  - name: everyone
    flowControlSchemaName: everyone
    rules:
    - verbs: [\"*\"]
      apiGroups: [\"*\"]
      resources: [\"*\"]
"
    );
    std::fs::write(dir.path().join("cluster.yaml"), yaml).unwrap();
    dir
}

/// An HTTP/2 apiserver on its own thread answering every request with [`BODY`].
pub fn start_apiserver(cert: &Path, key: &Path) -> SocketAddr {
    let config = sluice_grpc::tls::server_config(cert, key, None).unwrap();
    let (bound, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            bound.send(listener.local_addr().unwrap()).unwrap();
            while let Ok((stream, _)) = listener.accept().await {
                monoio::spawn(serve_apiserver_connection(stream, config.clone()));
            }
        });
    });
    address.recv().unwrap()
}

async fn serve_apiserver_connection(
    stream: monoio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
) {
    let io = sluice_grpc::transport::compat(stream).unwrap();
    let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(io).await else {
        return;
    };
    let Ok(mut connection) = h2::server::handshake(tls).await else {
        return;
    };
    while let Some(Ok((_request, mut respond))) = connection.accept().await {
        let response = http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        if let Ok(mut body) = respond.send_response(response, false) {
            let _ = body.send_data(Bytes::from_static(BODY), true);
        }
    }
}

/// The gateway on one worker core of `driver`, serving `clusters` through `listener` (which
/// wraps the gateway's own to mark its worker thread), with room for `connections` clients.
pub fn start_gateway<F: HandlerFactory + 'static>(
    driver: Driver,
    clusters: &Path,
    connections: usize,
    listener: impl FnOnce(GatewayEndpoint) -> F,
) -> (RunningServer, SocketAddr) {
    let metrics =
        GatewayMetrics::register(&mut prometheus_client::registry::Registry::default(), 1);
    let gateway = Gateway::load(clusters, metrics).unwrap();
    let options = RuntimeOptions {
        workers: 1,
        driver: DriverSelection {
            driver,
            fallback_reason: None,
        },
        uring_entries: 256,
        drain_timeout: Duration::from_secs(2),
    };
    let mut server = ServerBuilder::new(options, Arc::new(Lifecycle::new()));
    let config = ListenerConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        backlog: 64,
        max_connections_per_worker: connections,
        limits: ConnectionLimits::default(),
        tls: None,
    };
    let id = server.bind("gateway", &config, Placement::Workers).unwrap();
    let address = server.local_addr(id);
    let endpoint = GatewayEndpoint {
        gateway,
        workers: 1,
    };
    server.serve(id, listener(endpoint));
    let running = server
        .start()
        .unwrap_or_else(|error| panic!("{driver}: {error}"));
    (running, address)
}

/// Runs `future` on the clients' runtime (the legacy driver, on this thread: the gateway under
/// test runs the driver the test picks).
pub fn on_client_runtime<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(future)
}

/// What a client dials the gateway with: TLS to [`CLUSTER`] as `alice` (client certificate).
/// One config for all of a test's connections, so later ones resume the first's TLS session.
pub type ClientTls = (
    Arc<rustls::ClientConfig>,
    rustls_pki_types::ServerName<'static>,
);

pub fn client_tls(files: &Files) -> ClientTls {
    let config = sluice_grpc::tls::client_config(
        Some(&files.ca),
        Some((&files.client_cert, &files.client_key)),
    )
    .unwrap();
    (
        config,
        rustls_pki_types::ServerName::try_from(CLUSTER).unwrap(),
    )
}

/// A client connection to the gateway over `tls`, then HTTP/2.
pub async fn connect_client(gateway: SocketAddr, tls: &ClientTls) -> ClientConnection {
    sluice_grpc::transport::connect(gateway, Some(tls.clone()), &H2Settings::default())
        .await
        .unwrap()
}

/// One GET through the gateway, as kubectl sends it, its response read to the end.
/// A 1,000-character secret, marked sensitive so HPACK sends it as a never-indexed literal.
fn session_secret() -> http::HeaderValue {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = SECRET.get_or_init(|| "s3ss10n-".repeat(125));
    let mut value = http::HeaderValue::from_str(text).unwrap();
    value.set_sensitive(true);
    value
}

pub async fn one_request(connection: &ClientConnection) {
    let mut send = connection.ready().await.unwrap();
    // The query makes `:path` a literal of more than 32 bytes, which h2 sends without indexing
    // ahead of the secret below on every request: the memo must keep the secret regardless.
    let request = http::Request::get(format!(
        "https://{CLUSTER}/api/v1/namespaces/default/pods?limit=500&resourceVersion=0&resourceVersionMatch=NotOlderThan"
    ))
    // What kubectl sends with a `get pods`.
    .header(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .header(
        "user-agent",
        "kubectl/v1.31.0 (linux/amd64) kubernetes/abcdef0",
    )
    .header("kubectl-command", "kubectl get")
    .header("kubectl-session", "0f4e6e5a-3c2b-4f44-9a7c-5b1d0c1e2f3a")
    .header("accept-encoding", "gzip")
    // A client secret sent never indexed, as nghttp2 sends `authorization`: the h2 patch
    // decodes it once per connection and drops its memo once the connection is quiet
    // (vendor/README.md), which the allocation count and the idle heap bound each check.
    .header("x-client-session", session_secret())
    .body(())
    .unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200, "{response:?}");
    let mut body = response.into_body();
    let mut length = 0;
    while let Some(chunk) = sluice_grpc::transport::recv_data(&mut body).await {
        length += chunk.unwrap().len();
    }
    assert_eq!(length, BODY.len());
}
