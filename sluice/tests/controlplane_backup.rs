//! docs/OPERATIONS.md, "Backing up and restoring the control-plane store", run as written on a
//! real control plane (embedded store) with a gateway watching it: back up (stop, copy the data
//! directory, start), change things, restore (stop, put the copy back, start). The objects are
//! then exactly the backed-up ones, the backed-up tokens authenticate and the later one does
//! not, and the gateway, restarted as the section says, serves exactly the restored clusters.
//! The export path (`kubectl get -o yaml`, a `v1` `List`, `kubectl apply -f` of it into an
//! empty control plane) keeps every object's spec.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::fed_gateway::{cluster_json, start_fed_gateway, status_via};
use serde_json::Value;
use test_support::{examples, wait_until, ApiServer, Certificates, ControlPlane, SluiceProcess};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The kinds the section's export names, with the tokens (backed up with the data directory).
const KINDS: &str =
    "upstreamclusters,agents,networkpolicies,addressgroups,appliedtogroups,virtualmachines,tokens";
/// The export the section documents (without the tokens: it says they are not kept).
const EXPORTED: &str =
    "upstreamclusters,agents,networkpolicies,addressgroups,appliedtogroups,virtualmachines";
const ZERO_SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The gateway's roles retry within a second; 10 s is generous for this 2-core machine.
const SERVED_WITHIN: Duration = Duration::from_secs(10);

fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let output = cp.kubectl(args, stdin);
    assert!(output.status.success(), "kubectl {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Every object of [`KINDS`], whole (metadata, spec and status), sorted by kind and name.
fn all_objects(cp: &ControlPlane) -> Vec<Value> {
    items(&kubectl_ok(cp, &["get", KINDS, "-A", "-o", "json"], None))
}

fn items(json: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(json).unwrap();
    let mut items = list["items"].as_array().unwrap().clone();
    items.sort_by_key(|item| {
        (
            item["kind"].to_string(),
            item["metadata"]["name"].to_string(),
        )
    });
    items
}

/// `cp -a` of a directory's contents into another.
fn copy_contents(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from.join("."))
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// The API answer to `token` listing the clusters: the HTTP status.
fn authenticates(cp: &ControlPlane, token: &str) -> u16 {
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
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!(
            "{}/apis/proxy.sluice.dev/v1alpha1/upstreamclusters",
            cp.url()
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn the_documented_backup_and_restore_bring_back_the_objects_tokens_and_roles() {
    let certs = Certificates::generate(&["one.sluice.test", "two.sluice.test"]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let alice = certs.client("alice", &["dev"]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let mut cp = ControlPlane::start(BIN, &[]).unwrap();
    let policy = [
        examples::APPLIED_TO_GROUP,
        examples::NETWORK_POLICY,
        examples::ADDRESS_GROUP,
    ];
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&policy.join("\n---\n")));
    let one = cluster_json("one.sluice.test", &certs, &identity, &server);
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&one));
    let agent = serde_json::json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "agent-7"}, "spec": {"id": 7, "tokenSha256": ZERO_SHA}});
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&agent.to_string()));
    let gateway_token = cp.token("gateway", "gw-1");
    let mut gateway = start_fed_gateway(&cp, "gw-1", &gateway_token, certs.dir());
    let serves =
        |gateway: &SluiceProcess, host: &str| status_via(gateway, host, &certs, &alice) == 200;
    assert!(
        wait_until(SERVED_WITHIN, || serves(&gateway, "one.sluice.test")),
        "the gateway never served cluster one; stderr:\n{}",
        gateway.stderr()
    );

    // The gateway reports its servers' health once; read the objects after it did, so that
    // nothing writes between this read and the backup.
    let reported = || {
        let path = "jsonpath={.status.gateways.gw-1.servers[0].healthy}";
        let output = cp.kubectl(&["get", "uc", "one.sluice.test", "-o", path], None);
        output.stdout == b"true"
    };
    assert!(wait_until(SERVED_WITHIN, reported), "{}", gateway.stderr());

    // Back up: stop, copy the whole data directory, start.
    let before = all_objects(&cp);
    let backup = tempfile::tempdir().unwrap();
    cp.stop();
    copy_contents(cp.data_dir(), backup.path());
    cp.restart().unwrap();
    assert_eq!(
        all_objects(&cp),
        before,
        "a stop and start changed the objects"
    );

    // Changes after the backup; the running gateway follows them (it re-opened its watches).
    let two = cluster_json("two.sluice.test", &certs, &identity, &server);
    kubectl_ok(&cp, &["create", "-f", "-"], Some(&two));
    kubectl_ok(&cp, &["delete", "networkpolicies", "--all"], None);
    kubectl_ok(&cp, &["delete", "agent", "agent-7"], None);
    let later_token = cp.token("gateway", "gw-later");
    assert!(
        wait_until(SERVED_WITHIN, || serves(&gateway, "two.sluice.test")),
        "the gateway did not resume after the backup's stop; stderr:\n{}",
        gateway.stderr()
    );
    assert_ne!(all_objects(&cp), before);

    // Restore: stop, put the copied directory back, start.
    cp.stop();
    std::fs::remove_dir_all(cp.data_dir()).unwrap();
    std::fs::create_dir(cp.data_dir()).unwrap();
    copy_contents(backup.path(), cp.data_dir());
    cp.restart().unwrap();
    assert_eq!(
        all_objects(&cp),
        before,
        "the restored objects differ from the backed-up ones"
    );
    assert_eq!(authenticates(&cp, &gateway_token), 200, "a backed-up token");
    assert_eq!(
        authenticates(&cp, &later_token),
        401,
        "a token issued after the backup"
    );

    // The section says to restart the roles that watch after a restore.
    drop(gateway);
    gateway = start_fed_gateway(&cp, "gw-1", &gateway_token, certs.dir());
    assert!(
        wait_until(SERVED_WITHIN, || serves(&gateway, "one.sluice.test")),
        "the restarted gateway never served cluster one; stderr:\n{}",
        gateway.stderr()
    );
    assert_eq!(
        status_via(&gateway, "two.sluice.test", &certs, &alice),
        0,
        "a cluster created after the backup is still served"
    );

    the_export_applies_to_an_empty_control_plane(&cp);
}

