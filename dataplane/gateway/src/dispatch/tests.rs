//! One test per row of the seed's rule table and per negation / empty-list / match-all example,
//! named after it.

use super::*;
use crate::cluster::spec::DispatchPolicy;

fn rule_matcher(yaml: &str) -> DispatchMatcher {
    let rule: DispatchPolicyRule = serde_norway::from_str(yaml).unwrap();
    let policy = DispatchPolicy {
        rules: vec![rule],
        ..DispatchPolicy::default()
    };
    DispatchMatcher::compile(&[policy], &[], |_| None)
}

fn matches_as(yaml: &str, method: &str, url: &str, user: &UserInfo) -> bool {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let info = RequestInfo::parse(method, path, query).unwrap();
    rule_matcher(yaml).dispatch(&info, user).is_some()
}

fn matches(yaml: &str, method: &str, url: &str) -> bool {
    matches_as(yaml, method, url, &UserInfo::new("alice", &["dev"]))
}

const PODS: &str = "/api/v1/namespaces/default/pods";
const POD: &str = "/api/v1/namespaces/default/pods/web";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

// --- verbs -------------------------------------------------------------------------------

#[test]
fn verbs_row_required_in_resource_requests() {
    assert!(!matches("apiGroups: ['*']\nresources: ['*']", "GET", POD));
    assert!(matches(
        "verbs: [get]\napiGroups: ['*']\nresources: ['*']",
        "GET",
        POD
    ));
}

#[test]
fn verbs_row_required_in_non_resource_requests() {
    assert!(!matches("nonResourceURLs: ['*']", "GET", "/healthz"));
    assert!(matches(
        "verbs: [get]\nnonResourceURLs: ['*']",
        "GET",
        "/healthz"
    ));
}

#[test]
fn verbs_row_supports_anti_selection() {
    let rule = "verbs: ['-get', '-list']\napiGroups: ['*']\nresources: ['*']";
    assert!(!matches(rule, "GET", POD));
    assert!(!matches(rule, "GET", PODS));
    assert!(matches(rule, "GET", &format!("{PODS}?watch=true")));
    assert!(matches(rule, "DELETE", POD));
}

#[test]
fn verbs_row_supports_star() {
    let rule = "verbs: ['*', get]\napiGroups: ['*']\nresources: ['*']";
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
        assert!(matches(rule, method, POD), "{method}");
    }
}

#[test]
fn verbs_row_follow_the_http_method_correspondence() {
    let rule = |verb: &str| format!("verbs: [{verb}]\napiGroups: ['*']\nresources: ['*']");
    assert!(matches(&rule("list"), "GET", PODS));
    assert!(matches(&rule("watch"), "GET", &format!("{PODS}?watch=1")));
    assert!(matches(&rule("create"), "POST", PODS));
    assert!(matches(&rule("update"), "PUT", POD));
    assert!(matches(&rule("patch"), "PATCH", POD));
    assert!(matches(&rule("delete"), "DELETE", POD));
    assert!(matches(&rule("deletecollection"), "DELETE", PODS));
    assert!(!matches(&rule("get"), "GET", PODS));
}

// --- apiGroups ---------------------------------------------------------------------------

#[test]
fn api_groups_row_required_in_resource_requests() {
    assert!(!matches("verbs: ['*']\nresources: ['*']", "GET", POD));
    assert!(matches(
        "verbs: ['*']\napiGroups: ['']\nresources: ['*']",
        "GET",
        POD
    ));
    assert!(!matches(
        "verbs: ['*']\napiGroups: ['']\nresources: ['*']",
        "GET",
        DEPLOYMENTS
    ));
}

#[test]
fn api_groups_row_not_required_in_non_resource_requests() {
    assert!(matches(
        "verbs: ['*']\napiGroups: [apps]\nnonResourceURLs: ['/healthz']",
        "GET",
        "/healthz"
    ));
}

#[test]
fn api_groups_row_supports_anti_selection() {
    let rule = "verbs: ['*']\napiGroups: ['-apps']\nresources: ['*']";
    assert!(!matches(rule, "GET", DEPLOYMENTS));
    assert!(matches(rule, "GET", POD));
}

