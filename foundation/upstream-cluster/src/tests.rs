use std::path::Path;

use super::*;
use proptest::prelude::*;
use test_support::examples::UPSTREAM_CLUSTER as FULL;

fn file() -> &'static Path {
    Path::new("clusters/a.yaml")
}

fn messages(errors: InvalidSources) -> Vec<String> {
    errors.lines().collect()
}

fn with(replace: &str, by: &str) -> String {
    assert!(FULL.contains(replace), "{replace}");
    FULL.replacen(replace, by, 1)
}

#[test]
fn full_example_parses_with_defaults_and_resolved_paths() {
    let loaded = parse_clusters(FULL, file()).unwrap();
    assert_eq!(loaded.len(), 1);
    let spec = &loaded[0].cluster.spec;
    assert_eq!(
        spec.dispatch_policies[0].upstream_subset,
        ["https://10.0.0.2:6443"]
    );
    assert_eq!(
        spec.health_check.interval,
        std::time::Duration::from_millis(250)
    );
    assert_eq!(spec.health_check.path, "/readyz");
    assert_eq!(spec.connection_pool.connections_per_server, 2);
    assert!(spec.authentication.allow_anonymous);
    assert_eq!(spec.authentication.token_review_success_ttl.as_secs(), 600);
    assert_eq!(spec.authentication.token_review_failure_ttl.as_secs(), 5);
    assert_eq!(
        spec.client_config.cert_file.as_deref(),
        Some(Path::new("clusters/gateway.pem"))
    );
    assert_eq!(
        spec.client_config.ca_file.as_deref(),
        Some(Path::new("/etc/ca.pem"))
    );
    assert_eq!(
        spec.secure_serving.client_ca_file.as_deref(),
        Some(Path::new("clusters/client-ca.pem"))
    );
}

#[test]
fn undefined_schema_error_names_file_field_and_reason() {
    let text = with("  - strategy: RoundRobin", "  - flowControlSchemaName: x\n    rules: [{verbs: [get], nonResourceURLs: ['*']}]\n  - strategy: RoundRobin");
    let errors = messages(parse_clusters(&text, file()).unwrap_err());
    assert_eq!(
        errors,
        [
            r#"clusters/a.yaml: spec.dispatchPolicies[1].flowControlSchemaName: "x" is not defined in spec.flowControl.schemas"#
        ]
    );
}

#[test]
fn validation_reports_every_error_at_once() {
    let text = FULL
        .replace("kind: UpstreamCluster", "kind: Cluster")
        .replace("name: cluster-a.example.com", "name: Cluster_A")
        .replace("https://10.0.0.3:6443", "ftp://10.0.0.3")
        .replace(
            "maxRequestsInflight: {max: 2}",
            "maxRequestsInflight: {max: 0}\n      exempt: {}",
        )
        .replace(
            "upsteamSubset: [https://10.0.0.2:6443]",
            "upsteamSubset: [https://10.9.9.9:6443]",
        )
        .replace(
            "resources: [\"*\"]\n  - strategy",
            "resources: [\"pods/*\", \"-*\", \"a//b\"]\n  - strategy",
        )
        .replace("verbs: [get]\n", "verbs: [get, impersonate]\n")
        .replace(
            "\"/healthz\", \"/healthz/*\"",
            "\"-/healthz\", \"healthz\", \"/a*b\"",
        )
        .replace("    keyFile: gateway-key.pem\n", "");
    let errors = messages(parse_clusters(&text, file()).unwrap_err());
    let expected = [
        r#"clusters/a.yaml: kind: must be "UpstreamCluster", not "Cluster""#,
        r#"clusters/a.yaml: metadata.name: "Cluster_A" is not a lower-case DNS name (RFC 1123) or an IP address"#,
        r#"clusters/a.yaml: spec.servers[2].endpoint: "ftp://10.0.0.3" must start with https:// (or http://)"#,
        "clusters/a.yaml: spec.clientConfig: certFile and keyFile must be set together",
        "clusters/a.yaml: spec.flowControl.schemas[1]: set exactly one of exempt, maxRequestsInflight, tokenBucket",
        "clusters/a.yaml: spec.flowControl.schemas[1].maxRequestsInflight.max: must be at least 1",
        r#"clusters/a.yaml: spec.dispatchPolicies[0].upstreamSubset[0]: "https://10.9.9.9:6443" is not one of spec.servers"#,
        r#"clusters/a.yaml: spec.dispatchPolicies[0].rules[0].resources[0]: "pods/*": "resource/*" is not allowed; list the subresources or use "*/subresource""#,
        r#"clusters/a.yaml: spec.dispatchPolicies[0].rules[0].resources[1]: "-*" would match nothing"#,
        r#"clusters/a.yaml: spec.dispatchPolicies[0].rules[0].resources[2]: "a//b" must be "resource", "resource/subresource" or "*/subresource""#,
        r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].verbs[1]: "impersonate" is not a request verb (get, list, watch, create, update, patch, delete, deletecollection, proxy; post, put, head, options for non-resource URLs)"#,
        r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].nonResourceURLs[0]: "-/healthz": nonResourceURLs cannot be negated"#,
        r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].nonResourceURLs[1]: "healthz" must start with / (or be "*")"#,
        r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].nonResourceURLs[2]: "/a*b": "*" is only allowed as the final character"#,
    ];
    assert_eq!(errors, expected);
}