/// `kubectl get ... -o yaml` of the documented kinds (one `v1` `List`), `kubectl apply -f` of
/// that file as written into a new control plane: the same objects by kind, name and spec (the
/// section says revisions are not kept). The server still validates each item of a List.
fn the_export_applies_to_an_empty_control_plane(cp: &ControlPlane) {
    let exported = kubectl_ok(cp, &["get", EXPORTED, "-A", "-o", "yaml"], None);
    assert!(exported.starts_with("apiVersion: v1\n"), "{exported}");
    assert!(exported.contains("\nkind: List\n"), "{exported}");
    let fresh = ControlPlane::start(BIN, &[]).unwrap();
    kubectl_ok(&fresh, &["apply", "-f", "-"], Some(&exported));
    let json = |cp: &ControlPlane| {
        items(&kubectl_ok(
            cp,
            &["get", EXPORTED, "-A", "-o", "json"],
            None,
        ))
        .into_iter()
        .map(|item| {
            serde_json::json!({"kind": item["kind"], "name": item["metadata"]["name"],
                    "spec": item["spec"]})
        })
        .collect::<Vec<_>>()
    };
    let original = json(cp);
    assert_eq!(original.len(), 5, "{original:?}");
    assert_eq!(json(&fresh), original);
    // The server still validates each item (kubectl's client-side check of a List has no
    // schemas to check it against): an unknown field is refused, naming it.
    let unknown =
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: tunnel.sluice.dev/v1alpha1\n  \
                   kind: Agent\n  metadata: {name: agent-8}\n  spec: {id: 8, colour: blue}\n";
    let refused = fresh.kubectl(&["apply", "-f", "-"], Some(unknown));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unknown field \"spec.colour\""),
        "{refused:?}"
    );
}