#[test]
fn api_groups_row_supports_star() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['*']";
    assert!(matches(rule, "GET", DEPLOYMENTS));
    assert!(matches(rule, "GET", POD));
}

// --- resources ---------------------------------------------------------------------------

#[test]
fn resources_row_required_in_resource_requests() {
    assert!(!matches("verbs: ['*']\napiGroups: ['*']", "GET", POD));
}

#[test]
fn resources_row_not_required_in_non_resource_requests() {
    assert!(matches(
        "verbs: ['*']\nresources: [pods]\nnonResourceURLs: ['/version']",
        "GET",
        "/version"
    ));
}

#[test]
fn resources_row_supports_anti_selection() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['-pods']";
    assert!(!matches(rule, "GET", POD));
    assert!(matches(rule, "GET", DEPLOYMENTS));
    // "pods" names the resource only, so its subresources are not excluded
    assert!(matches(rule, "GET", &format!("{POD}/log")));
}

#[test]
fn resources_row_supports_star() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['*']";
    assert!(matches(rule, "GET", &format!("{POD}/status")));
    assert!(matches(rule, "GET", DEPLOYMENTS));
}

#[test]
fn resources_row_resource_slash_subresource_matches_that_subresource() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: [pods/log]";
    assert!(matches(rule, "GET", &format!("{POD}/log")));
    assert!(!matches(rule, "GET", POD));
    assert!(!matches(rule, "GET", &format!("{POD}/exec")));
}

#[test]
fn resources_row_star_slash_subresource_matches_it_on_all_resources() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['*/status']";
    assert!(matches(rule, "GET", &format!("{POD}/status")));
    assert!(matches(
        rule,
        "PUT",
        "/apis/apps/v1/namespaces/default/deployments/web/status"
    ));
    assert!(!matches(rule, "GET", POD));
    assert!(!matches(rule, "GET", &format!("{POD}/log")));
}

#[test]
fn resources_row_negated_star_slash_subresource() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['-*/exec']";
    assert!(!matches(rule, "POST", &format!("{POD}/exec")));
    assert!(matches(rule, "GET", POD));
    assert!(matches(rule, "GET", &format!("{POD}/log")));
}

#[test]
fn resources_row_resource_slash_star_is_not_allowed() {
    // refused by validation (see cluster tests); compiled anyway, it matches nothing
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: ['pods/*']";
    assert!(!matches(rule, "GET", &format!("{POD}/log")));
    assert!(!matches(rule, "GET", POD));
}

// --- resourceNames -----------------------------------------------------------------------

#[test]
fn resource_names_empty_list_matches_every_name() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]";
    assert!(matches(rule, "GET", POD));
    assert!(matches(rule, "GET", PODS));
}

#[test]
fn resource_names_list_matches_those_names_only() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]\nresourceNames: [web]";
    assert!(matches(rule, "GET", POD));
    assert!(!matches(rule, "GET", "/api/v1/namespaces/default/pods/db"));
    assert!(!matches(rule, "GET", PODS));
    // a single-object watch names the object through its field selector
    assert!(matches(
        rule,
        "GET",
        &format!("{PODS}?watch=1&fieldSelector=metadata.name%3Dweb")
    ));
}

#[test]
fn resource_names_supports_anti_selection_and_star() {
    let negated = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]\nresourceNames: ['-nginx']";
    assert!(!matches(
        negated,
        "GET",
        "/api/v1/namespaces/default/pods/nginx"
    ));
    assert!(matches(negated, "GET", POD));
    let star = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]\nresourceNames: ['*', web]";
    assert!(matches(
        star,
        "GET",
        "/api/v1/namespaces/default/pods/nginx"
    ));
}

