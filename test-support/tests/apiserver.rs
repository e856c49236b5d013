//! The apiserver simulator against real clients: curl over HTTP/2 + TLS, h2load for stream and
//! connection accounting, kubectl 1.x and the Python `kubernetes` client, so we know they work
//! with it before the gateway sits in front.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use test_support::{
    wait_until, ApiServer, ApiServerOptions, Caller, Certificates, ClientCert, SubjectAccessRule,
    TokenUser,
};

struct Fixture {
    certs: Certificates,
    gateway: ClientCert,
    server: ApiServer,
}

fn fixture(options: impl FnOnce(ApiServerOptions) -> ApiServerOptions) -> Fixture {
    let certs = Certificates::generate(&[]).unwrap();
    let gateway = certs.client("sluice-gateway", &["system:masters"]).unwrap();
    let server = ApiServer::start_with(options(test_support::apiserver_options(&certs))).unwrap();
    Fixture {
        certs,
        gateway,
        server,
    }
}

impl Fixture {
    /// curl over HTTP/2 with the gateway's certificate; returns (status, body).
    fn curl(&self, extra: &[&str], path: &str) -> (u16, String) {
        let output = Command::new("curl")
            .args(["--silent", "--show-error", "--http2", "--max-time", "10"])
            .arg("--cacert")
            .arg(&self.certs.ca_cert)
            .arg("--cert")
            .arg(&self.gateway.cert)
            .arg("--key")
            .arg(&self.gateway.key)
            .args(["--write-out", "\n%{http_code}"])
            .args(extra)
            .arg(format!("{}{path}", self.server.url()))
            .output()
            .expect("curl is installed");
        parse_curl(output)
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        let path = self.certs.dir().join("kubeconfig");
        self.server
            .write_kubeconfig(
                &path,
                &self.certs.ca_cert,
                &self.gateway.cert,
                &self.gateway.key,
            )
            .unwrap();
        path
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--request-timeout", "10s"])
            .args(args)
            .output()
            .expect("kubectl is installed (apt install kubernetes-client)")
    }
}

fn parse_curl(output: Output) -> (u16, String) {
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"))
}

#[test]
fn curl_over_http2_is_recorded_with_caller_and_impersonation() {
    let fixture = fixture(|options| options);
    fixture.server.create_pod("default", "web-1");
    let (code, body) = fixture.curl(
        &[
            "-H",
            "Impersonate-User: alice",
            "-H",
            "Impersonate-Group: dev",
            "-H",
            "Impersonate-Group: ops",
            "-H",
            "Impersonate-Extra-scopes: view",
            "-H",
            "Impersonate-Uid: 42",
        ],
        "/api/v1/namespaces/default/pods",
    );
    assert_eq!(code, 200, "{body}");
    let list = json(&body);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "web-1");
    let requests = fixture.server.requests();
    let request = requests.last().unwrap();
    assert_eq!(
        request.caller,
        Some(Caller::Certificate("sluice-gateway".into()))
    );
    assert_eq!(request.version, http::Version::HTTP_2);
    assert_eq!(request.method, "GET");
    assert_eq!(request.uri, "/api/v1/namespaces/default/pods");
    assert_eq!(request.impersonate_user.as_deref(), Some("alice"));
    assert_eq!(request.impersonate_groups, ["dev", "ops"]);
    assert_eq!(request.impersonate_uid.as_deref(), Some("42"));
    assert_eq!(request.impersonate_extra["scopes"], ["view"]);
    assert_eq!(fixture.server.accepted_connections(), 1);
}

#[test]
fn callers_need_a_certificate_or_a_registered_bearer_token() {
    let fixture = fixture(|options| options.caller_token("gateway-token", "token-gateway"));
    let anonymous = |extra: &[&str]| {
        let output = Command::new("curl")
            .args(["--silent", "--http1.1", "--max-time", "10"])
            .arg("--cacert")
            .arg(&fixture.certs.ca_cert)
            .args(["--write-out", "\n%{http_code}"])
            .args(extra)
            .arg(format!("{}/api/v1/pods", fixture.server.url()))
            .output()
            .unwrap();
        parse_curl(output)
    };
    let (code, body) = anonymous(&[]);
    assert_eq!(code, 401);
    assert_eq!(json(&body)["reason"], "Unauthorized");
    assert_eq!(anonymous(&["-H", "Authorization: Bearer wrong"]).0, 401);
    assert_eq!(
        anonymous(&["-H", "Authorization: Bearer gateway-token"]).0,
        200
    );
    let requests = fixture.server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].caller, None);
    assert_eq!(
        requests[2].caller,
        Some(Caller::Token("token-gateway".into()))
    );
    assert_eq!(requests[2].version, http::Version::HTTP_11);
}