#[test]
fn rules_that_can_never_match_are_refused() {
    let text = with(
        "    - verbs: [get]\n      nonResourceURLs",
        "    - apiGroups: []\n      resources: [pods]\n      serviceAccounts: [{namespace: '', name: x}]\n    - verbs: [get]\n      nonResourceURLs",
    );
    let errors = messages(parse_clusters(&text, file()).unwrap_err());
    assert_eq!(
        errors,
        [
            r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].verbs: is empty, so the rule can never match (use ["*"] for all verbs)"#,
            r#"clusters/a.yaml: spec.dispatchPolicies[1].rules[1].apiGroups: is empty, so no resource request can match (use [""] for the core group, ["*"] for all)"#,
            "clusters/a.yaml: spec.dispatchPolicies[1].rules[1].serviceAccounts[0]: namespace and name must both be set",
        ]
    );
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let text = with("    disabled: true", "    disabled: true\n    weight: 3");
    assert_eq!(
        messages(parse_clusters(&text, file()).unwrap_err()),
        ["clusters/a.yaml: spec.servers[2].weight: unknown field `weight`, expected one of `endpoint`, `agent`, `disabled`"]
    );
    let text = with(
        "    - verbs: [get]\n",
        "    - verbs: [get]\n      verb: [list]\n",
    );
    let message = &messages(parse_clusters(&text, file()).unwrap_err())[0];
    assert!(
        message.starts_with(
            "clusters/a.yaml: spec.dispatchPolicies[1].rules[1].verb: unknown field `verb`"
        ),
        "{message}"
    );
}

#[test]
fn wrong_types_and_bad_durations_name_the_field() {
    let text = with("interval: 250ms", "interval: soon");
    let message = &messages(parse_clusters(&text, file()).unwrap_err())[0];
    assert!(
        message
            .starts_with("clusters/a.yaml: spec.healthCheck.interval: invalid duration \"soon\""),
        "{message}"
    );
    let text = with("tokenBucket: {qps: 10", "tokenBucket: {qps: -1");
    let message = &messages(parse_clusters(&text, file()).unwrap_err())[0];
    assert!(
        message.starts_with(
            "clusters/a.yaml: spec.flowControl.schemas[2].tokenBucket.qps: invalid value"
        ),
        "{message}"
    );
}

#[test]
fn several_documents_per_file_are_numbered_in_errors() {
    let second = FULL
        .replace("cluster-a.example.com", "cluster-b")
        .replace("a.internal, 127.0.0.1", "b.internal");
    let text = format!("{FULL}\n---\n{second}\n---\n");
    let loaded = parse_clusters(&text, file()).unwrap();
    assert_eq!(loaded.len(), 2);
    let broken = format!(
        "{FULL}\n---\n{}",
        second.replace("kind: UpstreamCluster", "kind: Other")
    );
    assert_eq!(
        messages(parse_clusters(&broken, file()).unwrap_err()),
        [r#"clusters/a.yaml (document 2): kind: must be "UpstreamCluster", not "Other""#]
    );
}

#[test]
fn invalid_yaml_is_an_error() {
    let message = &messages(parse_clusters("a: [", file()).unwrap_err())[0];
    assert!(
        message.starts_with("clusters/a.yaml: invalid YAML"),
        "{message}"
    );
}

fn write_cluster_dir(files: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "gateway.pem",
        "gateway-key.pem",
        "serving.pem",
        "serving-key.pem",
        "client-ca.pem",
    ] {
        std::fs::write(dir.path().join(name), "x").unwrap();
    }
    for (name, text) in files {
        std::fs::write(
            dir.path().join(name),
            text.replace("/etc/ca.pem", "client-ca.pem"),
        )
        .unwrap();
    }
    dir
}