#[test]
fn a_negated_name_rule_never_matches_collection_requests() {
    // The rule meant to fence `admin-cm` off: every configmap but that one.
    let rule =
        "verbs: ['*']\napiGroups: ['*']\nresources: [configmaps]\nresourceNames: ['-admin-cm']";
    let configmaps = "/api/v1/namespaces/default/configmaps";
    assert!(matches(rule, "GET", &format!("{configmaps}/app-cm")));
    assert!(matches(rule, "DELETE", &format!("{configmaps}/app-cm")));
    assert!(!matches(rule, "GET", &format!("{configmaps}/admin-cm")));
    // list, watch and deletecollection name no object: the rule does not match them.
    assert!(!matches(rule, "GET", configmaps));
    assert!(!matches(rule, "GET", &format!("{configmaps}?watch=true")));
    assert!(!matches(rule, "DELETE", configmaps));
    assert!(!matches(rule, "POST", configmaps));
    assert!(!matches(rule, "GET", "/api/v1/configmaps?watch=1"));
    // The legacy /watch/ prefix: a collection names nothing, one object names itself.
    let legacy = "/api/v1/watch/namespaces/default/configmaps";
    assert!(!matches(rule, "GET", legacy));
    assert!(!matches(rule, "GET", &format!("{legacy}/admin-cm")));
    assert!(matches(rule, "GET", &format!("{legacy}/app-cm")));
    // A list or watch narrowed to one object carries its name, as RBAC reads it.
    let watch_one = format!("{configmaps}?watch=1&fieldSelector=metadata.name%3Dapp-cm");
    assert!(matches(rule, "GET", &watch_one));
    let watch_admin = format!("{configmaps}?watch=1&fieldSelector=metadata.name%3Dadmin-cm");
    assert!(!matches(rule, "GET", &watch_admin));
}

#[test]
fn a_positive_name_rule_never_matches_collection_requests_but_star_does() {
    let rule = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]\nresourceNames: [web]";
    for (method, url) in [("GET", PODS), ("DELETE", PODS), ("POST", PODS)] {
        assert!(!matches(rule, method, url), "{method} {url}");
    }
    let star = "verbs: ['*']\napiGroups: ['*']\nresources: [pods]\nresourceNames: ['*']";
    assert!(matches(star, "GET", PODS));
    assert!(matches(star, "DELETE", PODS));
}

#[test]
fn a_collection_request_falls_through_to_the_next_policy() {
    let policies: Vec<DispatchPolicy> = serde_norway::from_str(
        "- name: fenced\n  rules:\n  - {verbs: ['*'], apiGroups: ['*'], resources: [configmaps], resourceNames: ['-admin-cm']}\n- name: reads\n  rules:\n  - {verbs: [list], apiGroups: ['*'], resources: [configmaps]}\n",
    )
    .unwrap();
    let matcher = DispatchMatcher::compile(&policies, &[], |_| None);
    let alice = UserInfo::new("alice", &["dev"]);
    let policy = |method: &str, path: &str| {
        let info = RequestInfo::parse(method, path, "").unwrap();
        matcher
            .dispatch(&info, &alice)
            .map(|policy| policy.name.to_string())
    };
    let configmaps = "/api/v1/namespaces/default/configmaps";
    assert_eq!(
        policy("GET", &format!("{configmaps}/app-cm")).as_deref(),
        Some("fenced")
    );
    assert_eq!(policy("GET", configmaps).as_deref(), Some("reads"));
    assert_eq!(policy("DELETE", configmaps), None, "no policy: 403");
}

// --- users / serviceAccounts -------------------------------------------------------------

const ANY_POD_RULE: &str = "verbs: ['*']\napiGroups: ['*']\nresources: ['*']\n";

#[test]
fn users_row_not_required_empty_users_and_service_accounts_match_everyone() {
    assert!(matches_as(
        ANY_POD_RULE,
        "GET",
        POD,
        &UserInfo::new("anyone", &[])
    ));
}

#[test]
fn users_row_supports_anti_selection() {
    let rule = format!("{ANY_POD_RULE}users: ['-admin']");
    assert!(!matches_as(&rule, "GET", POD, &UserInfo::new("admin", &[])));
    assert!(matches_as(&rule, "GET", POD, &UserInfo::new("alice", &[])));
}