#[test]
fn repeated_lists_follow_every_change_and_records_can_be_off() {
    let fixture = fixture(|options| options.without_request_records());
    let names = || -> Vec<String> {
        let (code, body) = fixture.curl(&[], "/api/v1/namespaces/default/pods");
        assert_eq!(code, 200, "{body}");
        json(&body)["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|pod| pod["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    fixture.server.create_pod("default", "web-1");
    assert_eq!(names(), ["web-1"]);
    // The second answer comes from the cache; a change must still show in the next one.
    assert_eq!(names(), ["web-1"]);
    fixture.server.create_pod("default", "web-2");
    assert_eq!(names(), ["web-1", "web-2"]);
    fixture.server.emit_pod_event("DELETED", "default", "web-1");
    assert_eq!(names(), ["web-2"]);
    let (code, body) = fixture.curl(&["-X", "DELETE"], "/api/v1/namespaces/default/pods/web-2");
    assert_eq!(code, 200, "{body}");
    assert!(names().is_empty());
    assert!(fixture.server.requests().is_empty());
    assert_eq!(fixture.server.requests_served(), 6);
}

#[test]
fn readiness_can_be_flipped_and_health_stays_ok() {
    let fixture = fixture(|options| options);
    assert_eq!(fixture.curl(&[], "/readyz"), (200, "ok".into()));
    fixture.server.set_ready(false);
    assert_eq!(fixture.curl(&[], "/readyz").0, 500);
    assert_eq!(fixture.curl(&[], "/healthz"), (200, "ok".into()));
    assert_eq!(fixture.curl(&[], "/livez").0, 200);
    fixture.server.set_ready(true);
    assert_eq!(fixture.curl(&[], "/readyz").0, 200);
}

#[test]
fn token_and_subject_access_reviews_follow_registered_rules_and_are_counted() {
    let fixture = fixture(|options| options);
    let mut bob = TokenUser::new("bob", &["dev"]);
    bob.uid = "u-1".into();
    fixture.server.add_token("bob-token", bob);
    fixture
        .server
        .allow(SubjectAccessRule::impersonate("alice", "users", "bob"));
    let post = |path: &str, body: &str| {
        fixture.curl(
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data",
                body,
            ],
            path,
        )
    };
    let review = |token: &str| {
        let (code, body) = post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &format!(
                r#"{{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{{"token":"{token}"}}}}"#
            ),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)["status"].clone()
    };
    let known = review("bob-token");
    assert_eq!(known["authenticated"], true);
    assert_eq!(known["user"]["username"], "bob");
    assert_eq!(known["user"]["uid"], "u-1");
    assert_eq!(known["user"]["groups"][0], "dev");
    assert_eq!(review("nobody")["authenticated"], false);
    assert_eq!(fixture.server.token_review_calls(), 2);

    let access = |user: &str, name: &str| {
        let (code, body) = post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &format!(
                r#"{{"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","spec":{{"user":"{user}","resourceAttributes":{{"verb":"impersonate","resource":"users","name":"{name}"}}}}}}"#
            ),
        );
        assert_eq!(code, 200, "{body}");
        json(&body)["status"]["allowed"].as_bool().unwrap()
    };
    assert!(access("alice", "bob"));
    assert!(!access("alice", "root"));
    assert!(!access("mallory", "bob"));
    assert_eq!(fixture.server.subject_access_review_calls(), 3);
}