#[test]
fn load_dir_reads_all_yaml_files() {
    let second = FULL
        .replace("cluster-a.example.com", "cluster-b")
        .replace("a.internal, 127.0.0.1", "b.internal");
    let dir = write_cluster_dir(&[
        ("a.yaml", FULL.to_string()),
        ("b.yml", second),
        ("notes.txt", "not yaml: [".into()),
    ]);
    let mut names: Vec<String> = load_dir(dir.path())
        .unwrap()
        .into_iter()
        .map(|loaded| loaded.cluster.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["cluster-a.example.com", "cluster-b"]);
}

#[test]
fn load_dir_rejects_duplicate_names_and_hostnames_across_files() {
    let same_name = FULL.replace("a.internal, 127.0.0.1", "c.internal");
    let same_host = FULL.replace("name: cluster-a.example.com", "name: cluster-c");
    let dir = write_cluster_dir(&[
        ("a.yaml", FULL.to_string()),
        ("b.yaml", same_name),
        ("c.yaml", same_host),
    ]);
    let errors = messages(load_dir(dir.path()).unwrap_err());
    let root = dir.path().display();
    assert_eq!(
        errors,
        [
            format!(
                r#"{root}/b.yaml: metadata.name: cluster "cluster-a.example.com" is also defined in {root}/a.yaml"#
            ),
            format!(
                r#"{root}/c.yaml: spec.secureServing.extraHostnames[0]: hostname "a.internal" already belongs to cluster "cluster-a.example.com" ({root}/a.yaml)"#
            ),
            format!(
                r#"{root}/c.yaml: spec.secureServing.extraHostnames[1]: hostname "127.0.0.1" already belongs to cluster "cluster-a.example.com" ({root}/a.yaml)"#
            ),
        ]
    );
}

#[test]
fn load_dir_reports_missing_files() {
    let dir = write_cluster_dir(&[("a.yaml", FULL.to_string())]);
    std::fs::remove_file(dir.path().join("serving-key.pem")).unwrap();
    let errors = messages(load_dir(dir.path()).unwrap_err());
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].contains("a.yaml: metadata.name=\"cluster-a.example.com\" spec.secureServing.keyFile: cannot read"),
        "{}",
        errors[0]
    );
}

proptest! {
    #[test]
    fn arbitrary_yaml_never_panics(text in "\\PC{0,200}") {
        let _ = parse_clusters(&text, file());
    }
}

#[test]
fn fair_share_limits_that_cannot_work_name_their_field() {
    let text = with(
        "  healthCheck:",
        "  connectionPool: {longRunningStreamsPercent: 0, maxLongRunningPerUser: 0, maxUpgradeConnections: 0, reservedConnectionsPerServer: 0, maxQueuedPerUser: 20, maxQueuedPerServer: 10}\n  healthCheck:",
    );
    let errors = messages(parse_clusters(&text, file()).unwrap_err());
    assert_eq!(
        errors,
        [
            "clusters/a.yaml: spec.connectionPool.longRunningStreamsPercent: must be between 1 and 100",
            "clusters/a.yaml: spec.connectionPool.maxLongRunningPerUser: must be at least 1",
            "clusters/a.yaml: spec.connectionPool.maxUpgradeConnections: must be at least 1",
            "clusters/a.yaml: spec.connectionPool.reservedConnectionsPerServer: must be at least 1",
            "clusters/a.yaml: spec.connectionPool.maxQueuedPerUser: must be at most maxQueuedPerServer",
        ]
    );
    let over = with(
        "  healthCheck:",
        "  connectionPool: {longRunningStreamsPercent: 101}\n  healthCheck:",
    );
    assert_eq!(
        messages(parse_clusters(&over, file()).unwrap_err()).len(),
        1
    );
    let defaults = parse_clusters(FULL, file()).unwrap();
    let pool = &defaults[0].cluster.spec.connection_pool;
    assert_eq!(
        (
            pool.long_running_streams_percent,
            pool.max_long_running_per_user
        ),
        (50, 100)
    );
    assert_eq!(pool.max_queue_wait, std::time::Duration::from_secs(5));
}

