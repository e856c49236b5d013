//! The control plane's authorization matrix over real HTTPS: each role's token tried with every
//! verb against every served kind (the eight of `controlplane_auth/kinds.rs`) and every status
//! subresource; what a role must not do is 403 with a kube-style `Status` naming the user, the
//! verb and the resource, what it may do succeeds; no credentials or an unknown token is 401. And a vm-agent reads exactly its VM's span, followed as groups change.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{json, Value};

use test_support::{examples, kubectl_with, ControlPlane, CurlWatch};

#[path = "controlplane_auth/kinds.rs"]
mod kinds;

use kinds::{assert_forbidden, call, kinds, request, Answer, Kind, VERBS, ZERO_SHA};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let output = cp.kubectl(args, stdin);
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The test-support examples, an agent and a token object, and policy objects of vm2 only.
fn populate(cp: &ControlPlane) {
    let all = [
        examples::UPSTREAM_CLUSTER,
        examples::APPLIED_TO_GROUP,
        examples::NETWORK_POLICY,
        examples::ADDRESS_GROUP,
    ]
    .join("\n---\n");
    kubectl_ok(cp, &["create", "-f", "-"], Some(&all));
    let mut others = vec![
        json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": "agent-7"}, "spec": {"id": 7, "tokenSha256": ZERO_SHA}}),
        json!({"apiVersion": "auth.sluice.dev/v1alpha1", "kind": "Token",
            "metadata": {"name": "matrix-existing"},
            "spec": {"role": "gateway", "subject": "existing", "tokenSha256": ZERO_SHA}}),
    ];
    others.extend(vm2_objects());
    for object in others {
        kubectl_ok(cp, &["create", "-f", "-"], Some(&object.to_string()));
    }
    // Agents receive their span only while their VM is AgentedConnected.
    cp.connect_vm("vm1");
    cp.connect_vm("vm2");
}

/// A group, a policy applied to it and the address group it names, all in vm2's span only.
fn vm2_objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "policy.sluice.dev/v1alpha1", "kind": "AppliedToGroup",
            "metadata": {"name": "db-vms"},
            "spec": {"members": [{"name": "vm2-eth0", "vm": "vm2", "ofport": 1, "ips": ["10.0.0.20"]}]}}),
        json!({"apiVersion": "policy.sluice.dev/v1alpha1", "kind": "NetworkPolicy",
            "metadata": {"name": "db"},
            "spec": {"namespace": "default", "priority": 20, "appliedTo": ["db-vms"],
                "rules": [{"name": "sql", "direction": "Ingress", "action": "Allow",
                    "peers": {"addressGroups": ["db-clients"]},
                    "services": [{"protocol": "TCP", "port": 5432}]}]}}),
        json!({"apiVersion": "policy.sluice.dev/v1alpha1", "kind": "AddressGroup",
            "metadata": {"name": "db-clients"}, "spec": {"members": ["10.0.5.0/24"]}}),
    ]
}

/// What a non-admin role's `verb` on the fixture's object of `kind` answers outside status,
/// per the RBAC table (docs/CONTROLPLANE.md): `None` is 403. A vm-agent's own runtime info
/// exists already, so its allowed create is 409 AlreadyExists and its allowed update (with a
/// stale resourceVersion) 409 Conflict: past authorization, refused by the store.
fn expected(role: &str, kind: &Kind, verb: &str) -> Option<u16> {
    let reads = matches!(verb, "get" | "list" | "watch");
    let allowed = match (role, kind.plural) {
        ("gateway", "upstreamclusters") | ("node", "agents") => reads,
        ("vm-agent", "virtualmachines") => reads,
        ("vm-agent", "virtualmachineruntimeinfos") => {
            return match verb {
                "get" | "patch" => Some(200),
                "create" | "update" => Some(409),
                _ => None,
            }
        }
        ("vm-agent", _) => kind.group == "policy.sluice.dev" && reads,
        ("gateway" | "node", _) => false,
        (other, _) => panic!("no role {other}"),
    };
    allowed.then_some(200)
}

