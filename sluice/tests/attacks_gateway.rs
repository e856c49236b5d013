//! Attacks on the Kubernetes API gateway, performed against the real `sluice` binary in front
//! of the apiserver simulator (test-support): each test does what a hostile client would, then
//! asserts the outcome (status and `Status` reason, the metric that counts the refusal, what
//! reached the apiserver) and that a well-behaved client is still served. See docs/SECURITY.md.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use test_support::{
    code_and_body, gateway_config_yaml, gateway_curl, on_both_drivers, run_on_driver,
    upstream_cluster_yaml, wait_until, write_clusters_dir, ApiServer, Certificates, ClientCert,
    SluiceLauncher, SluiceProcess, TokenUser, HEALTH_CHECK_FAST, SERVE_LOOPBACK,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The cluster's name: clients reach it with this TLS server name.
const HOST: &str = "kube.sluice.test";

on_both_drivers!(
    a_request_smuggled_behind_a_refused_upgrade_never_reaches_the_apiserver,
    encoded_paths_are_judged_as_the_apiserver_decodes_them,
    unauthenticated_clients_cannot_grow_metric_labels_or_flood_the_log,
    random_bearer_tokens_cannot_amplify_into_token_reviews,
    token_reviews_in_flight_are_bounded_per_core,
    request_header_identity_from_clients_is_stripped_and_exposed_secrets_are_named,
    silent_and_quiet_clients_are_closed_on_the_gateway_limits,
);

struct Gateway {
    certs: Certificates,
    servers: Vec<ApiServer>,
    process: SluiceProcess,
    alice: ClientCert,
    gateway_identity: ClientCert,
    clusters_dir: PathBuf,
}

/// A gateway with two cores on the monoio `driver` in front of one simulator; `spec_extra` is
/// appended under `spec:`; `prepare` runs on the gateway's identity before the gateway starts.
fn start(driver: &str, spec_extra: &str, prepare: impl FnOnce(&ClientCert)) -> Gateway {
    start_with_limits(driver, spec_extra, "", prepare)
}

/// [`start`] with `limits` (YAML flow-map entries, each after a comma) on the gateway listener.
fn start_with_limits(
    driver: &str,
    spec_extra: &str,
    limits: &str,
    prepare: impl FnOnce(&ClientCert),
) -> Gateway {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let gateway_identity = certs.client("sluice-gateway", &[]).unwrap();
    prepare(&gateway_identity);
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let pool = "  connectionPool: {maxConnectionsPerServer: 2}\n";
    let cluster = upstream_cluster_yaml(
        HOST,
        &[server.url()],
        &certs,
        &gateway_identity,
        SERVE_LOOPBACK,
        &format!("{HEALTH_CHECK_FAST}{pool}{spec_extra}"),
    );
    let clusters_dir = write_clusters_dir(launcher.dir(), &cluster);
    let yaml = gateway_config_yaml(driver, 2, limits, &clusters_dir, ", reload_interval: 200ms");
    let config = launcher.write_file("gateway.yaml", &yaml).unwrap();
    let process = run_on_driver(launcher, &config, driver);
    let alice = certs.client("alice", &["dev-team"]).unwrap();
    Gateway {
        certs,
        servers: vec![server],
        process,
        alice,
        gateway_identity,
        clusters_dir,
    }
}

impl Gateway {
    fn server(&self) -> &ApiServer {
        &self.servers[0]
    }

