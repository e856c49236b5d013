//! The `sluice-apiserver-sim` binary as the perf harness starts it: port 0, the bound address in
//! the addresses file, pods and tokens from the command line, curl as the client.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serves_pods_and_tokens_from_the_command_line() {
    let certs = test_support::Certificates::generate(&[]).unwrap();
    let addresses = certs.dir().join("addresses.json");
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_sluice-apiserver-sim"))
            .arg("--cert")
            .arg(&certs.server_cert)
            .arg("--key")
            .arg(&certs.server_key)
            .arg("--client-ca")
            .arg(&certs.ca_cert)
            .args(["--caller-token", "t0ken=perf-user"])
            .args(["--review-token", "t0ken=perf-user"])
            .args(["--pods", "perf=300", "--pods", "default=1"])
            .arg("--addresses-file")
            .arg(&addresses)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let address = loop {
        if let Ok(text) = std::fs::read_to_string(&addresses) {
            let map: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&text).unwrap();
            break map["https"].clone();
        }
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the simulator exited"
        );
        assert!(Instant::now() < deadline, "no addresses file");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!address.ends_with(":0"), "{address}");
    let curl = |token: &str, method: &str, path: &str, body: Option<&str>| {
        let mut command = Command::new("curl");
        command
            .args(["--silent", "--show-error", "--http2", "--max-time", "10"])
            .arg("--cacert")
            .arg(&certs.ca_cert)
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-X", method])
            .args(["--write-out", "\n%{http_code}"]);
        if let Some(body) = body {
            command.args(["-H", "Content-Type: application/json", "--data", body]);
        }
        let output = command
            .arg(format!("https://{address}{path}"))
            .output()
            .unwrap();
        assert!(output.status.success());
        let text = String::from_utf8(output.stdout).unwrap();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_string(), body.to_string())
    };
    let (code, body) = curl("t0ken", "GET", "/api/v1/namespaces/perf/pods", None);
    assert_eq!(code, "200");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 300);
    assert_eq!(list["items"][299]["metadata"]["name"], "pod-00299");
    assert!(body.len() > 60_000, "{}", body.len());
    let (code, _) = curl(
        "t0ken",
        "GET",
        "/api/v1/namespaces/default/pods/pod-00000",
        None,
    );
    assert_eq!(code, "200");
    assert_eq!(curl("wrong", "GET", "/api/v1/pods", None).0, "401");
    let review = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"t0ken"}}"#;
    let (code, body) = curl(
        "t0ken",
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        Some(review),
    );
    assert_eq!(code, "200");
    let review: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(review["status"]["authenticated"], true);
    assert_eq!(review["status"]["user"]["username"], "perf-user");
}
