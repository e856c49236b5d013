//! The served kinds of the authorization matrix and the requests a client makes of them,
//! over real HTTPS with curl.

use std::process::Command;

use serde_json::{json, Value};

use test_support::ControlPlane;

pub const ZERO_SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";
pub const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// One served kind: where it lives, an object the fixture stores, and a new one to create.
/// [`kinds`] lists every kind the control plane serves.
pub struct Kind {
    pub group: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// Stored by [`populate`]; in vm1's span for the policy kinds.
    pub existing: &'static str,
    /// The object's fields besides apiVersion, kind and metadata (`spec`, or a runtime info's
    /// top-level report).
    pub fields: Value,
    /// Served with a `status` subresource.
    pub status: bool,
}

pub fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            group: "proxy.sluice.dev",
            plural: "upstreamclusters",
            kind: "UpstreamCluster",
            existing: "cluster-a.example.com",
            fields: json!({"spec": {"servers": [{"endpoint": "https://10.0.0.9:6443"}],
                "secureServing": {"certFile": "serving.pem", "keyFile": "serving-key.pem"},
                "clientConfig": {"certFile": "gateway.pem", "keyFile": "gateway-key.pem"}}}),
            status: true,
        },
        Kind {
            group: "tunnel.sluice.dev",
            plural: "agents",
            kind: "Agent",
            existing: "agent-7",
            fields: json!({"spec": {"id": 9, "tokenSha256": ZERO_SHA}}),
            status: true,
        },
        Kind {
            group: "policy.sluice.dev",
            plural: "networkpolicies",
            kind: "NetworkPolicy",
            existing: "web",
            fields: json!({"spec": {"namespace": "default", "priority": 1, "appliedTo": ["web-vms"],
                "rules": [{"name": "r", "direction": "Ingress", "action": "Allow"}]}}),
            status: true,
        },
        Kind {
            group: "policy.sluice.dev",
            plural: "addressgroups",
            kind: "AddressGroup",
            existing: "web-clients",
            fields: json!({"spec": {"members": ["10.9.0.1"]}}),
            status: false,
        },
        Kind {
            group: "policy.sluice.dev",
            plural: "appliedtogroups",
            kind: "AppliedToGroup",
            existing: "web-vms",
            fields: json!({"spec": {"members": [{"name": "vm9-eth0", "vm": "vm9", "ofport": 1, "ips": ["10.9.0.9"]}]}}),
            status: false,
        },
        Kind {
            group: "auth.sluice.dev",
            plural: "tokens",
            kind: "Token",
            existing: "matrix-existing",
            fields: json!({"spec": {"role": "gateway", "subject": "nobody", "tokenSha256": ZERO_SHA}}),
            status: false,
        },
        Kind {
            group: "vm.sluice.dev",
            plural: "virtualmachines",
            kind: "VirtualMachine",
            existing: "vm1",
            fields: json!({"spec": {"management": "Agented", "uplink": {"name": "eth0"}}}),
            status: true,
        },
        Kind {
            group: "vm.sluice.dev",
            plural: "virtualmachineruntimeinfos",
            kind: "VirtualMachineRuntimeInfo",
            existing: "vm1",
            fields: json!({"agentState": "Active", "agentVersion": "matrix"}),
            status: false,
        },
    ]
}

impl Kind {
    pub fn collection(&self) -> String {
        format!("/apis/{}/v1alpha1/{}", self.group, self.plural)
    }

    pub fn object(&self, name: &str) -> String {
        format!("{}/{name}", self.collection())
    }

    pub fn new_object(&self, name: &str, labels: Value) -> Value {
        let mut object = json!({
            "apiVersion": format!("{}/v1alpha1", self.group),
            "kind": self.kind,
            "metadata": {"name": name, "labels": labels},
        });
        for (field, value) in self.fields.as_object().expect("fields are an object") {
            object[field] = value.clone();
        }
        object
    }
}

/// An HTTP answer: status code and body.
#[derive(Debug)]
pub struct Answer {
    pub code: u16,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {self:?}"))
    }
}

/// One HTTPS request with curl, verifying the control plane's CA.
pub fn request(
    cp: &ControlPlane,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<(&str, &Value)>,
) -> Answer {
    let mut command = Command::new("curl");
    command
        .args(["-sS", "--max-time", "20", "-X", method, "--cacert"])
        .arg(cp.ca_file())
        .args(["-w", "\n%{http_code}"]);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    if let Some((content_type, body)) = body {
        command
            .args(["-H", &format!("Content-Type: {content_type}")])
            .args(["--data-binary", &body.to_string()]);
    }
    let output = command
        .arg(format!("{}{path}", cp.url()))
        .output()
        .expect("curl is installed (scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Answer {
        code: code
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no status from curl {method} {path}: {text:?} {output:?}")),
        body: body.to_string(),
    }
}

/// Sends `verb` on `kind` the way a client would, at `name` for the named verbs.
pub fn call(cp: &ControlPlane, token: &str, kind: &Kind, verb: &str, name: &str) -> Answer {
    let merge = "application/merge-patch+json";
    let labels = json!({"metadata": {"labels": {"touched": "yes"}}});
    match verb {
        "get" => request(cp, Some(token), "GET", &kind.object(name), None),
        "list" => request(cp, Some(token), "GET", &kind.collection(), None),
        "watch" => request(
            cp,
            Some(token),
            "GET",
            &format!("{}?watch=1&timeoutSeconds=1", kind.collection()),
            None,
        ),
        "create" => request(
            cp,
            Some(token),
            "POST",
            &kind.collection(),
            Some(("application/json", &kind.new_object(name, json!({})))),
        ),
        "update" => {
            let mut object = kind.new_object(name, json!({"touched": "put"}));
            object["metadata"]["resourceVersion"] = json!("1");
            request(
                cp,
                Some(token),
                "PUT",
                &kind.object(name),
                Some(("application/json", &object)),
            )
        }
        "patch" => request(
            cp,
            Some(token),
            "PATCH",
            &kind.object(name),
            Some((merge, &labels)),
        ),
        "delete" => request(cp, Some(token), "DELETE", &kind.object(name), None),
        "deletecollection" => request(
            cp,
            Some(token),
            "DELETE",
            &format!("{}?labelSelector=matrix%3Dvictim", kind.collection()),
            None,
        ),
        other => panic!("no verb {other}"),
    }
}

/// A 403 in kube's words, naming the user, the verb and the resource.
pub fn assert_forbidden(answer: &Answer, user: &str, verb: &str, kind: &Kind, subresource: &str) {
    let what = format!("{user} {verb} {}{subresource}", kind.plural);
    assert_eq!(answer.code, 403, "{what}: {answer:?}");
    let status = answer.json();
    assert_eq!(status["kind"], "Status", "{what}: {status}");
    assert_eq!(status["status"], "Failure", "{what}: {status}");
    assert_eq!(status["reason"], "Forbidden", "{what}: {status}");
    assert_eq!(status["code"], 403, "{what}: {status}");
    let message = status["message"].as_str().unwrap();
    let expected = format!(
        "User \"{user}\" cannot {verb} resource \"{}{subresource}\" in API group \"{}\" at the cluster scope",
        kind.plural, kind.group
    );
    assert!(
        message.contains(&expected) && message.contains(" is forbidden: "),
        "{what}: {message:?} lacks {expected:?}"
    );
}