    /// curl over HTTP/2 to the gateway as `HOST` with `extra` options; (status, body).
    fn curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let options = ["--silent", "--http2", "--max-time", "10", "--path-as-is"];
        let output = gateway_curl(&self.process, HOST, &self.certs, None, &options, path)
            .args(["--write-out", "\n%{http_code}"])
            .args(extra)
            .output()
            .expect("curl is installed");
        code_and_body(&output)
    }

    fn alice_curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let mut args = vec![
            "--cert".to_string(),
            self.alice.cert.display().to_string(),
            "--key".to_string(),
            self.alice.key.display().to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.curl(&args, path)
    }

    /// Writes every cluster file again, same content, new mtime (each atomically: the reloader
    /// never reads half a file).
    fn touch_clusters(&self) {
        let spare = self.clusters_dir.with_extension("rewrite");
        for entry in std::fs::read_dir(&self.clusters_dir).unwrap() {
            let path = entry.unwrap().path();
            std::fs::write(&spare, std::fs::read(&path).unwrap()).unwrap();
            std::fs::rename(&spare, &path).unwrap();
        }
    }

    /// A well-behaved client still gets a correct answer.
    fn assert_alice_is_served(&self) {
        let (code, body) = self.alice_curl(&[], "/api/v1/namespaces/default/pods");
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("PodList"), "{body}");
    }

    fn metrics(&self) -> String {
        test_support::http_get(self.process.address("admin"), "/metrics")
            .unwrap()
            .body
    }

    /// The value of a metric line that starts with `prefix` (0 when absent).
    fn metric(&self, prefix: &str) -> f64 {
        self.metrics()
            .lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0.0)
    }

    fn rejected(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "sluice_gateway_rejected_total{{reason=\"{reason}\"}}"
        ))
    }

    /// A raw TLS connection (ALPN http/1.1), as alice when `as_alice`.
    fn raw_tls(&self, as_alice: bool) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.certs.ca_cert).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let mut config = if as_alice {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(&self.alice.cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
            let key = PrivateKeyDer::from_pem_file(&self.alice.key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connection = rustls::ClientConnection::new(
            Arc::new(config),
            ServerName::try_from(HOST.to_string()).unwrap(),
        )
        .unwrap();
        let tcp = TcpStream::connect(self.process.address("gateway")).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        rustls::StreamOwned::new(connection, tcp)
    }

    /// One HTTP/1.1 request on its own connection (`Connection: close`); (status, whole answer).
    fn raw_request(&self, as_alice: bool, request: &str) -> (u16, String) {
        let mut stream = self.raw_tls(as_alice);
        stream.write_all(request.as_bytes()).unwrap();
        stream.flush().unwrap();
        let answer = read_to_close(&mut stream);
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        (status, answer)
    }
}

/// Everything until the peer closes (or the read timeout).
fn read_to_close(stream: &mut impl Read) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&chunk[..read]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// The `reason` of a Kubernetes `Status` body.
fn status_reason(body: &str) -> String {
    let start = body.find('{').unwrap_or(0);
    let end = body.rfind('}').map_or(body.len(), |end| end + 1);
    let json = &body[start..end.max(start)];
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|status| status["reason"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Finding 1: `GET /version` asking for an upgrade, with a second request (an impersonating
/// read of secrets) in the same write. The apiserver answers the first without switching
/// protocols; the second must never reach it, and the connection closes.
fn a_request_smuggled_behind_a_refused_upgrade_never_reaches_the_apiserver(driver: &str) {
    let gateway = start(driver, "", |_| {});
    gateway.server().create_pod("default", "web-1");
    let smuggled = format!(
        "GET /version HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /api/v1/namespaces/kube-system/secrets HTTP/1.1\r\nHost: {HOST}\r\nImpersonate-User: system:admin\r\nImpersonate-Group: system:masters\r\n\r\n"
    );
    let started = Instant::now();
    let (status, answer) = gateway.raw_request(true, &smuggled);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer.matches("HTTP/1.1 ").count(),
        1,
        "one answer, then the connection closed: {answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the gateway closed the connection"
    );
    gateway.assert_alice_is_served();
    let requests = gateway.server().requests();
    assert!(
        requests.iter().any(|request| request.uri == "/version"),
        "{requests:?}"
    );
    assert!(
        !requests
            .iter()
            .any(|request| request.uri.contains("secrets")),
        "the smuggled request reached the apiserver: {requests:?}"
    );
    assert_eq!(
        gateway.metric("sluice_gateway_upgrade_early_bytes_dropped_total"),
        1.0,
        "{}",
        gateway.metrics()
    );

    // A real upgrade still carries the client's bytes, after the 101.
    let mut stream = gateway.raw_tls(true);
    stream
        .write_all(
            format!("POST /api/v1/namespaces/default/pods/web-1/exec?command=sh HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\nping-early")
                .as_bytes(),
        )
        .unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("ping-early") {
        let read = stream.read(&mut chunk).unwrap();
        assert!(read > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..read]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 101"));
}

/// Finding 2: a `-secrets` rule is not bypassed by percent-encoding the resource, and paths
/// that decode two ways are refused with 400 naming the problem.
fn encoded_paths_are_judged_as_the_apiserver_decodes_them(driver: &str) {
    let gateway = start(driver,
        "  dispatchPolicies:\n  - name: no-secrets\n    rules:\n    - {verbs: ['*'], apiGroups: ['*'], resources: ['-secrets']}\n    - {verbs: ['*'], nonResourceURLs: ['*']}\n",
        |_| {},
    );
    let before = gateway.rejected("no_dispatch_policy");
    let (code, body) = gateway.alice_curl(&[], "/api/v1/namespaces/default/%73ecrets");
    assert_eq!(code, 403, "{body}");
    assert_eq!(status_reason(&body), "Forbidden", "{body}");
    assert!(
        body.contains("/api/v1/namespaces/default/secrets"),
        "{body}"
    );
    assert_eq!(gateway.rejected("no_dispatch_policy"), before + 1.0);

    let bad_before = gateway.rejected("bad_request");
    for (path, problem) in [
        ("/api/v1/namespaces/default%2Fx/pods", "%2F"),
        (
            "/api/v1/namespaces/default/pods/%2e%2e/%2e%2e/secrets",
            "'..'",
        ),
        ("/api/v1/namespaces/default/pods/../../secrets", "'..'"),
        ("/api/v1/namespaces/%ff/pods", "UTF-8"),
        ("/api/v1/namespaces/default/pods%00", "NUL"),
    ] {
        let (code, body) = gateway.alice_curl(&[], path);
        assert_eq!(code, 400, "{path}: {body}");
        assert_eq!(status_reason(&body), "BadRequest", "{path}: {body}");
        assert!(body.contains(problem), "{path}: {body}");
    }
    assert_eq!(gateway.rejected("bad_request"), bad_before + 5.0);
    assert!(
        !gateway
            .server()
            .requests()
            .iter()
            .any(|request| request.uri.contains("ecrets") || request.uri.contains('%')),
        "{:?}",
        gateway.server().requests()
    );
    gateway.assert_alice_is_served();
}

/// Finding 5: without credentials, a client cannot mint `resource` label values nor fill the
/// log with its paths.
fn unauthenticated_clients_cannot_grow_metric_labels_or_flood_the_log(driver: &str) {
    let gateway = start(driver, "", |_| {});
    let port = gateway.process.address("gateway").port();
    let marker = "zz".repeat(500);
    let requests = 200;
    // One curl, requests in parallel on one HTTP/2 connection: far faster than the log budget
    // refills (10 lines per second per core), even on a busy machine.
    let urls: Vec<String> = (0..requests)
        .map(|index| format!("https://{HOST}:{port}/api/v1/namespaces/default/evil{index}{marker}"))
        .collect();
    let before = gateway.rejected("unauthorized");
    let output = Command::new("curl")
        .args([
            "--silent",
            "--http2",
            "--max-time",
            "20",
            "--parallel",
            "--parallel-max",
            "50",
        ])
        .arg("--cacert")
        .arg(&gateway.certs.ca_cert)
        .args(["--resolve", &format!("{HOST}:{port}:127.0.0.1")])
        .args(&urls)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(gateway.rejected("unauthorized"), before + requests as f64);
    let metrics = gateway.metrics();
    assert!(
        !metrics.contains("evil"),
        "a client-chosen label: {metrics}"
    );
    assert!(
        gateway.metric("sluice_gateway_refusal_logs_suppressed_total") > 0.0,
        "{metrics}"
    );
    gateway.assert_alice_is_served();
    let stderr = gateway.process.stderr();
    let logged = stderr.matches("request refused").count();
    assert!(
        logged < requests / 2,
        "{logged} refusal lines for {requests} refusals"
    );
    assert!(!stderr.contains(&marker), "a whole client path in the log");
}

/// Finding 7: random bearer tokens from one address become a bounded number of TokenReviews,
/// then 429 with Retry-After; a valid user keeps its cached verdict and is served throughout.
fn random_bearer_tokens_cannot_amplify_into_token_reviews(driver: &str) {
    let gateway = start(
        driver,
        "  authentication: {failedTokenReviewBurst: 5, failedTokenReviewsPerMinute: 6}\n",
        |_| {},
    );
    gateway
        .server()
        .add_token("token-carol", TokenUser::new("carol", &["ops"]));
    let carol = || {
        gateway.curl(
            // Another address than the flood's (the limit is per source address; each core
            // caches verdicts on its own, so carol's may be new to the core she reaches).
            &[
                "--interface",
                "127.0.0.2",
                "-H",
                "Authorization: Bearer token-carol",
            ],
            "/api/v1/namespaces/default/pods",
        )
    };
    // Each core caches on its own: enough connections that both cores know carol.
    for _ in 0..12 {
        assert_eq!(carol().0, 200);
    }
    let reviews_before = gateway.server().token_review_calls();
    let mut statuses = Vec::new();
    let mut limited_answer = String::new();
    for index in 0..60 {
        let (status, answer) = gateway.raw_request(
            false,
            &format!("GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer random-{index}\r\nConnection: close\r\n\r\n"),
        );
        if status == 429 {
            limited_answer = answer;
        }
        statuses.push(status);
        if index % 20 == 0 {
            assert_eq!(carol().0, 200, "carol is served during the flood");
        }
    }
    let reviews = gateway.server().token_review_calls() - reviews_before;
    // Five rejected tokens per address and core (two cores), plus what refilled meanwhile.
    assert!(reviews <= 14, "{reviews} TokenReviews for 60 random tokens");
    assert!(statuses.contains(&401), "{statuses:?}");
    assert!(
        statuses.iter().filter(|status| **status == 429).count() >= 40,
        "{statuses:?}"
    );
    assert_eq!(
        status_reason(&limited_answer),
        "TooManyRequests",
        "{limited_answer}"
    );
    assert!(
        limited_answer
            .to_ascii_lowercase()
            .contains("retry-after: "),
        "{limited_answer}"
    );
    assert!(gateway.rejected("authentication_failures_limited") >= 40.0);
    // Carol's verdict was never evicted: no new review for her.
    let reviews_now = gateway.server().token_review_calls();
    for _ in 0..5 {
        assert_eq!(carol().0, 200);
    }
    assert_eq!(gateway.server().token_review_calls(), reviews_now);
}

/// Finding 7: against a slow authentication backend, new tokens beyond the per-core bound of
/// reviews in flight are answered 429 at once instead of piling up reviews; clients with a
/// certificate are served meanwhile.
fn token_reviews_in_flight_are_bounded_per_core(driver: &str) {
    let gateway = start(
        driver,
        "  authentication: {maxConcurrentTokenReviews: 1}\n",
        |_| {},
    );
    gateway
        .server()
        .set_token_review_delay(Duration::from_millis(1500));
    let reviews_before = gateway.server().token_review_calls();
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let flood: Vec<_> = (0..10)
            .map(|index| {
                let gateway = &gateway;
                scope.spawn(move || {
                    gateway.raw_request(
                        false,
                        &format!("GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer slow-{index}\r\nConnection: close\r\n\r\n"),
                    )
                })
            })
            .collect();
        // The flood holds every review slot once eight of its ten requests were turned away
        // busy (one slot per core, two cores): alice comes while the slow reviews last.
        assert!(
            wait_until(Duration::from_secs(10), || gateway
                .rejected("token_reviews_busy")
                >= 8.0),
            "the flood never filled the review slots: {} refused busy",
            gateway.rejected("token_reviews_busy")
        );
        gateway.assert_alice_is_served();
        flood
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    });
    let reviews = gateway.server().token_review_calls() - reviews_before;
    assert!(
        reviews <= 2,
        "{reviews} TokenReviews in flight at once on two cores"
    );
    let busy: Vec<&(u16, String)> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .collect();
    assert!(busy.len() >= 8, "{answers:?}");
    assert_eq!(
        status_reason(&busy[0].1),
        "TooManyRequests",
        "{}",
        busy[0].1
    );
    assert!(busy[0].1.contains("retry-after: 1"), "{}", busy[0].1);
    assert!(
        answers
            .iter()
            .all(|(status, _)| *status == 429 || *status == 401),
        "{answers:?}"
    );
    assert!(gateway.rejected("token_reviews_busy") >= 8.0);
}

/// Finding 10: `X-Remote-*` headers (the apiserver's request-header authentication) from a
/// client never reach the apiserver; a secret file readable by others is warned about once.
fn request_header_identity_from_clients_is_stripped_and_exposed_secrets_are_named(driver: &str) {
    let gateway = start(driver, "", |identity| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&identity.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    });
    let (code, body) = gateway.alice_curl(
        &[
            "-H",
            "X-Remote-User: system:admin",
            "-H",
            "X-Remote-Group: system:masters",
            "-H",
            "X-Remote-Extra-Scopes: all",
        ],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 200, "{body}");
    let requests = gateway.server().requests();
    let pods = requests
        .iter()
        .find(|request| request.uri.contains("/pods"))
        .unwrap();
    assert_eq!(pods.impersonate_user.as_deref(), Some("alice"));
    assert!(pods.x_remote.is_empty(), "{:?}", pods.x_remote);

    let key: PathBuf = gateway.gateway_identity.key.clone();
    // Reloads load the key again: still one warning. Each rewrite of the cluster files is a
    // change the reloader picks up within its 200 ms interval.
    let reloads = || gateway.metric("sluice_gateway_config_reloads_total{result=\"ok\"}");
    for _ in 0..2 {
        let before = reloads();
        gateway.touch_clusters();
        assert!(
            wait_until(Duration::from_secs(5), || reloads() > before),
            "the rewritten cluster files were never reloaded ({before} reloads)"
        );
    }
    assert!(wait_until(Duration::from_secs(5), || gateway
        .process
        .stderr()
        .contains("secret file is readable")));
    let stderr = gateway.process.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| {
            line.contains("secret file is readable") && line.contains(&*key.to_string_lossy())
        })
        .collect();
    assert_eq!(warnings.len(), 1, "once per file: {stderr}");
    assert!(warnings[0].contains("0644"), "{warnings:?}");
}

