use super::*;

const KINDS: [(&str, &str); 8] = [
    ("proxy.sluice.dev", "upstreamclusters"),
    ("tunnel.sluice.dev", "agents"),
    ("policy.sluice.dev", "networkpolicies"),
    ("policy.sluice.dev", "addressgroups"),
    ("policy.sluice.dev", "appliedtogroups"),
    ("vm.sluice.dev", "virtualmachines"),
    ("vm.sluice.dev", "virtualmachineruntimeinfos"),
    // Core v1 Events: the control plane writes them itself; only the admin reads them.
    ("", "events"),
];

/// No name (a list, watch or create), the caller's own VM's name, another name.
const NAMES: [Option<&str>; 3] = [None, Some("subject-1"), Some("x")];

fn identity(role: Role) -> Identity {
    Identity::new(role, "subject-1").unwrap()
}

fn request<'a>(
    verb: Verb,
    (group, resource): (&'a str, &'a str),
    sub: Option<&'a str>,
) -> Request<'a> {
    named(verb, (group, resource), sub, Some("x"))
}

fn named<'a>(
    verb: Verb,
    (group, resource): (&'a str, &'a str),
    sub: Option<&'a str>,
    name: Option<&'a str>,
) -> Request<'a> {
    Request {
        verb,
        group,
        resource,
        subresource: sub,
        namespace: None,
        name,
    }
}

/// The grants written out by hand, independent of how `authorize` is built: every
/// combination not listed here must be refused.
fn granted(
    role: Role,
    verb: Verb,
    resource: &str,
    sub: Option<&str>,
    name: Option<&str>,
) -> Option<Decision> {
    use Verb::*;
    let read = matches!(verb, Get | List | Watch);
    let status_write = sub == Some("status") && matches!(verb, Get | Update | Patch);
    let own = Decision::AllowOwn {
        name: "subject-1".into(),
    };
    match (role, resource, sub, name) {
        (Role::Admin, _, _, _) => Some(Decision::Allow),
        (Role::Gateway, "upstreamclusters", None, _) if read => Some(Decision::Allow),
        (Role::Gateway, "upstreamclusters", Some(_), _) if status_write => Some(Decision::Allow),
        (Role::Node, "agents", None, _) if read => Some(Decision::Allow),
        (Role::Node, "agents", Some(_), _) if status_write => Some(Decision::Allow),
        (Role::VmAgent, "networkpolicies" | "addressgroups" | "appliedtogroups", None, _)
            if read =>
        {
            Some(Decision::AllowWithinSpan {
                vm: "subject-1".into(),
            })
        }
        // Its own VirtualMachine: named reads of itself, lists and watches filtered to it.
        (Role::VmAgent, "virtualmachines", None, Some("subject-1") | None) if read => Some(own),
        // Its own runtime info: get, update, patch by name; create (the body's name checked).
        (Role::VmAgent, "virtualmachineruntimeinfos", None, Some("subject-1"))
            if matches!(verb, Get | Update | Patch | Create) =>
        {
            Some(own)
        }
        (Role::VmAgent, "virtualmachineruntimeinfos", None, None) if verb == Create => Some(own),
        _ => None,
    }
}

#[test]
fn every_role_gets_exactly_its_grants() {
    let mut allowed = 0;
    let mut total = 0;
    for role in Role::ALL {
        for verb in Verb::ALL {
            for kind in KINDS {
                for sub in [None, Some("status"), Some("scale")] {
                    for name in NAMES {
                        total += 1;
                        let outcome = authorize(&identity(role), &named(verb, kind, sub, name));
                        match granted(role, verb, kind.1, sub, name) {
                            Some(decision) => {
                                allowed += 1;
                                assert_eq!(
                                    outcome,
                                    Ok(decision),
                                    "{role} {verb} {kind:?} {sub:?} {name:?}"
                                )
                            }
                            None => {
                                assert!(outcome.is_err(), "{role} {verb} {kind:?} {sub:?} {name:?}")
                            }
                        }
                    }
                }
            }
        }
    }
    // 4 roles x 8 verbs x 8 kinds x 3 subresources x 3 names = 2304 requests. Allowed: the
    // admin's 576; the gateway's and the node's 3 reads and 3 status verbs, x 3 names, each;
    // the vm-agent's 3 reads of 3 policy kinds x 3 names, 3 reads of its own VM x 2 names,
    // and 4 verbs on its own runtime info plus a create without a name.
    assert_eq!(total, 2304);
    assert_eq!(allowed, 576 + 2 * 6 * 3 + 27 + 6 + 5);
}