#[test]
fn every_role_is_refused_what_it_may_not_do_and_allowed_what_it_may() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    populate(&cp);
    let kinds = kinds();
    let roles = [
        ("gateway", "gw-1"),
        ("node", "node-1"),
        ("vm-agent", "vm1"),
        ("admin", "ops"),
    ];
    let tokens: Vec<(&str, String, String)> = roles
        .iter()
        .map(|(role, subject)| {
            (
                *role,
                format!("sluice:{role}:{subject}"),
                cp.token(role, subject),
            )
        })
        .collect();

    // Each non-admin role in its own thread: every verb on every kind, then every status
    // subresource.
    std::thread::scope(|scope| {
        for (role, user, token) in &tokens[..3] {
            let (cp, kinds) = (&cp, &kinds);
            scope.spawn(move || {
                for kind in kinds {
                    role_on_kind(cp, role, user, token, kind);
                    if kind.status {
                        role_on_status(cp, role, user, token, kind);
                    }
                }
            });
        }
    });

    // The admin reads every status subresource; its status writes are the kubectl test's
    // (here they would race the gateway's, the node's and the VMManager's).
    let admin = &tokens[3].2;
    for kind in kinds.iter().filter(|kind| kind.status) {
        let path = format!("{}/status", kind.object(kind.existing));
        let answer = request(&cp, Some(admin), "GET", &path, None);
        assert_eq!(answer.code, 200, "admin get {path}: {answer:?}");
    }
    // The admin: every verb on every kind, on objects of its own.
    let admin = &tokens[3].2;
    for kind in &kinds {
        let what =
            |verb: &str, answer: &Answer| format!("admin {verb} {}: {answer:?}", kind.plural);
        let created = call(&cp, admin, kind, "create", "matrix-new");
        assert_eq!(created.code, 201, "{}", what("create", &created));
        for verb in ["get", "list", "watch"] {
            let answer = call(&cp, admin, kind, verb, "matrix-new");
            assert_eq!(answer.code, 200, "{}", what(verb, &answer));
        }
        let listed = call(&cp, admin, kind, "list", "");
        let listed = names(&listed.json());
        assert!(
            listed.iter().any(|name| name == "matrix-new")
                && listed.iter().any(|name| name == kind.existing),
            "{listed:?}"
        );
        // The VMManager writes a new NetworkPolicy's status: a PUT re-reads on 409, as
        // clients of a kind with a controller do.
        let mut updated = Answer {
            code: 0,
            body: String::new(),
        };
        for _ in 0..5 {
            let mut object = call(&cp, admin, kind, "get", "matrix-new").json();
            object["metadata"]["labels"] = json!({"touched": "put"});
            updated = request(
                &cp,
                Some(admin),
                "PUT",
                &kind.object("matrix-new"),
                Some(("application/json", &object)),
            );
            if updated.code != 409 {
                break;
            }
        }
        assert_eq!(updated.code, 200, "{}", what("update", &updated));
        let patched = call(&cp, admin, kind, "patch", "matrix-new");
        assert_eq!(patched.code, 200, "{}", what("patch", &patched));
        assert_eq!(patched.json()["metadata"]["labels"]["touched"], "yes");
        let deleted = call(&cp, admin, kind, "delete", "matrix-new");
        assert_eq!(deleted.code, 200, "{}", what("delete", &deleted));
        let gone = call(&cp, admin, kind, "get", "matrix-new");
        assert_eq!(gone.code, 404, "{}", what("get", &gone));
        let victim = kind.new_object("matrix-victim", json!({"matrix": "victim"}));
        let created = request(
            &cp,
            Some(admin),
            "POST",
            &kind.collection(),
            Some(("application/json", &victim)),
        );
        assert_eq!(created.code, 201, "{}", what("create", &created));
        let collected = call(&cp, admin, kind, "deletecollection", "");
        assert_eq!(
            collected.code,
            200,
            "{}",
            what("deletecollection", &collected)
        );
        let removed: Vec<Value> = collected.json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["metadata"]["name"].clone())
            .collect();
        assert_eq!(removed, vec![json!("matrix-victim")]);
        let existing = call(&cp, admin, kind, "get", kind.existing);
        assert_eq!(existing.code, 200, "{}", what("get", &existing));
    }
}