/// Issue 13, finding 4: a client that connects and sends nothing is closed at the handshake
/// timeout, one that completes TLS and HTTP/2 and then asks nothing at the header timeout; both
/// are counted, and a well-behaved client is served meanwhile. Limits of 0.5-1 s are asserted
/// closed within 5 s (a loaded CI) and never before half the limit.
fn silent_and_quiet_clients_are_closed_on_the_gateway_limits(driver: &str) {
    let gateway = start_with_limits(
        driver,
        "",
        ", handshake_timeout: 500ms, header_timeout: 1s, idle_timeout: 1s",
        |_| {},
    );
    let address = gateway.process.address("gateway");
    let started = Instant::now();
    let mut silent = TcpStream::connect(address).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    let closed = silent.read(&mut byte);
    assert!(
        matches!(closed, Ok(0))
            || closed
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent client was closed: {closed:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(started.elapsed() < Duration::from_secs(5));

    let tls = sluice_grpc::tls::client_config(Some(&gateway.certs.ca_cert), None).unwrap();
    let quiet = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
        .block_on(async move {
            let name = ServerName::try_from(HOST).unwrap();
            let connection = sluice_grpc::transport::connect(
                address,
                Some((tls, name)),
                &sluice_grpc::transport::H2Settings::default(),
            )
            .await
            .expect("TLS and HTTP/2 with the gateway");
            let started = Instant::now();
            let _keep = connection.send_request;
            monoio::time::timeout(Duration::from_secs(5), connection.driver)
                .await
                .map(|_| started.elapsed())
        });
    let quiet = quiet.expect("the quiet connection was closed");
    assert!(quiet >= Duration::from_millis(500), "{quiet:?}");
    gateway.assert_alice_is_served();
    let closed = |reason: &str| {
        let metrics = test_support::http_get(gateway.process.address("admin"), "/metrics")
            .unwrap()
            .body;
        let series =
            format!("sluice_connections_closed_total{{listener=\"gateway\",reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(test_support::wait_until(Duration::from_secs(5), || closed(
        "handshake_timeout"
    )
        >= 1.0));
    assert!(test_support::wait_until(Duration::from_secs(5), || closed(
        "header_timeout"
    )
        >= 1.0));
}
