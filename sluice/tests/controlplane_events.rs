//! Events and access reviews with real kubectl (issue 35 finding 10): a VM's state changes
//! show in `kubectl describe vm` and `kubectl get events` (Normal, then Warning when its agent
//! goes quiet), a refused write (invalid, over a write budget) is a Warning whose repeats count
//! up in one event, events are selected by `involvedObject` fields and watched, and only the
//! admin reads them; `kubectl auth can-i` answers for each role what the server then does.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use test_support::{kubectl_with, wait_until, ControlPlane, CurlWatch};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const EVENTS: &str = "/api/v1/namespaces/default/events";
/// Events are written within a quarter second; generous for a loaded 2-core CI.
const WITHIN: Duration = Duration::from_secs(10);

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn ok(output: Output) -> String {
    assert!(output.status.success(), "kubectl failed: {output:?}");
    stdout(&output)
}

/// The events of the default namespace selected by `selector`.
fn events(cp: &ControlPlane, selector: &str) -> Vec<Value> {
    let args = ["get", "events", "--field-selector", selector, "-o", "json"];
    let list: Value = serde_json::from_str(&ok(cp.kubectl(&args, None))).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// One runtime-info report of vm1's agent (a merge patch naming `version`: a patch that changes
/// nothing writes nothing), as its HTTP status.
fn report(cp: &ControlPlane, token: &str, version: usize) -> u16 {
    let output = Command::new("curl")
        .args([
            "--silent",
            "--output",
            "/dev/null",
            "--write-out",
            "%{http_code}",
        ])
        .arg("--cacert")
        .arg(cp.ca_file())
        .args(["--request", "PATCH", "--header"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["--header", "Content-Type: application/merge-patch+json"])
        .arg("--data-binary")
        .arg(format!(r#"{{"agentVersion": "budget-{version}"}}"#))
        .arg(format!(
            "{}/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos/vm1",
            cp.url()
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).parse().unwrap()
}

#[test]
fn vm_transitions_and_refused_writes_are_events_kubectl_shows() {
    // A 2 s heartbeat timeout lets the test see the agent go quiet without waiting 90 s; a
    // vm-agent may write once a second (burst 1), so three writes at once meet its budget.
    let cp = ControlPlane::start(
        BIN,
        &[
            "--vm-heartbeat-timeout",
            "2s",
            "--write-budget",
            "vm-agent=1/1,16384/524288",
        ],
    )
    .unwrap();
    let watch = CurlWatch::start(
        &cp,
        &cp.admin_token(),
        &format!("{EVENTS}?watch=1&fieldSelector=involvedObject.name%3Dvm1"),
    )
    .unwrap();
    let agent = cp.connect_vm("vm1");
    let vm: Value =
        serde_json::from_str(&ok(cp.kubectl(&["get", "vm", "vm1", "-o", "json"], None))).unwrap();
    let uid = vm["metadata"]["uid"].as_str().unwrap().to_string();

    // kubectl describe selects by name, namespace (empty: the VM is cluster-scoped), kind, uid.
    let described = wait_until(WITHIN, || {
        let text = stdout(&cp.kubectl(&["describe", "vm", "vm1"], None));
        text.contains("Normal  HeartbeatReceived")
            && text.contains("vm-manager  state AgentedBootstrap -> AgentedConnected")
            && text.contains("Normal  NeverReported")
    });
    assert!(
        described,
        "{}",
        stdout(&cp.kubectl(&["describe", "vm", "vm1"], None))
    );
    let listed = ok(cp.kubectl(&["get", "events"], None));
    assert!(listed.contains("HeartbeatReceived"), "{listed}");
    let selector = format!(
        "involvedObject.name=vm1,involvedObject.namespace=,involvedObject.kind=VirtualMachine,\
         involvedObject.uid={uid},reason=HeartbeatReceived"
    );
    let connected = events(&cp, &selector);
    assert_eq!(connected.len(), 1, "{connected:?}");
    let event = &connected[0];
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["count"], 1);
    assert_eq!(event["source"]["component"], "vm-manager");
    assert_eq!(event["firstTimestamp"], event["lastTimestamp"]);
    assert!(events(&cp, "involvedObject.uid=someone-else").is_empty());
    let refused = cp.kubectl(
        &["get", "vm", "--field-selector", "involvedObject.name=vm1"],
        None,
    );
    assert!(String::from_utf8_lossy(&refused.stderr)
        .contains("field label not supported: involvedObject.name"));

    // The agent stops reporting: after the 2 s timeout a Warning.
    let quiet = wait_until(WITHIN, || {
        !events(
            &cp,
            "involvedObject.name=vm1,type=Warning,reason=HeartbeatMissed",
        )
        .is_empty()
    });
    assert!(quiet, "{}", ok(cp.kubectl(&["get", "events"], None)));
    // The watch saw every event of vm1 as it was added.
    let mut reasons = Vec::new();
    while let Some(event) = watch.next_event(Duration::from_millis(500)) {
        assert_eq!(event["type"], "ADDED", "{event}");
        reasons.push(event["object"]["reason"].as_str().unwrap().to_string());
    }
    assert_eq!(
        reasons,
        ["NeverReported", "HeartbeatReceived", "HeartbeatMissed"]
    );

    // The same invalid write three times: one Warning event counting 3.
    let invalid = r#"{"apiVersion": "vm.sluice.dev/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "vm9"}, "spec": {"management": "Bogus"}}"#;
    for _ in 0..3 {
        let (code, _) = cp.curl(
            "POST",
            "/apis/vm.sluice.dev/v1alpha1/virtualmachines",
            Some(invalid),
        );
        assert_eq!(code, 422);
    }
    let counted = wait_until(WITHIN, || {
        events(&cp, "involvedObject.name=vm9,reason=Invalid")
            .first()
            .is_some_and(|event| event["count"] == 3)
    });
    let refusals = events(&cp, "involvedObject.name=vm9");
    assert!(counted, "{refusals:?}");
    assert_eq!(refusals.len(), 1);
    assert_eq!(refusals[0]["type"], "Warning");
    let message = refusals[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("create by \"sluice:admin:")
            && message.contains("spec.management: Unsupported value: \"Bogus\""),
        "{message}"
    );

    // The agent over its write budget: a Warning on its runtime info, repeats counted.
    let codes: Vec<u16> = (0..3).map(|version| report(&cp, &agent, version)).collect();
    assert!(codes.contains(&429), "{codes:?}");
    let over = wait_until(WITHIN, || {
        !events(&cp, "involvedObject.name=vm1,reason=WriteBudgetExceeded").is_empty()
    });
    assert!(over, "{}", ok(cp.kubectl(&["get", "events"], None)));
    let budget = &events(&cp, "involvedObject.name=vm1,reason=WriteBudgetExceeded")[0];
    assert_eq!(budget["type"], "Warning");
    assert_eq!(
        budget["involvedObject"]["kind"],
        "VirtualMachineRuntimeInfo"
    );
    assert!(budget["message"]
        .as_str()
        .unwrap()
        .starts_with("patch by \"sluice:vm-agent:vm1\" refused: too many writes"));

    // Only the admin reads events: a gateway is refused as kube-apiserver words it.
    let gateway = cp.kubeconfig_for("gw", &cp.token("gateway", "gw-1"));
    let output = kubectl_with(&gateway, &["get", "events"], None);
    assert!(String::from_utf8_lossy(&output.stderr).contains(
        "events is forbidden: User \"sluice:gateway:gw-1\" cannot list resource \"events\" \
         in API group \"\" in the namespace \"default\""
    ));
}

/// What `kubectl auth can-i` prints for each role, and that the server then does just that.
#[test]
fn kubectl_auth_can_i_answers_for_each_role() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    cp.connect_vm("vm1");
    let users = [
        ("admin", cp.kubeconfig()),
        (
            "gateway",
            cp.kubeconfig_for("gw", &cp.token("gateway", "gw-1")),
        ),
        ("node", cp.kubeconfig_for("node", &cp.token("node", "n-1"))),
        (
            "vm-agent",
            cp.kubeconfig_for("vm1", &cp.token("vm-agent", "vm1")),
        ),
    ];
    let can_i = |role: &str, args: &[&str]| {
        let kubeconfig = &users.iter().find(|(name, _)| *name == role).unwrap().1;
        let mut full = vec!["auth", "can-i"];
        full.extend(args);
        let output = kubectl_with(kubeconfig, &full, None);
        // "yes", or "no" with " - " and the server's reason.
        let said = stdout(&output);
        said.split([' ', '\n']).next().unwrap_or("").to_string()
    };
    for (role, args, answer) in [
        ("admin", &["delete", "upstreamclusters"][..], "yes"),
        ("admin", &["*", "*"], "yes"),
        ("admin", &["list", "events"], "yes"),
        ("gateway", &["watch", "upstreamclusters"], "yes"),
        (
            "gateway",
            &["patch", "upstreamclusters/a", "--subresource=status"],
            "yes",
        ),
        ("gateway", &["delete", "upstreamclusters/a"], "no"),
        ("gateway", &["list", "agents"], "no"),
        ("gateway", &["list", "events"], "no"),
        ("node", &["list", "agents"], "yes"),
        ("node", &["create", "agents"], "no"),
        ("node", &["create", "events"], "no"),
        ("vm-agent", &["get", "virtualmachines/vm1"], "yes"),
        ("vm-agent", &["get", "virtualmachines/vm2"], "no"),
        ("vm-agent", &["update", "virtualmachines/vm1"], "no"),
        ("vm-agent", &["watch", "networkpolicies"], "yes"),
        (
            "vm-agent",
            &["update", "virtualmachineruntimeinfos/vm1"],
            "yes",
        ),
        (
            "vm-agent",
            &["delete", "virtualmachineruntimeinfos/vm1"],
            "no",
        ),
        ("vm-agent", &["get", "/metrics"], "yes"),
    ] {
        assert_eq!(can_i(role, args), answer, "{role} can-i {args:?}");
    }
    // The answers hold for the requests themselves.
    let (_, gateway) = &users[1];
    assert!(kubectl_with(gateway, &["get", "upstreamclusters"], None)
        .status
        .success());
    assert!(!kubectl_with(gateway, &["get", "agents"], None)
        .status
        .success());
    let (_, agent) = &users[3];
    assert!(kubectl_with(agent, &["get", "vm", "vm1"], None)
        .status
        .success());
    let other = kubectl_with(agent, &["get", "vm", "vm2"], None);
    assert!(String::from_utf8_lossy(&other.stderr).contains("forbidden"));

    let listed = stdout(&kubectl_with(agent, &["auth", "can-i", "--list"], None));
    let row = |resource: &str| {
        listed
            .lines()
            .find(|line| line.starts_with(resource))
            .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    assert_eq!(
        row("virtualmachineruntimeinfos.vm.sluice.dev").as_deref(),
        Some("virtualmachineruntimeinfos.vm.sluice.dev [] [vm1] [get create update patch]")
    );
    assert_eq!(
        row("networkpolicies.policy.sluice.dev").as_deref(),
        Some("networkpolicies.policy.sluice.dev [] [] [get list watch]")
    );
    assert!(row("upstreamclusters").is_none(), "{listed}");
    let admin = stdout(&cp.kubectl(&["auth", "can-i", "--list"], None));
    assert!(
        admin.lines().any(|line| line.starts_with("*.* ")),
        "{admin}"
    );
}