/// `role` tries every verb on `kind`'s fixture object: what the table allows answers as
/// [`expected`] says, the rest is 403 naming user, verb and resource. A vm-agent is also
/// refused another VM's objects.
fn role_on_kind(cp: &ControlPlane, role: &str, user: &str, token: &str, kind: &Kind) {
    for verb in VERBS {
        let answer = call(cp, token, kind, verb, kind.existing);
        match expected(role, kind, verb) {
            Some(code) => assert_eq!(
                answer.code, code,
                "{user} {verb} {}: {answer:?}",
                kind.plural
            ),
            None => assert_forbidden(&answer, user, verb, kind, ""),
        }
    }
    if role == "vm-agent" && kind.group == "vm.sluice.dev" {
        for verb in ["get", "create"] {
            let answer = call(cp, token, kind, verb, "vm2");
            assert_forbidden(&answer, user, verb, kind, "");
        }
    }
}

/// `role` on `kind`'s `status` subresource: the gateway's of UpstreamCluster and the node's of
/// Agent are theirs to read, update and patch (each writes its own entry of the status map,
/// keyed by its subject); every other status (NetworkPolicy's and VirtualMachine's are the
/// VMManager's) is 403 for get, patch and update.
fn role_on_status(cp: &ControlPlane, role: &str, user: &str, token: &str, kind: &Kind) {
    let own = matches!(
        (role, kind.plural),
        ("gateway", "upstreamclusters") | ("node", "agents")
    );
    let path = format!("{}/status", kind.object(kind.existing));
    let subject = user.rsplit(':').next().unwrap_or(user);
    let status_of = |text: &str| match kind.plural {
        "agents" => json!({"nodes": {subject: {"connected": text == user}}}),
        _ => json!({"gateways": {subject: {
            "servers": [{"endpoint": text, "healthy": true}]}}}),
    };
    let read = request(cp, Some(token), "GET", &path, None);
    let reported = json!({"status": status_of(user)});
    let patched = request(
        cp,
        Some(token),
        "PATCH",
        &path,
        Some(("application/merge-patch+json", &reported)),
    );
    if !own {
        assert_forbidden(&read, user, "get", kind, "/status");
        assert_forbidden(&patched, user, "patch", kind, "/status");
        let mut object = kind.new_object(kind.existing, json!({}));
        object["status"] = status_of(user);
        let updated = request(
            cp,
            Some(token),
            "PUT",
            &path,
            Some(("application/json", &object)),
        );
        assert_forbidden(&updated, user, "update", kind, "/status");
        return;
    }
    assert_eq!(read.code, 200, "{user} get {path}: {read:?}");
    assert_eq!(patched.code, 200, "{user} patch {path}: {patched:?}");
    assert_eq!(patched.json()["status"], status_of(user));
    // A PUT of status with the version just read.
    let mut object = patched.json();
    object["status"] = status_of("by update");
    let updated = request(
        cp,
        Some(token),
        "PUT",
        &path,
        Some(("application/json", &object)),
    );
    assert_eq!(updated.code, 200, "{user} update {path}: {updated:?}");
    assert_eq!(updated.json()["status"], status_of("by update"));
}

#[test]
fn no_credentials_or_an_unknown_token_is_401() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    let paths = [
        "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters",
        "/apis/policy.sluice.dev/v1alpha1/networkpolicies/web",
        "/apis",
        "/api",
    ];
    for path in paths {
        for token in [None, Some("not-a-token"), Some("")] {
            let answer = request(&cp, token, "GET", path, None);
            assert_eq!(answer.code, 401, "{path} {token:?}: {answer:?}");
            let status = answer.json();
            assert_eq!(status["kind"], "Status", "{status}");
            assert_eq!(status["reason"], "Unauthorized", "{status}");
            assert_eq!(status["code"], 401, "{status}");
        }
    }
    let unknown = cp.kubeconfig_for("unknown", "sluice-unknown-token");
    let output = kubectl_with(&unknown, &["get", "upstreamclusters"], None);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("You must be logged in to the server"),
        "{stderr}"
    );
    // A revoked token: its Token object deleted, it is refused from then on.
    let token = cp.token("gateway", "gw-revoked");
    let path = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters";
    assert_eq!(request(&cp, Some(&token), "GET", path, None).code, 200);
    let names = kubectl_ok(&cp, &["get", "tokens.auth.sluice.dev", "-o", "json"], None);
    let listed: Value = serde_json::from_str(&names).unwrap();
    let name = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["spec"]["subject"] == "gw-revoked")
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_string())
        .unwrap();
    kubectl_ok(&cp, &["delete", "tokens.auth.sluice.dev", &name], None);
    assert!(
        test_support::wait_until(Duration::from_secs(10), || {
            request(&cp, Some(&token), "GET", path, None).code == 401
        }),
        "a revoked token is still accepted"
    );
}

