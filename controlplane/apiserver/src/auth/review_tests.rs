use super::*;

fn identity(role: Role) -> Identity {
    Identity::new(role, "vm1").unwrap()
}

/// What `kubectl auth can-i VERB RESOURCE [NAME]` sends (kubectl resolves the group).
fn can_i(role: Role, verb: &str, group: &str, resource: &str, name: &str) -> bool {
    let review = json!({
        "kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {"resourceAttributes": {"namespace": "default", "verb": verb, "group": group,
            "resource": resource, "name": name}},
        "status": {"allowed": false},
    });
    let answer = access_review(&identity(role), &review).unwrap();
    assert_eq!(answer["kind"], "SelfSubjectAccessReview");
    assert_eq!(answer["spec"], review["spec"], "the request is echoed");
    answer["status"]["allowed"].as_bool().unwrap()
}

#[test]
fn each_role_is_answered_as_its_requests_are_decided() {
    use Role::*;
    let uc = ("proxy.sluice.dev", "upstreamclusters");
    let vm = ("vm.sluice.dev", "virtualmachines");
    let np = ("policy.sluice.dev", "networkpolicies");
    let ri = ("vm.sluice.dev", "virtualmachineruntimeinfos");
    for (role, verb, (group, resource), name, allowed) in [
        (Admin, "delete", uc, "", true),
        (Admin, "*", ("*", "*"), "", true),
        (Admin, "create", ("", "events"), "", true),
        (Gateway, "list", uc, "", true),
        (Gateway, "delete", uc, "a", false),
        (Gateway, "list", ("tunnel.sluice.dev", "agents"), "", false),
        (Gateway, "*", uc, "", false),
        (Gateway, "list", ("", "events"), "", false),
        (Node, "watch", ("tunnel.sluice.dev", "agents"), "", true),
        (Node, "create", ("", "events"), "", false),
        (VmAgent, "get", vm, "vm1", true),
        (VmAgent, "get", vm, "vm2", false),
        (VmAgent, "update", vm, "vm1", false),
        (VmAgent, "list", np, "", true),
        (VmAgent, "delete", np, "", false),
        (VmAgent, "update", ri, "vm1", true),
        (VmAgent, "list", ri, "", false),
        (VmAgent, "impersonate", ri, "vm1", false),
    ] {
        assert_eq!(
            can_i(role, verb, group, resource, name),
            allowed,
            "{role:?} {verb} {group}/{resource} {name}"
        );
    }
}

#[test]
fn a_partial_grant_says_why_and_a_refusal_gives_the_servers_message() {
    let review = |resource: &str, name: &str| {
        json!({"spec": {"resourceAttributes": {"verb": "get", "group": "vm.sluice.dev",
            "resource": resource, "name": name}}})
    };
    let answer = access_review(&identity(Role::VmAgent), &review("virtualmachines", "")).unwrap();
    assert_eq!(
        answer["status"],
        json!({"allowed": true, "reason": "only the object named \"vm1\""})
    );
    let denied = access_review(&identity(Role::VmAgent), &review("agents", "x")).unwrap();
    assert_eq!(denied["status"]["allowed"], false);
    assert!(denied["status"]["reason"]
        .as_str()
        .unwrap()
        .contains("User \"sluice:vm-agent:vm1\" cannot get resource \"agents\""));
    let events = json!({"spec": {"resourceAttributes": {"verb": "list", "group": "",
        "resource": "events", "namespace": "default"}}});
    let denied = access_review(&identity(Role::Gateway), &events).unwrap();
    assert_eq!(
        denied["status"]["reason"],
        "events is forbidden: User \"sluice:gateway:vm1\" cannot list resource \"events\" \
         in API group \"\" in the namespace \"default\""
    );
}

#[test]
fn non_resource_paths_and_malformed_reviews() {
    let path = |role: Role, verb: &str, path: &str| {
        let review = json!({"spec": {"nonResourceAttributes": {"verb": verb, "path": path}}});
        access_review(&identity(role), &review).unwrap()["status"]["allowed"] == true
    };
    assert!(path(Role::Gateway, "get", "/metrics"));
    assert!(path(Role::Gateway, "get", "/apis/vm.sluice.dev/v1alpha1"));
    assert!(!path(Role::Gateway, "post", "/apis"));
    assert!(!path(Role::Node, "get", "/debug/pprof"));
    assert!(path(Role::Admin, "post", "/anything"));
    assert_eq!(
        access_review(&identity(Role::Admin), &json!({"spec": {}})),
        Err(ReviewError::NoAttributes)
    );
    assert!(matches!(
        access_review(&identity(Role::Admin), &json!([1])),
        Err(ReviewError::Malformed(..))
    ));
}

#[test]
fn the_rules_review_lists_each_roles_grants() {
    let registry = crate::kinds::registry().unwrap();
    let rules = |role: Role| {
        let answer = rules_review(&identity(role), &registry, &json!({"spec": {}}));
        assert_eq!(answer["status"]["incomplete"], false);
        answer["status"]["resourceRules"]
            .as_array()
            .unwrap()
            .clone()
    };
    let rule = |verbs: &[&str], group: &str, resource: &str| json!({"verbs": verbs, "apiGroups": [group], "resources": [resource]});
    let reviews = json!({"verbs": ["create"], "apiGroups": [GROUP],
        "resources": [ACCESS_REVIEWS, RULES_REVIEWS]});
    assert_eq!(
        rules(Role::Gateway),
        [
            reviews.clone(),
            rule(
                &["get", "list", "watch"],
                "proxy.sluice.dev",
                "upstreamclusters"
            ),
            rule(
                &["get", "update", "patch"],
                "proxy.sluice.dev",
                "upstreamclusters/status"
            ),
        ]
    );
    let agent = rules(Role::VmAgent);
    let mut own_runtime_info = rule(
        &["get", "create", "update", "patch"],
        "vm.sluice.dev",
        "virtualmachineruntimeinfos",
    );
    own_runtime_info["resourceNames"] = json!(["vm1"]);
    assert!(agent.contains(&own_runtime_info), "{agent:?}");
    assert!(agent.contains(&rule(
        &["get", "list", "watch"],
        "policy.sluice.dev",
        "networkpolicies"
    )));
    assert!(!agent.iter().any(|rule| rule["resources"][0] == "events"));
    assert_eq!(
        rules(Role::Admin)[1],
        json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})
    );
}
