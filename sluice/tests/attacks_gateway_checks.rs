//! Issue 32's gateway checks, tried from outside against the real `sluice` binary in front of
//! the apiserver simulator, each on both monoio drivers: the SubjectAccessReview cache never
//! lends one principal's "allowed" to another differing in uid or extra (finding 4); a negated
//! `resourceNames` rule never hands its object out through a collection (finding 5); identity
//! headers spelled with `_`, upgrades announcing a body and refused HEADs over HTTP/2
//! (finding 8); UpstreamClusters from the control plane cannot name files outside the gateway's
//! credentials directory (build point 4). See docs/SECURITY.md.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use test_support::{
    code_and_body, gateway_config_yaml, gateway_curl, on_both_drivers, run_on_driver,
    upstream_cluster_yaml, wait_until, write_clusters_dir, ApiServer, Certificates, ClientCert,
    ControlPlane, SluiceLauncher, SluiceProcess, SubjectAccessRule, TokenUser, HEALTH_CHECK_FAST,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The cluster's name: clients reach it with this TLS server name.
const HOST: &str = "kube.sluice.test";
const PODS: &str = "/api/v1/namespaces/default/pods";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

on_both_drivers!(
    access_reviews_are_never_shared_across_uid_or_extra,
    a_negated_name_rule_never_hands_its_object_out_through_a_collection,
    identity_headers_spelled_with_underscores_never_reach_the_apiserver,
    an_upgrade_announcing_a_body_is_refused_before_the_apiserver,
    a_refused_head_over_http2_gets_its_status_without_a_body,
    control_plane_clusters_cannot_name_files_outside_the_credentials_dir,
);

struct Gateway {
    certs: Certificates,
    server: ApiServer,
    process: SluiceProcess,
    alice: ClientCert,
    /// The gateway's own client certificate (kept so its files outlive the start).
    _identity: ClientCert,
}

/// The cluster object, `spec_extra` appended under `spec:`; file paths absolute.
fn cluster_yaml(certs: &Certificates, identity: &ClientCert, url: &str, extra: &str) -> String {
    let rest = format!("{HEALTH_CHECK_FAST}{extra}");
    upstream_cluster_yaml(HOST, &[url.to_string()], certs, identity, "", &rest)
}

/// A gateway with ONE core (the review caches are per core: two requests on two cores would
/// each ask the apiserver, and the cache under test would never be consulted) on `driver`.
fn start(driver: &str, spec_extra: &str) -> Gateway {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let cluster = cluster_yaml(&certs, &identity, &server.url(), spec_extra);
    let clusters_dir = write_clusters_dir(launcher.dir(), &cluster);
    let yaml = gateway_config_yaml(driver, 1, "", &clusters_dir, "");
    let config = launcher.write_file("gateway.yaml", &yaml).unwrap();
    let process = run_on_driver(launcher, &config, driver);
    let alice = certs.client("alice", &["dev-team"]).unwrap();
    Gateway {
        certs,
        server,
        process,
        alice,
        _identity: identity,
    }
}

/// curl over HTTP/2 to `process` as `HOST`, trusting `certs`, with `extra` options; the whole
/// output (stdout: the body, then the status code on the last line).
fn curl_to(process: &SluiceProcess, certs: &Certificates, extra: &[&str], path: &str) -> Output {
    let options = ["--silent", "--show-error", "--http2", "--max-time", "10"];
    gateway_curl(process, HOST, certs, None, &options, path)
        .args(["--write-out", "\n%{http_code}"])
        .args(extra)
        .output()
        .expect("curl is installed")
}

