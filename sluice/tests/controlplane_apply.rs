//! Server-side apply with real kubectl (`kubectl apply --server-side`) and curl: field
//! managers, a second manager's conflict naming the field, `--force-conflicts` moving the
//! ownership, fields a manager stops applying removed, updates owning what they change.
#![allow(clippy::unwrap_used)]

use std::process::Output;

use serde_json::Value;
use test_support::ControlPlane;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const NAME: &str = "ssa.example.com";
const PATH: &str = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters/ssa.example.com";

/// The first manager's file: a label, one server, the gateway's files, a health check.
const FIRST: &str = r#"
apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata:
  name: ssa.example.com
  labels: {team: a}
spec:
  servers:
  - endpoint: https://10.0.0.1:6443
  clientConfig: {certFile: gateway.pem, keyFile: gateway-key.pem}
  secureServing: {certFile: serving.pem, keyFile: serving-key.pem}
  healthCheck: {interval: 5s}
"#;

/// The second manager's file: only the health check's interval, changed.
const OTHER: &str = r#"
apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata: {name: ssa.example.com}
spec:
  healthCheck: {interval: 9s}
"#;

fn run(cp: &ControlPlane, args: &[&str], stdin: &str) -> Output {
    cp.kubectl(args, Some(stdin))
}

fn ok(output: Output) -> String {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "kubectl failed: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

fn object(cp: &ControlPlane) -> Value {
    let args = ["get", "uc", NAME, "-o", "json", "--show-managed-fields"];
    serde_json::from_str(&ok(cp.kubectl(&args, None))).unwrap()
}

/// `manager` -> (operation, fieldsV1) of each managedFields entry.
fn owners(object: &Value) -> Vec<(String, String, Value)> {
    object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["manager"].as_str().unwrap().to_string(),
                entry["operation"].as_str().unwrap().to_string(),
                entry["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn fields_of(object: &Value, manager: &str) -> Value {
    owners(object)
        .into_iter()
        .find(|(name, _, _)| name == manager)
        .map(|(_, _, fields)| fields)
        .unwrap_or(Value::Null)
}

#[test]
fn kubectl_server_side_apply_owns_conflicts_forces_and_prunes() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let apply = ["apply", "--server-side", "-f", "-"];
    assert!(ok(run(&cp, &apply, FIRST)).contains("serverside-applied"));
    let created = object(&cp);
    assert_eq!(
        owners(&created)
            .iter()
            .map(|(m, op, _)| (m.as_str(), op.as_str()))
            .collect::<Vec<_>>(),
        [("kubectl", "Apply")]
    );
    assert_eq!(
        fields_of(&created, "kubectl")["f:spec"]["f:healthCheck"],
        serde_json::json!({".": {}, "f:interval": {}})
    );
    ok(run(&cp, &apply, FIRST));
    assert_eq!(
        object(&cp)["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"],
        "a repeated apply writes nothing"
    );

    // A second manager changing a field the first owns: refused, the field named.
    let other = ["apply", "--server-side", "--field-manager=other", "-f", "-"];
    let refused = run(&cp, &other, OTHER);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl": .spec.healthCheck.interval"#
        ),
        "{stderr}"
    );
    assert_eq!(object(&cp)["spec"]["healthCheck"]["interval"], "5s");

    // A server-side dry run of the forced apply answers and writes nothing.
    let dry = [
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        "-",
    ];
    ok(run(&cp, &dry, OTHER));
    assert_eq!(object(&cp)["spec"]["healthCheck"]["interval"], "5s");

    // Forced, the value and the field's ownership move to it.
    let forced = [
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        "-",
    ];
    ok(run(&cp, &forced, OTHER));
    let taken = object(&cp);
    assert_eq!(taken["spec"]["healthCheck"]["interval"], "9s");
    assert_eq!(
        fields_of(&taken, "other"),
        serde_json::json!({"f:spec": {"f:healthCheck": {".": {}, "f:interval": {}}}})
    );
    let kubectl_health = &fields_of(&taken, "kubectl")["f:spec"]["f:healthCheck"];
    assert_eq!(
        *kubectl_health,
        serde_json::json!({}),
        "kubectl keeps only the map entry"
    );

    // The first manager drops its label and health check from its file: the label, which
    // only it owned, goes; the health check stays, the other manager owns it.
    let fewer = FIRST
        .replace("  labels: {team: a}\n", "")
        .replace("  healthCheck: {interval: 5s}\n", "");
    ok(run(&cp, &apply, &fewer));
    let pruned = object(&cp);
    assert!(pruned["metadata"].get("labels").is_none(), "{pruned}");
    assert_eq!(pruned["spec"]["healthCheck"]["interval"], "9s");
    assert!(fields_of(&pruned, "kubectl").get("f:metadata").is_none());
}