#[test]
fn users_row_supports_star() {
    let rule = format!("{ANY_POD_RULE}users: ['*']\nserviceAccounts: [{{namespace: a, name: b}}]");
    assert!(matches_as(&rule, "GET", POD, &UserInfo::new("anyone", &[])));
}

#[test]
fn users_row_lists_users() {
    let rule = format!("{ANY_POD_RULE}users: [alice, bob]");
    assert!(matches_as(&rule, "GET", POD, &UserInfo::new("bob", &[])));
    assert!(!matches_as(&rule, "GET", POD, &UserInfo::new("carol", &[])));
}

#[test]
fn users_row_empty_users_with_service_accounts_matches_no_plain_user() {
    let rule =
        format!("{ANY_POD_RULE}serviceAccounts: [{{namespace: kube-system, name: builder}}]");
    assert!(!matches_as(&rule, "GET", POD, &UserInfo::new("alice", &[])));
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:kube-system:builder", &[])
    ));
}

#[test]
fn service_accounts_row_empty_with_users_matches_no_service_account() {
    let rule = format!("{ANY_POD_RULE}users: [alice]");
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:kube-system:builder", &[])
    ));
}

#[test]
fn service_accounts_row_users_or_service_accounts() {
    let rule =
        format!("{ANY_POD_RULE}users: [alice]\nserviceAccounts: [{{namespace: ci, name: runner}}]");
    assert!(matches_as(&rule, "GET", POD, &UserInfo::new("alice", &[])));
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:ci:runner", &[])
    ));
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:ci:other", &[])
    ));
}

#[test]
fn service_accounts_row_has_no_anti_selection_and_no_star() {
    // names are literal: "-runner" and "*" are account names, not operators
    let rule = format!(
        "{ANY_POD_RULE}serviceAccounts: [{{namespace: ci, name: '-runner'}}, {{namespace: '*', name: '*'}}]"
    );
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:ci:other", &[])
    ));
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:ci:-runner", &[])
    ));
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount:*:*", &[])
    ));
}

#[test]
fn service_accounts_row_namespace_and_name_must_be_set() {
    let rule = format!("{ANY_POD_RULE}serviceAccounts: [{{namespace: '', name: runner}}]");
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("system:serviceaccount::runner", &[])
    ));
}

// --- userGroups --------------------------------------------------------------------------

#[test]
fn user_groups_row_empty_list_matches_every_user() {
    assert!(matches_as(
        ANY_POD_RULE,
        "GET",
        POD,
        &UserInfo::new("alice", &[])
    ));
}

#[test]
fn user_groups_row_lists_groups() {
    let rule = format!("{ANY_POD_RULE}userGroups: [ops]");
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("alice", &["dev", "ops"])
    ));
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("alice", &["dev"])
    ));
}

#[test]
fn user_groups_row_supports_anti_selection() {
    let rule = format!("{ANY_POD_RULE}userGroups: ['-system:controllers']");
    assert!(!matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("c", &["system:authenticated", "system:controllers"])
    ));
    assert!(matches_as(
        &rule,
        "GET",
        POD,
        &UserInfo::new("alice", &["system:authenticated"])
    ));
}

#[test]
fn user_groups_row_supports_star() {
    let rule = format!("{ANY_POD_RULE}userGroups: ['*']");
    assert!(matches_as(&rule, "GET", POD, &UserInfo::new("alice", &[])));
}

// --- nonResourceURLs ---------------------------------------------------------------------

#[test]
fn non_resource_urls_row_required_in_non_resource_requests() {
    assert!(!matches(
        "verbs: ['*']\napiGroups: ['*']\nresources: ['*']",
        "GET",
        "/healthz"
    ));
}

#[test]
fn non_resource_urls_row_not_required_in_resource_requests() {
    assert!(!matches("verbs: ['*']\nnonResourceURLs: ['*']", "GET", POD));
}

#[test]
fn non_resource_urls_row_supports_star() {
    assert!(matches(
        "verbs: ['*']\nnonResourceURLs: ['*']",
        "GET",
        "/openapi/v2"
    ));
}