#[test]
fn watch_streams_events_as_they_happen() {
    let fixture = fixture(|options| options);
    fixture.server.create_pod("default", "existing");
    let mut curl = Command::new("curl")
        .args(["--silent", "--no-buffer", "--http2", "--max-time", "20"])
        .arg("--cacert")
        .arg(&fixture.certs.ca_cert)
        .arg("--cert")
        .arg(&fixture.gateway.cert)
        .arg("--key")
        .arg(&fixture.gateway.key)
        .arg(format!(
            "{}/api/v1/namespaces/default/pods?watch=true",
            fixture.server.url()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(curl.stdout.take().unwrap()).lines();
    let first = json(&lines.next().unwrap().unwrap());
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "existing");
    assert!(wait_until(Duration::from_secs(5), || fixture
        .server
        .watchers("pods")
        == 1));
    fixture
        .server
        .emit_pod_event("MODIFIED", "default", "existing");
    let modified = json(&lines.next().unwrap().unwrap());
    assert_eq!(modified["type"], "MODIFIED");
    fixture.server.emit_pod_event("ADDED", "other", "elsewhere");
    fixture
        .server
        .emit_pod_event("DELETED", "default", "existing");
    let deleted = json(&lines.next().unwrap().unwrap());
    assert_eq!(deleted["type"], "DELETED");
    assert_eq!(deleted["object"]["metadata"]["name"], "existing");
    assert_eq!(fixture.server.open_streams(), 1);
    curl.kill().unwrap();
    curl.wait().unwrap();
    assert!(wait_until(Duration::from_secs(5), || fixture
        .server
        .open_streams()
        == 0));
}

#[test]
fn max_concurrent_streams_bounds_streams_per_connection() {
    // h2load cannot present a client certificate: it authenticates with a caller token.
    let fixture = fixture(|options| {
        options
            .max_concurrent_streams(3)
            .caller_token("load-token", "h2load")
    });
    let output = Command::new("h2load")
        .args(["-n", "9", "-c", "1", "-m", "9"])
        .args(["-H", "Authorization: Bearer load-token"])
        // watches that stay open for a second each, so streams overlap
        .arg(format!(
            "{}/api/v1/pods?watch=true&timeoutSeconds=1",
            fixture.server.url()
        ))
        .output()
        .expect("h2load is installed (apt install nghttp2-client)");
    let report = String::from_utf8_lossy(&output.stdout);
    // h2load may open streams before it reads the server's SETTINGS; the ones over the limit
    // are refused (REFUSED_STREAM), which h2load counts as errors. Every request the server did
    // serve ran with at most 3 streams open.
    let succeeded: usize = report
        .lines()
        .find(|line| line.starts_with("requests:"))
        .and_then(|line| line.split(", ").find(|part| part.ends_with(" succeeded")))
        .and_then(|part| part.trim_end_matches(" succeeded").parse().ok())
        .unwrap_or_else(|| panic!("no h2load summary in {report}"));
    assert!(succeeded >= 3, "{report}");
    assert_eq!(fixture.server.requests().len(), succeeded);
    assert_eq!(fixture.server.accepted_connections(), 1);
    let max = fixture.server.max_open_streams();
    assert_eq!(max, 3, "streams open at once\n{report}");
    assert!(wait_until(Duration::from_secs(5), || fixture
        .server
        .open_connections()
        == 0));
}

#[test]
fn kubectl_gets_creates_and_reads_raw_paths() {
    let fixture = fixture(|options| options);
    fixture.server.create_pod("default", "web-1");
    let output = fixture.kubectl(&["get", "pods"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("NAME") && stdout.contains("web-1") && stdout.contains("Running"),
        "{stdout}"
    );

    let manifest = fixture.certs.dir().join("pod.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: created\nspec:\n  containers:\n  - name: main\n    image: busybox\n",
    )
    .unwrap();
    // default validation: kubectl finds server-side field validation in the OpenAPI v3 document
    let output = fixture.kubectl(&["create", "-f", manifest.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(fixture
        .server
        .requests()
        .iter()
        .any(|request| request.method == "POST" && request.uri.contains("fieldValidation=Strict")));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "pod/created created"
    );
    let output = fixture.kubectl(&["get", "pod", "created", "-o", "json"]);
    assert_eq!(
        json(&String::from_utf8_lossy(&output.stdout))["metadata"]["name"],
        "created"
    );

    let output = fixture.kubectl(&["get", "--raw", "/healthz"]);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok");
    let output = fixture.kubectl(&["delete", "pod", "created"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(fixture
        .server
        .requests()
        .iter()
        .all(|request| request.caller == Some(Caller::Certificate("sluice-gateway".into()))));
}

#[test]
fn kubectl_watch_prints_emitted_events() {
    let fixture = fixture(|options| options);
    fixture.server.create_pod("default", "first");
    let mut kubectl = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(fixture.kubeconfig())
        .args(["get", "pods", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(kubectl.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert!(header.starts_with("NAME"), "{header}");
    assert!(lines.next().unwrap().unwrap().starts_with("first"));
    assert!(wait_until(Duration::from_secs(10), || fixture
        .server
        .watchers("pods")
        == 1));
    fixture.server.emit_pod_event("ADDED", "default", "second");
    let line = lines.next().unwrap().unwrap();
    assert!(line.starts_with("second"), "{line}");
    kubectl.kill().unwrap();
    kubectl.wait().unwrap();
}

#[test]
fn python_kubernetes_client_lists_and_watches() {
    let fixture = fixture(|options| options);
    fixture.server.create_pod("default", "py-1");
    let mut python = Command::new(test_support::python())
        .arg(test_support::python_script("kube_list_watch.py"))
        .arg(fixture.kubeconfig())
        .args(["default", "py-2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(python.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "list py-1");
    assert_eq!(lines.next().unwrap().unwrap(), "event ADDED py-1");
    assert!(wait_until(Duration::from_secs(10), || fixture
        .server
        .watchers("pods")
        == 1));
    fixture.server.emit_pod_event("ADDED", "default", "py-2");
    assert_eq!(lines.next().unwrap().unwrap(), "event ADDED py-2");
    assert!(python.wait().unwrap().success());
}
