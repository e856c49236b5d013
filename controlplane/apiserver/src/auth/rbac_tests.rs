use super::*;

const KINDS: [(&str, &str); 5] = [
    ("proxy.sluice.dev", "upstreamclusters"),
    ("tunnel.sluice.dev", "agents"),
    ("policy.sluice.dev", "networkpolicies"),
    ("policy.sluice.dev", "addressgroups"),
    ("policy.sluice.dev", "appliedtogroups"),
];

fn identity(role: Role) -> Identity {
    Identity::new(role, "subject-1").unwrap()
}

fn request<'a>(
    verb: Verb,
    (group, resource): (&'a str, &'a str),
    sub: Option<&'a str>,
) -> Request<'a> {
    Request {
        verb,
        group,
        resource,
        subresource: sub,
        namespace: None,
        name: Some("x"),
    }
}

/// The grants written out by hand, independent of how `authorize` is built: every pair not
/// listed here must be refused.
fn granted(role: Role, verb: Verb, resource: &str, sub: Option<&str>) -> Option<Decision> {
    use Verb::*;
    let read = matches!(verb, Get | List | Watch);
    let status_write = sub == Some("status") && matches!(verb, Get | Update | Patch);
    match (role, resource, sub) {
        (Role::Admin, _, _) => Some(Decision::Allow),
        (Role::Gateway, "upstreamclusters", None) if read => Some(Decision::Allow),
        (Role::Gateway, "upstreamclusters", Some(_)) if status_write => Some(Decision::Allow),
        (Role::Node, "agents", None) if read => Some(Decision::Allow),
        (Role::Node, "agents", Some(_)) if status_write => Some(Decision::Allow),
        (Role::VmAgent, "networkpolicies" | "addressgroups" | "appliedtogroups", None) if read => {
            Some(Decision::AllowWithinSpan {
                vm: "subject-1".into(),
            })
        }
        _ => None,
    }
}

#[test]
fn every_role_gets_exactly_its_grants() {
    let mut refused = 0;
    for role in Role::ALL {
        for verb in Verb::ALL {
            for kind in KINDS {
                for sub in [None, Some("status"), Some("scale")] {
                    let outcome = authorize(&identity(role), &request(verb, kind, sub));
                    match granted(role, verb, kind.1, sub) {
                        Some(decision) => {
                            assert_eq!(outcome, Ok(decision), "{role} {verb} {kind:?} {sub:?}")
                        }
                        None => {
                            refused += 1;
                            assert!(outcome.is_err(), "{role} {verb} {kind:?} {sub:?}");
                        }
                    }
                }
            }
        }
    }
    // 4 roles x 8 verbs x 5 kinds x 3 subresources = 480 requests, of which admin's 120, the
    // gateway's and the node's 3 reads and 3 status verbs each, and the vm-agent's 3 reads of 3
    // kinds are allowed.
    assert_eq!(refused, 480 - 120 - 2 * (3 + 3) - 3 * 3);
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