/// The example with its second server behind agent 42 and the reads policy sending to it.
fn with_agent_server() -> String {
    with(
        "  - endpoint: https://10.0.0.2:6443\n",
        "  - agent: {id: 42}\n",
    )
    .replace(
        "upsteamSubset: [https://10.0.0.2:6443]",
        "upsteamSubset: [agent:42, https://10.0.0.1:6443]",
    )
}

#[test]
fn a_server_may_name_an_agent_and_a_policy_may_send_to_it() {
    let loaded = parse_clusters(&with_agent_server(), file()).unwrap();
    let spec = &loaded[0].cluster.spec;
    assert_eq!(spec.servers[1].agent, Some(spec::AgentServer { id: 42 }));
    assert_eq!(spec.servers[1].endpoint, None);
    let names: Vec<String> = spec
        .servers
        .iter()
        .map(spec::UpstreamServer::name)
        .collect();
    assert_eq!(
        names,
        ["https://10.0.0.1:6443", "agent:42", "https://10.0.0.3:6443"]
    );
    // `disabled` works for both kinds.
    let disabled = with_agent_server().replace(
        "  - agent: {id: 42}\n",
        "  - agent: {id: 42}\n    disabled: true\n",
    );
    let loaded = parse_clusters(&disabled, file()).unwrap();
    assert!(loaded[0].cluster.spec.servers[1].disabled);
}

#[test]
fn an_agent_server_mistake_names_its_field() {
    let cases = [
        (
            "  - agent: {id: 42}\n    endpoint: https://10.0.0.9:6443\n",
            r#"clusters/a.yaml: spec.servers[1]: set exactly one of endpoint (an apiserver the gateway dials) and agent (an agent whose tunnel reaches one)"#,
        ),
        (
            "  - disabled: false\n",
            r#"clusters/a.yaml: spec.servers[1]: set exactly one of endpoint (an apiserver the gateway dials) and agent (an agent whose tunnel reaches one)"#,
        ),
        (
            "  - agent: {id: 0}\n",
            "clusters/a.yaml: spec.servers[1].agent.id: must be at least 1 (agent ids are positive)",
        ),
        (
            "  - agent: {id: 9223372036854775808}\n",
            "clusters/a.yaml: spec.servers[1].agent.id: 9223372036854775808 is above 9223372036854775807, the largest agent id the tunnel knows",
        ),
        (
            "  - agent: {id: 42}\n  - agent: {id: 42}\n",
            r#"clusters/a.yaml: spec.servers[2].agent.id: "agent:42" is listed twice"#,
        ),
    ];
    for (server, expected) in cases {
        let text = with_agent_server().replace("  - agent: {id: 42}\n", server);
        let errors = messages(parse_clusters(&text, file()).unwrap_err());
        // The subset names agent:42, which a case without that server refuses too.
        assert_eq!(errors[0], expected, "{server}: {errors:?}");
    }
    let negative = with_agent_server().replace("id: 42", "id: -1");
    let errors = messages(parse_clusters(&negative, file()).unwrap_err());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .starts_with("clusters/a.yaml: spec.servers[1].agent.id: invalid value: integer `-1`"),
        "{errors:?}"
    );
    let unknown = with_agent_server().replace("id: 42", "id: 42, name: x");
    let errors = messages(parse_clusters(&unknown, file()).unwrap_err());
    assert!(
        errors[0].starts_with("clusters/a.yaml: spec.servers[1].agent.name: unknown field `name`"),
        "{errors:?}"
    );
}

#[test]
fn a_subset_naming_an_agent_that_is_not_a_server_is_refused() {
    let text = with_agent_server().replace("[agent:42,", "[agent:7,");
    assert_eq!(
        messages(parse_clusters(&text, file()).unwrap_err()),
        [
            r#"clusters/a.yaml: spec.dispatchPolicies[0].upstreamSubset[0]: "agent:7" is not one of spec.servers"#
        ]
    );
}