#[test]
fn an_update_owns_what_it_changed_and_a_later_apply_gets_a_409_status_per_field() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    ok(run(&cp, &["apply", "--server-side", "-f", "-"], FIRST));
    let patch = r#"{"spec": {"servers": [{"endpoint": "https://10.0.0.9:6443"}]}}"#;
    ok(cp.kubectl(&["patch", "uc", NAME, "--type=merge", "-p", patch], None));
    let patched = object(&cp);
    assert_eq!(
        owners(&patched)
            .iter()
            .map(|(m, op, _)| (m.as_str(), op.as_str()))
            .collect::<Vec<_>>(),
        [("kubectl", "Apply"), ("kubectl-patch", "Update")]
    );

    let apply = "application/apply-patch+yaml";
    let (code, body) = cp.curl_as(
        "PATCH",
        &format!("{PATH}?fieldManager=kubectl"),
        apply,
        Some(FIRST),
    );
    assert_eq!(code, 409, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using proxy.sluice.dev/v1alpha1: .spec.servers"
    );
    assert_eq!(
        status["details"]["causes"],
        serde_json::json!([{"reason": "FieldManagerConflict", "field": ".spec.servers",
            "message": "conflict with \"kubectl-patch\" using proxy.sluice.dev/v1alpha1"}])
    );

    // No field manager: kube's 422 on the PatchOptions; a body that is no object: 400.
    let (code, body) = cp.curl_as("PATCH", PATH, apply, Some(FIRST));
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("fieldManager: Required value: is required for apply patch"),
        "{body}"
    );
    let (code, _) = cp.curl_as(
        "PATCH",
        &format!("{PATH}?fieldManager=x"),
        apply,
        Some("- 1\n"),
    );
    assert_eq!(code, 400);

    // Forced over curl with a YAML body: the servers are the applier's again.
    let forced = format!("{PATH}?fieldManager=kubectl&force=true");
    let (code, body) = cp.curl_as("PATCH", &forced, apply, Some(FIRST));
    assert_eq!(code, 200, "{body}");
    let now = object(&cp);
    assert_eq!(
        now["spec"]["servers"][0]["endpoint"],
        "https://10.0.0.1:6443"
    );
    assert_eq!(
        owners(&now).len(),
        1,
        "kubectl-patch owned nothing else: {now}"
    );
}

#[test]
fn kubectl_moves_from_client_side_to_server_side_apply() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    ok(run(&cp, &["apply", "-f", "-"], FIRST));
    let managers = |object: &Value| -> Vec<String> {
        owners(object)
            .into_iter()
            .map(|(m, op, _)| format!("{m}/{op}"))
            .collect()
    };
    assert_eq!(managers(&object(&cp)), ["kubectl-client-side-apply/Update"]);
    // kubectl rewrites the client-side apply's entry (a JSON patch of managedFields): the
    // server takes a list that decodes, so the fields become the server-side applier's.
    ok(run(&cp, &["apply", "--server-side", "-f", "-"], FIRST));
    let moved = managers(&object(&cp));
    assert!(moved.contains(&"kubectl/Apply".to_string()), "{moved:?}");
    assert!(
        !moved
            .iter()
            .any(|m| m.starts_with("kubectl-client-side-apply")),
        "{moved:?}"
    );
}