#[test]
fn kubectl_shows_the_refusal() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    populate(&cp);
    let gateway = cp.kubeconfig_for("gateway", &cp.token("gateway", "gw-1"));
    let listed = kubectl_with(&gateway, &["get", "uc", "-o", "name"], None);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "upstreamcluster.proxy.sluice.dev/cluster-a.example.com"
    );
    let refused = kubectl_with(&gateway, &["delete", "uc", "cluster-a.example.com"], None);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("Error from server (Forbidden)")
            && stderr.contains(
                "User \"sluice:gateway:gw-1\" cannot delete resource \"upstreamclusters\""
            ),
        "{stderr}"
    );
    let agents = kubectl_with(&gateway, &["get", "agents"], None);
    let stderr = String::from_utf8_lossy(&agents.stderr);
    assert!(
        stderr.contains("cannot list resource \"agents\" in API group \"tunnel.sluice.dev\""),
        "{stderr}"
    );
    // The vm-agent's view with kubectl: its group, with its own member only.
    let vm1 = cp.kubeconfig_for("vm1", &cp.token("vm-agent", "vm1"));
    let groups = kubectl_with(
        &vm1,
        &[
            "get",
            "appliedtogroups",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}:{.spec.members[*].name}{\"\\n\"}{end}",
        ],
        None,
    );
    assert!(groups.status.success(), "{groups:?}");
    assert_eq!(
        String::from_utf8_lossy(&groups.stdout),
        "web-vms:vm1-eth0\n"
    );
}

/// A watch through curl, read event by event.
struct RawWatch(CurlWatch);

impl RawWatch {
    fn start(cp: &ControlPlane, token: &str, path: &str) -> Self {
        Self(CurlWatch::start(cp, token, path).unwrap())
    }

    /// The next event as (type, name), with the object.
    fn next(&self) -> (String, String, Value) {
        let event = self
            .0
            .next_event(Duration::from_secs(20))
            .expect("a watch event in time");
        let object = event["object"].clone();
        (
            event["type"].as_str().unwrap().to_string(),
            object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            object,
        )
    }

    fn next_pair(&self) -> (String, String) {
        let (event_type, name, _) = self.next();
        (event_type, name)
    }
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn pair(event_type: &str, name: &str) -> (String, String) {
    (event_type.to_string(), name.to_string())
}

#[test]
fn a_vm_agent_reads_and_watches_only_its_span() {
    let cp = ControlPlane::start(BIN, &[]).unwrap();
    populate(&cp);
    let vm1 = cp.token("vm-agent", "vm1");
    let vm2 = cp.token("vm-agent", "vm2");
    let base = "/apis/policy.sluice.dev/v1alpha1";
    let get =
        |token: &str, path: &str| request(&cp, Some(token), "GET", &format!("{base}/{path}"), None);

    // Lists: vm1 sees the web objects, vm2 the db objects; each only its own group members.
    for (token, policy, clients, group, member) in [
        (&vm1, "web", "web-clients", "web-vms", "vm1-eth0"),
        (&vm2, "db", "db-clients", "db-vms", "vm2-eth0"),
    ] {
        let policies = get(token, "networkpolicies");
        assert_eq!(policies.code, 200, "{policies:?}");
        assert_eq!(names(&policies.json()), vec![policy]);
        assert_eq!(names(&get(token, "addressgroups").json()), vec![clients]);
        let groups = get(token, "appliedtogroups").json();
        assert_eq!(names(&groups), vec![group]);
        let members: Vec<&str> = groups["items"][0]["spec"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|member| member["name"].as_str().unwrap())
            .collect();
        assert_eq!(members, vec![member]);
    }
    // Gets: its span's objects; another VM's are 403.
    let web_vms = get(&vm1, "appliedtogroups/web-vms");
    assert_eq!(web_vms.code, 200);
    assert_eq!(
        web_vms.json()["spec"]["members"],
        json!([{"name": "vm1-eth0", "vm": "vm1", "ofport": 1, "ips": ["10.0.0.1", "fd00::1"],
            "mac": "02:00:0a:00:00:01"}])
    );
    assert_eq!(get(&vm1, "networkpolicies/web").code, 200);
    assert_eq!(get(&vm1, "addressgroups/web-clients").code, 200);
    let kinds = kinds();
    for (plural, name) in [
        ("networkpolicies", "db"),
        ("addressgroups", "db-clients"),
        ("appliedtogroups", "db-vms"),
    ] {
        let kind = kinds.iter().find(|kind| kind.plural == plural).unwrap();
        let answer = get(&vm1, &format!("{plural}/{name}"));
        assert_forbidden(&answer, "sluice:vm-agent:vm1", "get", kind, "");
        assert!(
            answer.json()["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!(
                    "{plural}.policy.sluice.dev \"{name}\" is forbidden"
                )),
            "{answer:?}"
        );
    }
    // Selectors narrow the span further, never widen it.
    let selected = get(&vm1, "networkpolicies?fieldSelector=metadata.name%3Ddb");
    assert_eq!(names(&selected.json()), Vec::<String>::new());