impl Gateway {
    fn curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        code_and_body(&curl_to(&self.process, &self.certs, extra, path))
    }

    fn alice_curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let (cert, key) = (self.alice.cert.display(), self.alice.key.display());
        let (cert, key) = (cert.to_string(), key.to_string());
        let mut args = vec!["--cert", &cert, "--key", &key];
        args.extend(extra);
        self.curl(&args, path)
    }

    fn token_curl(&self, token: &str, extra: &[&str], path: &str) -> (u16, String) {
        let authorization = format!("Authorization: Bearer {token}");
        let mut args = vec!["-H", &authorization];
        args.extend(extra);
        self.curl(&args, path)
    }

    fn rejected(&self, reason: &str) -> f64 {
        let line = format!("sluice_gateway_rejected_total{{reason=\"{reason}\"}} ");
        test_support::http_get(self.process.address("admin"), "/metrics")
            .unwrap()
            .body
            .lines()
            .find_map(|text| text.strip_prefix(&line)?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Requests the apiserver saw whose path starts with `prefix`.
    fn seen(&self, method: &str, prefix: &str) -> usize {
        self.server
            .requests()
            .iter()
            .filter(|request| request.method == method && request.uri.starts_with(prefix))
            .count()
    }
}

/// The `reason` of a Kubernetes `Status` body.
fn status_reason(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body.trim())
        .ok()
        .and_then(|status| status["reason"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Finding 4: two principals differing only in uid (then only in extra) whose reviews the
/// apiserver answers differently. The first is allowed to impersonate carol and its answer is
/// cached; the second must be asked about, and denied, not served from that cache.
fn access_reviews_are_never_shared_across_uid_or_extra(driver: &str) {
    let gateway = start(driver, "");
    let server = &gateway.server;
    let user = |name: &str, uid: &str, scope: &str| {
        let mut user = TokenUser::new(name, &["dev"]);
        user.uid = uid.into();
        user.extra.insert("scopes".into(), vec![scope.into()]);
        user
    };
    server.add_token("alice-u1", user("alice", "u1", "read"));
    server.add_token("alice-u2", user("alice", "u2", "read"));
    server.add_token("bob-admin", user("bob", "b1", "admin"));
    server.add_token("bob-read", user("bob", "b1", "read"));
    server.allow(SubjectAccessRule::impersonate("alice", "users", "carol").for_uid("u1"));
    server.allow(
        SubjectAccessRule::impersonate("bob", "users", "carol").for_extra("scopes", "admin"),
    );
    let as_carol = ["-H", "Impersonate-User: carol"];
    for (allowed, denied) in [("alice-u1", "alice-u2"), ("bob-admin", "bob-read")] {
        let (code, body) = gateway.token_curl(allowed, &as_carol, PODS);
        assert_eq!(code, 200, "{allowed}: {body}");
        let reviews = server.subject_access_review_calls();
        let (code, body) = gateway.token_curl(denied, &as_carol, PODS);
        assert_eq!(code, 403, "{denied} reused {allowed}'s answer: {body}");
        assert_eq!(status_reason(&body), "Forbidden", "{body}");
        assert_eq!(
            server.subject_access_review_calls(),
            reviews + 1,
            "{denied}'s review was asked, not taken from {allowed}'s cached answer"
        );
        // The allowed principal's answer is still cached and still its own.
        let (code, body) = gateway.token_curl(allowed, &as_carol, PODS);
        assert_eq!(code, 200, "{allowed}: {body}");
    }
    let as_carol_upstream = server
        .requests()
        .iter()
        .filter(|request| request.impersonate_user.as_deref() == Some("carol"))
        .count();
    assert_eq!(
        as_carol_upstream, 4,
        "only the allowed principals' requests"
    );
    assert!(gateway.rejected("impersonation_forbidden") >= 2.0);
}

/// Finding 5: `resourceNames: ['-admin-cm']` meant "every configmap but admin-cm". A list, a
/// watch and a deletecollection name no object: they do not match the rule (no other policy
/// does, so 403), and nothing of them reaches the apiserver; single objects other than
/// admin-cm still do.
fn a_negated_name_rule_never_hands_its_object_out_through_a_collection(driver: &str) {
    let gateway = start(
        driver,
        "  dispatchPolicies:\n  - name: fenced\n    rules:\n    - {verbs: ['*'], apiGroups: ['*'], resources: [configmaps], resourceNames: ['-admin-cm']}\n",
    );
    let one = format!("{CONFIGMAPS}/app-cm");
    let (code, body) = gateway.alice_curl(&[], &one);
    assert_ne!(
        code, 403,
        "a named configmap other than admin-cm is served: {body}"
    );
    assert_eq!(gateway.seen("GET", &one), 1);
    let admin = format!("{CONFIGMAPS}/admin-cm");
    let watch = format!("{CONFIGMAPS}?watch=1");
    let refused: [(&[&str], &str); 4] = [
        (&[], &admin),
        (&[], CONFIGMAPS),
        (&[], &watch),
        (&["-X", "DELETE"], CONFIGMAPS),
    ];
    for (extra, path) in refused {
        let (code, body) = gateway.alice_curl(extra, path);
        assert_eq!(code, 403, "{extra:?} {path}: {body}");
        assert_eq!(status_reason(&body), "Forbidden", "{body}");
    }
    assert_eq!(gateway.seen("GET", &admin), 0);
    let collections = gateway
        .server
        .requests()
        .iter()
        .filter(|request| {
            request.uri == CONFIGMAPS || request.uri.starts_with(&format!("{CONFIGMAPS}?"))
        })
        .count();
    assert_eq!(
        collections, 0,
        "no list, watch or deletecollection reached the apiserver"
    );
    assert!(gateway.rejected("no_dispatch_policy") >= 4.0);
}

/// Finding 8a: `X_Remote_User`, `Impersonate_User`... are identity headers to stacks that read
/// `_` as `-`; the gateway strips them as it strips the real ones.
fn identity_headers_spelled_with_underscores_never_reach_the_apiserver(driver: &str) {
    let gateway = start(driver, "");
    let spoofed = [
        "X_Remote_User: system:admin",
        "X_Remote_Group: system:masters",
        "x-remote_extra_scopes: all",
        "Impersonate_User: system:admin",
        "Impersonate_Group: system:masters",
        "X_Custom: kept",
    ];
    let args: Vec<&str> = spoofed.iter().flat_map(|header| ["-H", header]).collect();
    let (code, body) = gateway.alice_curl(&args, PODS);
    assert_eq!(code, 200, "{body}");
    let requests = gateway.server.requests();
    let pods = requests.iter().find(|request| request.uri == PODS).unwrap();
    assert_eq!(pods.impersonate_user.as_deref(), Some("alice"));
    assert_eq!(pods.impersonate_groups, ["dev-team"]);
    assert_eq!(
        pods.x_remote,
        ["x_custom: kept"],
        "only the harmless header"
    );
}

/// Finding 8b: an exec upgrade announcing a body. Forwarded, the apiserver (or the relay) would
/// wait for a body that never comes; it is answered 400 and never reaches the apiserver.
fn an_upgrade_announcing_a_body_is_refused_before_the_apiserver(driver: &str) {
    let gateway = start(driver, "");
    let exec = format!("{PODS}/web/exec?command=sh");
    for framing in ["Content-Length: 64", "Transfer-Encoding: chunked"] {
        let request = format!(
            "GET {exec} HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n{framing}\r\n\r\n"
        );
        let answer = raw_http1(&gateway, &request);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{framing}: {answer}");
        assert!(answer.contains("carries no body"), "{answer}");
    }
    assert_eq!(gateway.seen("GET", &format!("{PODS}/web/exec")), 0);
    assert!(gateway.rejected("bad_request") >= 2.0);
}

/// One HTTP/1.1 request as alice on its own TLS connection; everything until the gateway closes
/// (or 10 s pass: the old relay never answered).
fn raw_http1(gateway: &Gateway, request: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&gateway.certs.ca_cert).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&gateway.alice.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&gateway.alice.key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(HOST.to_string()).unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(gateway.process.address("gateway")).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    stream.write_all(request.as_bytes()).unwrap();
    stream.flush().unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(read @ 1..) = stream.read(&mut chunk) {
        answer.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Finding 8c: HEAD refused over HTTP/2 (no credentials: 401; no matching policy: 403). The
/// client gets the status and headers and a clean end of stream, not a protocol error.
fn a_refused_head_over_http2_gets_its_status_without_a_body(driver: &str) {
    let gateway = start(
        driver,
        "  dispatchPolicies:\n  - rules:\n    - {verbs: [list], apiGroups: ['*'], resources: [pods]}\n",
    );
    let head = ["--head"];
    let unauthenticated = curl_to(&gateway.process, &gateway.certs, &head, PODS);
    let (cert, key) = (gateway.alice.cert.display(), gateway.alice.key.display());
    let (cert, key) = (cert.to_string(), key.to_string());
    let forbidden = curl_to(
        &gateway.process,
        &gateway.certs,
        &["--head", "--cert", &cert, "--key", &key],
        &format!("{CONFIGMAPS}/x"),
    );
    for (output, status) in [(unauthenticated, 401), (forbidden, 403)] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "curl failed ({status}): {stderr}");
        let (code, head) = code_and_body(&output);
        assert_eq!(code, status, "{head}{stderr}");
        assert!(head.contains("content-type: application/json"), "{head}");
    }
    // GET is unchanged: the Status body still comes.
    let (code, body) = gateway.curl(&[], PODS);
    assert_eq!((code, status_reason(&body).as_str()), (401, "Unauthorized"));
}

/// Build point 4: an UpstreamCluster from the control plane naming a file outside the gateway's
/// `gateway.credentials_dir` is refused, the field named, and the file is never sent upstream;
/// one naming only files inside is served; a `..` is refused by the control plane itself.
fn control_plane_clusters_cannot_name_files_outside_the_credentials_dir(driver: &str) {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let alice = certs.client("alice", &["dev"]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    // A one-line host file outside the credentials directory (certs.dir()).
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("hostname");
    std::fs::write(&secret, "host-secret-line\n").unwrap();
    let hostile = cluster_yaml(&certs, &identity, &server.url(), "").replace(
        "  clientConfig:\n",
        &format!(
            "  clientConfig:\n    bearerTokenFile: {}\n",
            secret.display()
        ),
    );
    let created = cp.kubectl(&["create", "-f", "-"], Some(&hostile));
    assert!(
        created.status.success(),
        "the control plane cannot judge absolute paths: {created:?}"
    );

    let launcher = SluiceLauncher::new(BIN).unwrap();
    let token = launcher
        .write_file("token", &cp.token("gateway", "gw-1"))
        .unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: 1, drain_timeout: 2s, driver: {driver}}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway:\n  credentials_dir: '{}'\n  source:\n    controlplane: {{url: '{}', name: gw-1, ca_file: '{}', token_file: '{}'}}\n",
                certs.dir().display(),
                cp.url(),
                cp.ca_file().display(),
                token.display()
            ),
        )
        .unwrap();
    let gateway = launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || gateway
            .stderr()
            .contains("spec.clientConfig.bearerTokenFile")),
        "no refusal naming the field: {}",
        gateway.stderr()
    );
    let stderr = gateway.stderr();
    assert!(
        stderr.contains("outside") && stderr.contains("gateway.credentials_dir"),
        "{stderr}"
    );
    assert!(!stderr.contains("host-secret-line"), "{stderr}");
    let (cert, key) = (
        alice.cert.display().to_string(),
        alice.key.display().to_string(),
    );
    let with_alice = ["--cert", &cert, "--key", &key];
    let output = curl_to(&gateway, &certs, &with_alice, PODS);
    assert_eq!(
        code_and_body(&output).0,
        0,
        "the hostile cluster is not served"
    );
    let leaked = server.requests().iter().any(|request| {
        request
            .authorization
            .as_deref()
            .unwrap_or("")
            .contains("host-secret")
    });
    assert!(!leaked, "the outside file never went upstream");

    // `..` is refused by the control plane, naming the field.
    let climbing = hostile.replace(&secret.display().to_string(), "../../etc/hostname");
    let refused = cp.kubectl(&["apply", "-f", "-"], Some(&climbing));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(said.contains("spec.clientConfig.bearerTokenFile"), "{said}");

    // Files inside the directory: the same cluster without the outside file is served.
    let good = cluster_yaml(&certs, &identity, &server.url(), "")
        .replace(&format!("{}/", certs.dir().display()), "");
    // Replaced, not applied: a merge would keep the bearerTokenFile the live object has.
    let applied = cp.kubectl(&["replace", "-f", "-"], Some(&good));
    assert!(applied.status.success(), "{applied:?}");
    assert!(
        wait_until(Duration::from_secs(15), || {
            code_and_body(&curl_to(&gateway, &certs, &with_alice, PODS)).0 == 200
        }),
        "the cluster naming files inside the directory is never served: {}",
        gateway.stderr()
    );
}
