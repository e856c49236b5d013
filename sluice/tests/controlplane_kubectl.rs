//! The control plane with kubectl as its client: every verb a user types, the refusals a user
//! must see (409 on a stale write, 422 with field paths), Tables and watches.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use test_support::{examples, wait_until, ControlPlane};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "kubectl failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn failed(output: Output) -> String {
    assert!(
        !output.status.success(),
        "kubectl should have failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// How long a `kubectl get -w` may take to list, or to print a change made meanwhile: generous
/// for a loaded 2-core CI, where both take well under a second.
const WATCH_WAIT: Duration = Duration::from_secs(15);

/// The lines a child prints, collected as they come by a thread, so a test can wait for one.
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn of(stdout: impl Read + Send + 'static) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                collected.lock().unwrap().push(line);
            }
        });
        Self(lines)
    }

    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Whether the lines printed so far satisfy `condition` within `timeout`.
    fn wait_for(&self, timeout: Duration, condition: impl Fn(&[String]) -> bool) -> bool {
        wait_until(timeout, || condition(&self.0.lock().unwrap()))
    }
}

/// `kubectl get uc -w` printing each cluster's health-check interval, once it has listed: from
/// then on, any change reaches it.
fn watch_intervals(cp: &ControlPlane) -> (std::process::Child, Lines) {
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig())
        .args([
            "get",
            "uc",
            "-w",
            "-o",
            "jsonpath={.spec.healthCheck.interval}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(watch.stdout.take().unwrap());
    let listed = lines.wait_for(WATCH_WAIT, |seen| !seen.is_empty());
    assert!(listed, "the watch never listed: {:?}", lines.seen());
    (watch, lines)
}

/// Sets cluster-a's health-check interval with a merge patch.
fn set_interval(cp: &ControlPlane, interval: &str) {
    let patch = format!(r#"{{"spec":{{"healthCheck":{{"interval":"{interval}"}}}}}}"#);
    ok(cp.kubectl(
        &[
            "patch",
            "uc",
            "cluster-a.example.com",
            "--type=merge",
            "-p",
            &patch,
        ],
        None,
    ));
}

#[test]
fn kubectl_manages_upstream_clusters_end_to_end() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let resources = ok(cp.kubectl(&["api-resources"], None));
    for line in [
        "upstreamclusters",
        "agents",
        "networkpolicies",
        "addressgroups",
        "appliedtogroups",
    ] {
        assert!(resources.contains(line), "{resources}");
    }
    assert!(
        resources.contains("uc ") && resources.contains("proxy.sluice.dev/v1alpha1"),
        "{resources}"
    );

    let created = ok(cp.kubectl(&["create", "-f", "-"], Some(examples::UPSTREAM_CLUSTER)));
    assert!(
        created.contains("upstreamcluster.proxy.sluice.dev/cluster-a.example.com created"),
        "{created}"
    );
    // apply twice: the first records the applied configuration, the second changes nothing.
    ok(cp.kubectl(&["apply", "-f", "-"], Some(examples::UPSTREAM_CLUSTER)));
    let version = ok(cp.kubectl(
        &[
            "get",
            "uc",
            "cluster-a.example.com",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    ));
    let again = ok(cp.kubectl(&["apply", "-f", "-"], Some(examples::UPSTREAM_CLUSTER)));
    assert!(again.contains("unchanged"), "{again}");
    let unchanged = ok(cp.kubectl(
        &[
            "get",
            "uc",
            "cluster-a.example.com",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        None,
    ));
    assert_eq!(version, unchanged, "a no-op apply must not write");

    // Table columns from the kind's printer columns.
    let table = ok(cp.kubectl(&["get", "upstreamclusters"], None));
    assert!(
        table.starts_with("NAME") && table.contains("SERVER") && table.contains("HOSTNAMES"),
        "{table}"
    );
    assert!(table.contains("https://10.0.0.1:6443"), "{table}");
    let yaml = ok(cp.kubectl(&["get", "uc", "cluster-a.example.com", "-o", "yaml"], None));
    for field in [
        "uid:",
        "creationTimestamp:",
        "generation:",
        "resourceVersion:",
        "endpoint: https://10.0.0.2:6443",
    ] {
        assert!(yaml.contains(field), "{field} missing in\n{yaml}");
    }

    // `get -w` sees a change another client makes.
    let (mut watch, lines) = watch_intervals(&cp);
    set_interval(&cp, "7s");
    ok(cp.kubectl(
        &[
            "patch",
            "uc",
            "cluster-a.example.com",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/healthCheck/interval","value":"9s"}]"#,
        ],
        None,
    ));
    let both = lines.wait_for(WATCH_WAIT, |seen| {
        seen.iter().any(|line| line.contains("7s")) && seen.iter().any(|line| line.contains("9s"))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(both, "the watch saw: {:?}", lines.seen());

    // A stale update: 409 Conflict.
    let stale = ok(cp.kubectl(&["get", "uc", "cluster-a.example.com", "-o", "json"], None));
    set_interval(&cp, "3s");
    let conflict = failed(cp.kubectl(&["replace", "-f", "-"], Some(&stale)));
    assert!(
        conflict.contains("Conflict") && conflict.contains("the object has been modified"),
        "{conflict}"
    );

    // An invalid object: 422 with the paths and reasons of the gateway's file loader.
    let invalid = failed(cp.kubectl(
        &[
            "patch",
            "uc",
            "cluster-a.example.com",
            "--type=merge",
            "-p",
            r#"{"spec":{"servers":[{"endpoint":"10.0.0.3:6443"}]}}"#,
        ],
        None,
    ));
    assert!(invalid.contains("is invalid"), "{invalid}");
    assert!(
        invalid.contains("spec.servers[0].endpoint")
            && invalid.contains("must start with https://"),
        "{invalid}"
    );
    let unknown = failed(cp.kubectl(
        &["create", "-f", "-"],
        Some(&examples::UPSTREAM_CLUSTER.replace("servers:", "servres:")),
    ));
    assert!(unknown.contains("servres"), "{unknown}");

    // An agent server beside endpoint servers, named `agent:42` by a policy's subset.
    let behind_agent = examples::UPSTREAM_CLUSTER
        .replace(
            "  - endpoint: https://10.0.0.2:6443\n",
            "  - agent: {id: 42}\n",
        )
        .replace(
            "upsteamSubset: [https://10.0.0.2:6443]",
            "upsteamSubset: [agent:42]",
        );
    ok(cp.kubectl(&["apply", "-f", "-"], Some(&behind_agent)));
    let agent = ok(cp.kubectl(
        &[
            "get",
            "uc",
            "cluster-a.example.com",
            "-o",
            "jsonpath={.spec.servers[1].agent.id}",
        ],
        None,
    ));
    assert_eq!(agent, "42");
    // 422 Invalid Statuses naming the field, as the gateway's loader does.
    for (server, field, reason) in [
        (
            "agent: {id: 0}",
            "spec.servers[1].agent.id",
            "must be at least 1",
        ),
        (
            "agent: {id: 42}\n    endpoint: https://10.0.0.9:6443",
            "spec.servers[1]",
            "set exactly one of endpoint",
        ),
    ] {
        let refused = failed(cp.kubectl(
            &["apply", "-f", "-"],
            Some(&behind_agent.replace("agent: {id: 42}", server)),
        ));
        assert!(
            refused.contains("is invalid") && refused.contains(field) && refused.contains(reason),
            "{refused}"
        );
    }

    let deleted = ok(cp.kubectl(&["delete", "uc", "cluster-a.example.com"], None));
    assert!(deleted.contains("deleted"), "{deleted}");
    let empty = cp.kubectl(&["get", "uc"], None);
    assert!(
        String::from_utf8_lossy(&empty.stderr).contains("No resources found"),
        "{empty:?}"
    );
}

#[test]
fn kubectl_serves_the_policy_and_agent_kinds() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let all = format!(
        "{}\n---\n{}\n---\n{}",
        examples::APPLIED_TO_GROUP,
        examples::NETWORK_POLICY,
        examples::ADDRESS_GROUP
    );
    let created = ok(cp.kubectl(&["create", "-f", "-"], Some(&all)));
    assert_eq!(created.matches(" created").count(), 3, "{created}");
    let table = ok(cp.kubectl(&["get", "vmnp"], None));
    assert!(
        table.contains("PRIORITY") && table.contains("web"),
        "{table}"
    );
    let agent = r#"{"apiVersion":"tunnel.sluice.dev/v1alpha1","kind":"Agent","metadata":{"name":"agent-7"},"spec":{"id":7,"tokenSha256":"0000000000000000000000000000000000000000000000000000000000000000"}}"#;
    ok(cp.kubectl(&["create", "-f", "-"], Some(agent)));
    let bad = failed(
        cp.kubectl(
            &["create", "-f", "-"],
            Some(
                &agent
                    .replace("agent-7", "agent-8")
                    .replace("\"id\":7", "\"id\":0"),
            ),
        ),
    );
    assert!(
        bad.contains("spec.id") && bad.contains("must be at least 1"),
        "{bad}"
    );
    // The status subresource: an admin may set it; a plain update does not change it.
    ok(cp.kubectl(
        &[
            "patch",
            "agent",
            "agent-7",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"nodes":{"node-1":{"connected":true}}}}"#,
        ],
        None,
    ));
    let nodes = ok(cp.kubectl(
        &["get", "agent", "agent-7", "-o", "jsonpath={.status.nodes}"],
        None,
    ));
    assert_eq!(nodes, r#"{"node-1":{"connected":true}}"#);
    ok(cp.kubectl(
        &[
            "patch",
            "agent",
            "agent-7",
            "--type=merge",
            "-p",
            r#"{"status":{"nodes":{"forged":{"connected":true}}}}"#,
        ],
        None,
    ));
    let nodes = ok(cp.kubectl(
        &["get", "agent", "agent-7", "-o", "jsonpath={.status.nodes}"],
        None,
    ));
    assert_eq!(nodes, r#"{"node-1":{"connected":true}}"#);
}

/// A collection DELETE while other clients keep writing the selected objects: each object
/// changed between the list and its delete is still deleted (read again, as a single DELETE
/// retries a conflict), none is skipped and left behind.
#[test]
fn a_collection_delete_removes_objects_written_meanwhile() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    const OBJECTS: usize = 120;
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    for n in 1..=OBJECTS {
        let agent = format!(
            r#"{{"apiVersion":"tunnel.sluice.dev/v1alpha1","kind":"Agent","metadata":{{"name":"race-{n}","labels":{{"race":"victim"}}}},"spec":{{"id":{n},"tokenSha256":"{}"}}}}"#,
            "0".repeat(64)
        );
        let (code, body) = cp.curl(
            "POST",
            "/apis/tunnel.sluice.dev/v1alpha1/agents",
            Some(&agent),
        );
        assert_eq!(code, 201, "{body}");
    }

    let cp = Arc::new(cp);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..3)
        .map(|writer| {
            let (cp, stop, written) = (cp.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut round = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let n = (round * 7 + writer * 41) % OBJECTS + 1;
                    let patch =
                        format!(r#"{{"metadata":{{"labels":{{"round":"{writer}-{round}"}}}}}}"#);
                    let path = format!("/apis/tunnel.sluice.dev/v1alpha1/agents/race-{n}");
                    let (code, _) =
                        cp.curl_as("PATCH", &path, "application/merge-patch+json", Some(&patch));
                    if code == 200 {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while written.load(Ordering::Relaxed) < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writers wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let selector = "/apis/tunnel.sluice.dev/v1alpha1/agents?labelSelector=race%3Dvictim";
    let (code, body) = cp.curl("DELETE", selector, None);
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let removed = answer["items"].as_array().unwrap().len();
    let (_, left) = cp.curl("GET", selector, None);
    let left: serde_json::Value = serde_json::from_str(&left).unwrap();
    let left: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|item| item["metadata"]["name"].as_str())
        .collect();
    assert!(
        left.is_empty(),
        "left behind by the collection delete: {left:?}"
    );
    assert_eq!(removed, OBJECTS, "every selected object is in the answer");
}

/// Binds the calling thread (and so the processes it spawns) to `cpu` alone; returns the mask
/// it had.
fn pin_this_thread(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity only read and write the masks
    // passed, sized by the length given.
    unsafe {
        let mut before: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(libc::sched_getaffinity(0, size, &mut before), 0);
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
        before
    }
}

#[test]
fn a_control_plane_pinned_to_one_cpu_runs_on_one_thread_and_serves_watches() {
    let before = pin_this_thread(0);
    let started = ControlPlane::start(BIN, &[]);
    // SAFETY: restores the mask `pin_this_thread` read, of the right size.
    let restored =
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &before) };
    assert_eq!(restored, 0);
    let cp = started.unwrap();
    let logged = wait_until(WATCH_WAIT, || {
        cp.process.stderr().contains("current_thread")
    });
    assert!(
        logged,
        "no current_thread runtime logged:\n{}",
        cp.process.stderr()
    );

    ok(cp.kubectl(&["create", "-f", "-"], Some(examples::UPSTREAM_CLUSTER)));
    let (mut watch, lines) = watch_intervals(&cp);
    set_interval(&cp, "7s");
    let seen = lines.wait_for(WATCH_WAIT, |seen| {
        seen.iter().any(|line| line.contains("7s"))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "the watch saw: {:?}", lines.seen());
}