    // Watches: the current span as ADDED, then entering and leaving as db-vms changes.
    let watch = |plural: &str| RawWatch::start(&cp, &vm1, &format!("{base}/{plural}?watch=1"));
    let policies = watch("networkpolicies");
    let address_groups = watch("addressgroups");
    let groups = watch("appliedtogroups");
    assert_eq!(policies.next_pair(), pair("ADDED", "web"));
    assert_eq!(address_groups.next_pair(), pair("ADDED", "web-clients"));
    assert_eq!(groups.next_pair(), pair("ADDED", "web-vms"));

    let join = r#"[{"op":"add","path":"/spec/members/-","value":{"name":"vm1-eth1","vm":"vm1","ofport":2,"ips":["10.0.0.11"]}}]"#;
    kubectl_ok(
        &cp,
        &[
            "patch",
            "appliedtogroups",
            "db-vms",
            "--type=json",
            "-p",
            join,
        ],
        None,
    );
    // db-vms changed, so db (applied to it) and db-clients (named by db) entered the span.
    assert_eq!(policies.next_pair(), pair("ADDED", "db"));
    assert_eq!(address_groups.next_pair(), pair("ADDED", "db-clients"));
    let (event_type, name, object) = groups.next();
    assert_eq!((event_type.as_str(), name.as_str()), ("ADDED", "db-vms"));
    assert_eq!(
        object["spec"]["members"],
        json!([{"name": "vm1-eth1", "vm": "vm1", "ofport": 2, "ips": ["10.0.0.11"]}])
    );
    assert_eq!(get(&vm1, "networkpolicies/db").code, 200);

    let leave = r#"[{"op":"remove","path":"/spec/members/1"}]"#;
    kubectl_ok(
        &cp,
        &[
            "patch",
            "appliedtogroups",
            "db-vms",
            "--type=json",
            "-p",
            leave,
        ],
        None,
    );
    assert_eq!(policies.next_pair(), pair("DELETED", "db"));
    assert_eq!(address_groups.next_pair(), pair("DELETED", "db-clients"));
    assert_eq!(groups.next_pair(), pair("DELETED", "db-vms"));
    assert_eq!(get(&vm1, "networkpolicies/db").code, 403);

    // Changes outside the span are not sent: the next events are the in-span ones.
    kubectl_ok(
        &cp,
        &[
            "patch",
            "addressgroups",
            "db-clients",
            "--type=merge",
            "-p",
            r#"{"spec":{"members":["10.0.6.0/24"]}}"#,
        ],
        None,
    );
    kubectl_ok(
        &cp,
        &[
            "patch",
            "addressgroups",
            "web-clients",
            "--type=merge",
            "-p",
            r#"{"spec":{"members":["10.0.7.0/24"]}}"#,
        ],
        None,
    );
    assert_eq!(address_groups.next_pair(), pair("MODIFIED", "web-clients"));
    kubectl_ok(&cp, &["delete", "networkpolicies", "web"], None);
    assert_eq!(policies.next_pair(), pair("DELETED", "web"));
    // web-clients is named by no policy of vm1's any more; web-vms is still its group.
    assert_eq!(address_groups.next_pair(), pair("DELETED", "web-clients"));
    kubectl_ok(&cp, &["delete", "appliedtogroups", "web-vms"], None);
    assert_eq!(groups.next_pair(), pair("DELETED", "web-vms"));
}