#[test]
fn non_resource_urls_row_suffix_glob_is_a_prefix_match() {
    let rule = "verbs: [get]\nnonResourceURLs: ['/healthz', '/healthz/*']";
    assert!(matches(rule, "GET", "/healthz"));
    assert!(matches(rule, "GET", "/healthz/etcd"));
    assert!(!matches(rule, "GET", "/healthzz"));
    assert!(!matches(rule, "GET", "/livez"));
}

#[test]
fn non_resource_urls_row_has_no_anti_selection() {
    // refused by validation; compiled anyway, the negated entry is ignored
    assert!(!matches(
        "verbs: ['*']\nnonResourceURLs: ['-/healthz']",
        "GET",
        "/version"
    ));
}

// --- the seed's examples -----------------------------------------------------------------

#[test]
fn matching_all_example_all_operations_on_pods() {
    let rule = "resources: [pods]\napiGroups: ['*']\nverbs: ['*']";
    for method in ["GET", "POST", "DELETE"] {
        assert!(matches(rule, method, PODS), "{method}");
    }
    assert!(!matches(rule, "GET", DEPLOYMENTS));
}

#[test]
fn matching_all_example_healthz_suffix_glob_with_get_and_post() {
    let rule = "nonResourceURLs: ['/healthz', '/healthz/*']\nverbs: [get, post]";
    assert!(matches(rule, "GET", "/healthz/ping"));
    assert!(matches(rule, "POST", "/healthz"));
    assert!(!matches(rule, "PUT", "/healthz"));
}

#[test]
fn anti_selection_example_neither_pods_nor_deployments() {
    let rule = "resources: ['-pods', '-deployments']\napiGroups: ['*']\nverbs: ['*']";
    assert!(!matches(rule, "GET", POD));
    assert!(!matches(rule, "GET", DEPLOYMENTS));
    assert!(matches(
        rule,
        "GET",
        "/api/v1/namespaces/default/configmaps"
    ));
}

#[test]
fn anti_selection_error_example_mixed_list_ignores_negations() {
    let rule = "resources: ['-pods', deployments]\napiGroups: ['*']\nverbs: ['*']";
    assert!(matches(rule, "GET", DEPLOYMENTS));
    assert!(!matches(rule, "GET", POD));
    assert!(!matches(
        rule,
        "GET",
        "/api/v1/namespaces/default/configmaps"
    ));
}

#[test]
fn match_all_star_overrides_other_entries() {
    let rule = "resources: ['-pods', '*']\napiGroups: ['*']\nverbs: ['-get', '*']";
    assert!(matches(rule, "GET", POD));
}

// --- policies ----------------------------------------------------------------------------

fn policies(yaml: &str) -> DispatchMatcher {
    let policies: Vec<DispatchPolicy> = serde_norway::from_str(yaml).unwrap();
    let servers: Vec<UpstreamServer> = serde_norway::from_str(
        "[{endpoint: 'https://a:6443'}, {endpoint: 'https://b:6443'}, {endpoint: 'https://c:6443', disabled: true}]",
    )
    .unwrap();
    DispatchMatcher::compile(&policies, &servers, |name| (name == "slow").then_some(0))
}

fn dispatch<'m>(
    matcher: &'m DispatchMatcher,
    method: &str,
    url: &str,
) -> Option<&'m CompiledPolicy> {
    let info = RequestInfo::parse(method, url, "").unwrap();
    matcher.dispatch(&info, &UserInfo::new("alice", &[]))
}

#[test]
fn policies_are_tried_in_order_and_the_first_match_wins() {
    let matcher = policies(
        "
- name: reads
  upstreamSubset: ['https://b:6443']
  flowControlSchemaName: slow
  rules: [{verbs: [get, list], apiGroups: ['*'], resources: ['*']}]
- name: everything
  rules: [{verbs: ['*'], apiGroups: ['*'], resources: ['*']}, {verbs: ['*'], nonResourceURLs: ['*']}]
",
    );
    let reads = dispatch(&matcher, "GET", PODS).unwrap();
    assert_eq!(&*reads.name, "reads");
    assert_eq!(&*reads.servers, &[1]);
    assert_eq!(reads.flow_control_schema, Some(0));
    let writes = dispatch(&matcher, "POST", PODS).unwrap();
    assert_eq!(&*writes.name, "everything");
    // the disabled server is never a candidate
    assert_eq!(&*writes.servers, &[0, 1]);
    assert_eq!(writes.flow_control_schema, None);
    assert_eq!(
        &*dispatch(&matcher, "GET", "/healthz").unwrap().name,
        "everything"
    );
}