#[test]
fn a_vm_agent_reaches_only_its_own_vm_objects() {
    let agent = identity(Role::VmAgent);
    let vms = ("vm.sluice.dev", "virtualmachines");
    let infos = ("vm.sluice.dev", "virtualmachineruntimeinfos");
    let refused = authorize(&agent, &named(Verb::Get, vms, None, Some("vm2"))).unwrap_err();
    assert_eq!(
        refused.message,
        r#"virtualmachines.vm.sluice.dev "vm2" is forbidden: User "sluice:vm-agent:subject-1" cannot get resource "virtualmachines" in API group "vm.sluice.dev" at the cluster scope"#
    );
    for verb in [Verb::Update, Verb::Patch] {
        let own = Some("subject-1");
        assert!(authorize(&agent, &named(verb, vms, Some("status"), own)).is_err());
        assert!(authorize(&agent, &named(verb, vms, None, own)).is_err());
        assert!(authorize(&agent, &named(verb, infos, None, Some("vm2"))).is_err());
    }
    for verb in [
        Verb::List,
        Verb::Watch,
        Verb::Delete,
        Verb::DeleteCollection,
    ] {
        assert!(authorize(&agent, &named(verb, infos, None, None)).is_err());
    }
    for role in [Role::Gateway, Role::Node] {
        for kind in [vms, infos] {
            for verb in Verb::ALL {
                assert!(authorize(&identity(role), &named(verb, kind, None, None)).is_err());
            }
        }
    }
}

#[test]
fn unknown_groups_and_resources_are_refused_to_every_role_but_admin() {
    for role in [Role::Gateway, Role::Node, Role::VmAgent] {
        for kind in [
            ("", "secrets"),
            ("proxy.sluice.dev", "tokens"),
            ("other.dev", "agents"),
        ] {
            assert!(authorize(&identity(role), &request(Verb::Get, kind, None)).is_err());
        }
    }
    assert_eq!(
        authorize(
            &identity(Role::Admin),
            &request(Verb::Delete, ("x", "y"), None)
        ),
        Ok(Decision::Allow)
    );
}

#[test]
fn a_refusal_reads_like_kube_apiservers() {
    let gateway = identity(Role::Gateway);
    let refused = authorize(
        &gateway,
        &request(Verb::Delete, ("proxy.sluice.dev", "upstreamclusters"), None),
    )
    .unwrap_err();
    assert_eq!(
        refused.message,
        r#"upstreamclusters.proxy.sluice.dev "x" is forbidden: User "sluice:gateway:subject-1" cannot delete resource "upstreamclusters" in API group "proxy.sluice.dev" at the cluster scope"#
    );
    let namespaced = Request {
        verb: Verb::List,
        group: "policy.sluice.dev",
        resource: "networkpolicies",
        subresource: None,
        namespace: Some("default"),
        name: None,
    };
    let refused = authorize(&gateway, &namespaced).unwrap_err();
    assert_eq!(
        refused.message,
        r#"networkpolicies.policy.sluice.dev is forbidden: User "sluice:gateway:subject-1" cannot list resource "networkpolicies" in API group "policy.sluice.dev" in the namespace "default""#
    );
    let status = request(
        Verb::Update,
        ("tunnel.sluice.dev", "agents"),
        Some("status"),
    );
    let refused = authorize(&gateway, &status).unwrap_err();
    assert!(
        refused
            .message
            .contains(r#"cannot update resource "agents/status""#),
        "{}",
        refused.message
    );
}
