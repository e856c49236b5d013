//! What the gateway reads from clients and from the apiserver to decide who a request is:
//! TokenReview and SubjectAccessReview answers (`token_verdict`, `access_allowed`), client
//! certificate subjects (`sluice_gateway::identity::user_from_certificate`), the identity
//! headers a client sends (`strip_client_identity` then `strip_request_header_authentication`,
//! as every upstream request is built), and the file paths an UpstreamCluster from the control
//! plane names (`sluice_upstream_cluster::confine::confine`). The first byte picks the decoder.
//!
//! Properties: a verdict names a user only when the answer said `authenticated: true` with
//! that non-empty username; only an explicit `allowed: true` allows; the review the gateway
//! sends carries the token as given; a certificate's user has a name; no header left for
//! upstream is an identity header under any spelling (`_` for `-`, any case); a path
//! `confine` accepts resolves, through every link, inside the credentials directory.
#![no_main]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_gateway::identity::{strip_client_identity, user_from_certificate};
use sluice_gateway_proxy::fuzzing::{
    access_allowed, strip_request_header_authentication, token_review, token_verdict,
};
use sluice_upstream_cluster::confine::confine;
use sluice_upstream_cluster::spec::UpstreamCluster;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => review_answer(rest),
        1 => certificate(rest),
        2 => identity_headers(rest),
        3 => confined_path(rest),
        _ => review_request(rest),
    }
});

fn review_answer(data: &[u8]) {
    let Ok(answer) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let status = &answer["status"];
    if let Some(user) = token_verdict(&answer).user() {
        assert_eq!(status["authenticated"], Value::Bool(true));
        assert!(!user.name.is_empty());
        assert_eq!(
            status["user"]["username"].as_str(),
            Some(user.name.as_str())
        );
    }
    assert_eq!(
        access_allowed(&answer),
        status["allowed"] == Value::Bool(true)
    );
}

fn review_request(data: &[u8]) {
    let token = String::from_utf8_lossy(data);
    assert_eq!(
        token_review(&token)["spec"]["token"].as_str(),
        Some(&*token)
    );
}

fn certificate(data: &[u8]) {
    if let Ok(user) = user_from_certificate(data) {
        assert!(!user.name.is_empty());
    }
}

/// One `name: value` header per line.
fn identity_headers(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for line in data.split(|&byte| byte == b'\n') {
        let mut parts = line.splitn(2, |&byte| byte == b':');
        let (Some(name), value) = (parts.next(), parts.next().unwrap_or_default()) else {
            continue;
        };
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    strip_client_identity(&mut headers);
    strip_request_header_authentication(&mut headers);
    for name in headers.keys() {
        let spelled: String = name
            .as_str()
            .chars()
            .map(|c| {
                if c == '_' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        assert!(
            !spelled.starts_with("x-remote-") && !spelled.starts_with("impersonate-"),
            "identity header {name} left for upstream"
        );
    }
    assert!(!headers.contains_key(http::header::AUTHORIZATION));
}

/// A credentials directory with two files, a subdirectory and links leading in and out.
fn credentials_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("sluice-fuzz-confine-{}", std::process::id()));
        let dir = base.join("credentials");
        let outside = base.join("outside");
        std::fs::create_dir_all(dir.join("sub")).expect("credentials dir");
        std::fs::create_dir_all(&outside).expect("outside dir");
        for file in [
            dir.join("ca.pem"),
            dir.join("sub/token"),
            outside.join("secret"),
        ] {
            std::fs::write(file, b"x\n").expect("fixture file");
        }
        let link = |target: &Path, name: &str| {
            let _ = std::os::unix::fs::symlink(target, dir.join(name));
        };
        link(&outside, "out");
        link(&outside.join("secret"), "secret");
        link(Path::new("/etc/hostname"), "host");
        link(&dir.join("sub"), "in");
        dir
    })
}

const CLUSTER: &str = r#"{"apiVersion": "proxy.sluice.dev/v1alpha1", "kind": "UpstreamCluster",
  "metadata": {"name": "a"},
  "spec": {"servers": [{"endpoint": "https://10.0.0.1:6443"}],
           "secureServing": {"certFile": "ca.pem", "keyFile": "sub/token"}}}"#;

/// The path goes into `caFile`; the other fields name files inside.
fn confined_path(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if path.contains('\0') {
        return;
    }
    let mut cluster: UpstreamCluster = serde_json::from_str(CLUSTER).expect("fixture cluster");
    cluster.spec.client_config.ca_file = Some(PathBuf::from(path));
    let dir = credentials_dir();
    let problems = confine(&mut cluster, Some(dir));
    let real_dir = dir.canonicalize().expect("credentials dir resolves");
    let ca = cluster
        .spec
        .client_config
        .ca_file
        .as_ref()
        .expect("caFile kept");
    if problems.is_empty() {
        let real = ca.canonicalize().expect("an accepted file resolves");
        assert!(
            real.starts_with(&real_dir),
            "{path:?} accepted, resolves to {real:?}"
        );
    } else {
        assert!(problems
            .iter()
            .all(|(field, _)| field == "spec.clientConfig.caFile"));
    }
}