#[test]
fn rules_of_a_policy_are_ored_and_fields_anded() {
    let matcher = policies(
        "
- rules:
  - {verbs: [get], apiGroups: [''], resources: [pods]}
  - {verbs: [create], apiGroups: [apps], resources: [deployments]}
",
    );
    assert!(dispatch(&matcher, "GET", POD).is_some());
    assert!(dispatch(&matcher, "POST", DEPLOYMENTS).is_some());
    assert!(dispatch(&matcher, "POST", PODS).is_none());
    assert!(dispatch(&matcher, "GET", &format!("{DEPLOYMENTS}/x")).is_none());
    assert_eq!(&*dispatch(&matcher, "GET", POD).unwrap().name, "policy-0");
}

#[test]
fn no_policy_matched_is_none() {
    let matcher = policies("- rules: [{verbs: [get], nonResourceURLs: ['/healthz']}]");
    assert!(dispatch(&matcher, "GET", "/version").is_none());
}

#[test]
fn a_policy_without_rules_matches_nothing() {
    let matcher = policies("- name: empty");
    assert!(dispatch(&matcher, "GET", POD).is_none());
}

#[test]
fn no_policies_route_everything_to_all_enabled_servers() {
    let matcher = policies("[]");
    let policy = dispatch(&matcher, "DELETE", POD).unwrap();
    assert_eq!(&*policy.name, "default");
    assert_eq!(&*policy.servers, &[0, 1]);
    assert_eq!(policy.flow_control_schema, None);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl proptest::strategy::Strategy<Value = String> {
        "-?(\\*|pods|deployments|pods/log|\\*/status|get|list|apps|alice|dev|/healthz\\*?|)"
    }

    proptest! {
        #[test]
        fn arbitrary_rules_compile_and_match_without_panicking(
            fields in proptest::collection::vec(proptest::collection::vec(entry(), 0..4), 8),
            method in "(GET|POST|DELETE|PUT)",
            path in "/(api/v1|apis/apps/v1)/namespaces/a/(pods|deployments)(/web(/log|/status)?)?|/healthz(/x)?",
            groups in proptest::collection::vec("(dev|ops)", 0..3),
        ) {
            let rule = DispatchPolicyRule {
                verbs: fields[0].clone(),
                api_groups: fields[1].clone(),
                resources: fields[2].clone(),
                resource_names: fields[3].clone(),
                users: fields[4].clone(),
                service_accounts: Vec::new(),
                user_groups: fields[5].clone(),
                non_resource_urls: fields[6].clone(),
            };
            let policy = DispatchPolicy { rules: vec![rule], ..DispatchPolicy::default() };
            let matcher = DispatchMatcher::compile(&[policy], &[], |_| None);
            let info = RequestInfo::parse(&method, &path, "").unwrap();
            let user = UserInfo {
                name: "alice".into(),
                groups,
                ..UserInfo::default()
            };
            let _ = matcher.dispatch(&info, &user);
        }

        #[test]
        fn all_negative_resource_lists_exclude_exactly_their_entries(
            excluded in proptest::collection::vec("(pods|deployments|configmaps|services)", 1..4),
            resource in "(pods|deployments|configmaps|services|secrets)",
        ) {
            let negated: Vec<String> = excluded.iter().map(|value| format!("-{value}")).collect();
            let yaml = format!("verbs: ['*']\napiGroups: ['*']\nresources: {negated:?}");
            let url = format!("/api/v1/namespaces/a/{resource}");
            prop_assert_eq!(matches(&yaml, "GET", &url), !excluded.contains(&resource));
        }
    }
}
