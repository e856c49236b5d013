use super::*;
use proptest::prelude::*;

fn errors_of(text: &str) -> Vec<String> {
    match load_str(text, "test.yaml") {
        Ok(config) => panic!("expected errors, got {config:?}"),
        Err(error) => error.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn embedded_defaults_are_valid() {
    let config = Config::embedded_defaults().expect("embedded defaults must validate");
    assert_eq!(
        config.listeners.admin.address,
        "127.0.0.1:9901".parse().unwrap()
    );
    assert_eq!(config.runtime.drain_timeout, Duration::from_secs(5));
    assert_eq!(config.runtime.driver, DriverChoice::Auto);
}

#[test]
fn empty_document_means_defaults() {
    for text in ["", "# only a comment\n", "---\n"] {
        let config = load_str(text, "empty.yaml").expect("empty config is valid");
        assert_eq!(config.runtime.workers, Workers::Auto);
        assert_eq!(config.runtime.uring_entries, 1024);
        assert_eq!(config.runtime.drain_timeout, Duration::from_secs(30));
        assert_eq!(config.logging.format, LogFormat::Text);
        assert_eq!(config.listeners.admin.backlog, 1024);
    }
}

#[test]
fn full_document_is_read() {
    let config = load_str(
        "runtime: {workers: 3, driver: legacy, uring_entries: 512, drain_timeout: 2m}\n\
         logging: {format: json, level: 'warn,sluice_runtime=debug'}\n\
         listeners:\n  admin: {address: '[::1]:0', backlog: 16, max_connections_per_worker: 8, \
         header_timeout: 1s, idle_timeout: 250ms}\n",
        "full.yaml",
    )
    .expect("valid");
    assert_eq!(
        config.runtime.workers,
        Workers::Count(NonZeroUsize::new(3).unwrap())
    );
    assert_eq!(config.runtime.workers.resolve(), 3);
    assert_eq!(config.runtime.driver, DriverChoice::Legacy);
    assert_eq!(config.runtime.uring_entries, 512);
    assert_eq!(config.runtime.drain_timeout, Duration::from_secs(120));
    assert_eq!(config.logging.format, LogFormat::Json);
    assert_eq!(config.logging.level, "warn,sluice_runtime=debug");
    let admin = &config.listeners.admin;
    assert_eq!(admin.address, "[::1]:0".parse().unwrap());
    assert_eq!(admin.backlog, 16);
    assert_eq!(admin.max_connections_per_worker, 8);
    assert_eq!(admin.limits.header_timeout, Duration::from_secs(1));
    assert_eq!(admin.limits.idle_timeout, Duration::from_millis(250));
}

#[test]
fn every_mistake_is_reported_with_its_path() {
    let errors = errors_of(
        "runtime:\n  workers: 0\n  drain_timeout: soon\n  colour: blue\nlisteners:\n  admin:\n    address: \"x:y\"\n",
    );
    assert_eq!(
        errors,
        vec![
            "runtime.colour: unknown field".to_string(),
            "runtime.workers: must be at least 1 (or \"auto\" for one per CPU)".to_string(),
            "runtime.drain_timeout: invalid duration \"soon\": expected a number with a unit such as 500ms, 30s or 5m".to_string(),
            "listeners.admin.address: invalid socket address \"x:y\": expected IP:PORT such as 127.0.0.1:9901 or [::1]:9901".to_string(),
        ]
    );
}

#[test]
fn error_display_names_the_origin_on_every_line() {
    let error = load_str("logging: {format: xml}\nbogus: 1\n", "/etc/sluice.yaml").unwrap_err();
    let text = error.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines
            .iter()
            .all(|line| line.starts_with("/etc/sluice.yaml: ")),
        "{text}"
    );
    assert!(text.contains("bogus: unknown field"), "{text}");
    assert!(
        text.contains("logging.format: invalid value \"xml\": expected one of text, json"),
        "{text}"
    );
}

#[test]
fn wrong_shapes_and_ranges_are_errors() {
    let errors = errors_of(
        "runtime: {driver: [uring], uring_entries: 300, workers: 5000}\nlisteners: {admin: {backlog: -1}}\nlogging: {level: 'info,=['}\n",
    );
    assert!(
        errors.contains(&"runtime.driver: expected a single value, found a list".to_string()),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"runtime.uring_entries: 300 is not a power of two".to_string()),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"runtime.workers: 5000 is more than the limit of 1024".to_string()),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("listeners.admin.backlog: invalid number \"-1\"")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("logging.level: invalid log filter")),
        "{errors:?}"
    );
}

#[test]
fn metadata_limits_stay_below_the_ceiling() {
    let (_dir, secret, _) = secret_dir();
    let errors = errors_of(&format!(
        "tunnel:\n  max_metadata_entries: 30000\n  max_metadata_bytes: 100\n  jwt: {{secret_file: '{secret}'}}\n"
    ));
    assert!(
        errors
            .contains(&"tunnel.max_metadata_entries: 30000 is out of range 16..=16384".to_string()),
        "{errors:?}"
    );
    assert!(
        errors
            .contains(&"tunnel.max_metadata_bytes: 100 is out of range 1024..=1048576".to_string()),
        "{errors:?}"
    );
}

#[test]
fn structural_mistake_reports_path() {
    let errors = errors_of("listeners: 5\n");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0],
        "listeners: invalid type: integer `5`, expected a mapping at line 1 column 12"
    );
}

#[test]
fn syntax_error_reports_position() {
    let errors = errors_of("runtime:\n  workers: [1\n");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("line"), "{errors:?}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let error = load_file(Path::new("/nonexistent/sluice.yaml")).unwrap_err();
    assert_eq!(error.origin, "/nonexistent/sluice.yaml");
    assert!(error.to_string().contains("cannot read file"), "{error}");
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let _ = load_str(&text, "fuzz.yaml");
    }

    #[test]
    fn arbitrary_yaml_shapes_never_panic(
        section in prop::sample::select(vec!["runtime", "logging", "listeners", "other"]),
        key in prop::sample::select(vec!["workers", "driver", "uring_entries", "drain_timeout", "format", "level", "admin", "address", "x"]),
        value in prop_oneof![
            Just("~".to_string()),
            Just("[]".to_string()),
            Just("{}".to_string()),
            "-?[0-9]{1,25}",
            "[a-z:.\\[\\]0-9]{0,30}",
            Just("{address: 1, backlog: '99999999999999999999999'}".to_string()),
        ],
    ) {
        let text = format!("{section}:\n  {key}: {value}\n");
        let _ = load_str(&text, "fuzz.yaml");
    }
}

fn secret_dir() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("jwt.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "agent-token-7\n").unwrap();
    let secret = secret.display().to_string();
    let token = token.display().to_string();
    (dir, secret, token)
}

#[test]
fn tunnel_section_enables_agent_and_external_listeners_with_defaults() {
    let (_dir, secret, _) = secret_dir();
    let digest = "a".repeat(64);
    let config = load_str(
        &format!("tunnel:\n  node_name: node-a\n  agents: [{{id: 7, token_sha256: '{digest}'}}]\n  jwt: {{secret_file: '{secret}'}}\n"),
        "t.yaml",
    )
    .expect("valid");
    let tunnel = config.tunnel.expect("tunnel");
    assert_eq!(tunnel.node_name, "node-a");
    assert_eq!(tunnel.max_wait, Duration::from_secs(20));
    assert_eq!(tunnel.peer_timeouts, crate::PeerTimeouts::default());
    assert_eq!(
        (tunnel.peer_timeouts.connect, tunnel.peer_timeouts.unacked),
        (Duration::from_secs(3), Duration::from_secs(10))
    );
    assert_eq!(tunnel.max_message_bytes, 32 * 1024 * 1024);
    assert_eq!(
        (tunnel.max_metadata_entries, tunnel.max_metadata_bytes),
        (512, 64 * 1024)
    );
    assert_eq!(
        tunnel.agents,
        vec![AgentTokenConfig {
            id: 7,
            token_sha256: [0xaa; 32]
        }]
    );
    assert_eq!(
        tunnel.jwt.secret,
        b"0123456789abcdef0123456789abcdef".to_vec()
    );
    assert_eq!(
        (tunnel.jwt.issuer.as_str(), tunnel.jwt.audience.as_str()),
        ("gitlab", "gitlab-kas")
    );
    assert!(
        !format!("{:?}", tunnel.jwt).contains("0123456789"),
        "secret is redacted in Debug"
    );
    assert_eq!(
        config.listeners.agent.unwrap().address,
        "127.0.0.1:8150".parse().unwrap()
    );
    assert_eq!(
        config.listeners.external.unwrap().address,
        "127.0.0.1:8151".parse().unwrap()
    );
}

#[test]
fn tunnel_mistakes_are_reported_with_paths() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "tooshort").unwrap();
    let errors = errors_of(&format!(
        "tunnel:\n  agents:\n    - {{id: 7, token_sha256: 'xyz'}}\n    - {{id: 7, token_sha256: '{}'}}\n    - {{token_sha256: '{}'}}\n  jwt: {{secret_file: '{}'}}\nlisteners:\n  agent:\n    tls: {{cert_file: /nonexistent/cert.pem}}\n",
        "b".repeat(64),
        "c".repeat(64),
        short.display()
    ));
    let joined = errors.join("\n");
    assert!(
        joined.contains("tunnel.agents[0].token_sha256: expected 64 hex digits"),
        "{joined}"
    );
    assert!(
        joined.contains("tunnel.agents[2].id: is required"),
        "{joined}"
    );
    assert!(joined.contains("needs at least 32"), "{joined}");
    assert!(
        joined.contains("listeners.agent.tls.cert_file: cannot read \"/nonexistent/cert.pem\""),
        "{joined}"
    );
    assert!(
        joined.contains("listeners.agent.tls.key_file: is required"),
        "{joined}"
    );
}

#[test]
fn duplicate_agent_ids_and_orphan_listeners_are_errors() {
    let (_dir, secret, _) = secret_dir();
    let errors = errors_of(&format!(
        "tunnel:\n  agents:\n    - {{id: 7, token_sha256: '{}'}}\n    - {{id: 7, token_sha256: '{}'}}\n  jwt: {{secret_file: '{secret}'}}\n",
        "b".repeat(64),
        "c".repeat(64)
    ));
    assert_eq!(
        errors,
        vec!["tunnel.agents[1].id: agent id 7 is listed twice".to_string()]
    );
    let errors = errors_of("listeners:\n  external: {address: '127.0.0.1:0'}\n");
    assert_eq!(
        errors,
        vec![
            "listeners.external: is only used with a tunnel section; add `tunnel:` or remove it"
                .to_string()
        ]
    );
}

#[test]
fn agent_section_is_read_and_checked() {
    let (_dir, _, token) = secret_dir();
    let config = load_str(
        &format!("agent:\n  token_file: '{token}'\n  nodes: ['http://127.0.0.1:8150', 'https://node.example:443']\n  forward_to: 'http://[::1]:50051'\n  pool: {{min_idle: 3}}\n"),
        "a.yaml",
    )
    .expect("valid");
    let agent = config.agent.expect("agent");
    assert_eq!(agent.token, "agent-token-7");
    assert_eq!(agent.nodes.len(), 2);
    assert!(!agent.nodes[0].tls && agent.nodes[1].tls);
    assert_eq!(
        (agent.nodes[1].host.as_str(), agent.nodes[1].port),
        ("node.example", 443)
    );
    assert_eq!(
        (agent.forward_to.host.as_str(), agent.forward_to.port),
        ("::1", 50051)
    );
    assert_eq!(
        agent.pool,
        PoolConfig {
            min_idle: 3,
            max: 500,
            grow_by: 10,
            idle_timeout: Duration::from_secs(60)
        }
    );
    assert_eq!(agent.reconnect.initial_backoff, Duration::from_secs(1));
    assert_eq!(agent.reconnect.max_backoff, Duration::from_secs(20));
    assert!(
        !format!("{agent:?}").contains("agent-token-7"),
        "token is redacted in Debug"
    );

    let errors = errors_of(&format!(
        "agent:\n  token_file: '{token}'\n  nodes: ['ftp://x', 'http://h:1/path']\n  pool: {{min_idle: 5, max: 2}}\n"
    ));
    let joined = errors.join("\n");
    assert!(
        joined.contains("agent.nodes[0]: invalid URL \"ftp://x\""),
        "{joined}"
    );
    assert!(joined.contains("agent.nodes[1]: invalid URL \"http://h:1/path\": expected scheme://host:port without a path"), "{joined}");
    assert!(joined.contains("agent.forward_to: is required"), "{joined}");
    assert!(
        joined.contains("agent.pool.min_idle: 5 is more than agent.pool.max (2)"),
        "{joined}"
    );
}

#[test]
fn redis_section_is_read_and_checked() {
    let (_dir, secret, _) = secret_dir();
    let config = load_str(
        &format!("tunnel: {{jwt: {{secret_file: '{secret}'}}, private_jwt: {{secret_file: '{secret}'}}}}\nredis: {{url: 'redis://user:pw@127.0.0.1:6379', key_prefix: x}}\n"),
        "r.yaml",
    )
    .expect("valid");
    let redis = config.redis.expect("redis");
    assert_eq!(
        redis.target,
        RedisTargetConfig::Url("redis://user:pw@127.0.0.1:6379".into())
    );
    assert_eq!(redis.key_prefix, "x");
    assert_eq!(
        (redis.ttl, redis.refresh),
        (Duration::from_secs(300), Duration::from_secs(240))
    );
    assert_eq!(redis.gc_interval, Duration::from_secs(600));
    assert_eq!(redis.unregister_delay, Duration::from_secs(5));
    let private = config.tunnel.unwrap().private_jwt.expect("private jwt");
    assert_eq!(
        (private.issuer.as_str(), private.audience.as_str()),
        ("sluice-node", "sluice-private")
    );
    assert_eq!(
        config.listeners.private.unwrap().address,
        "127.0.0.1:8155".parse().unwrap()
    );

    let errors = errors_of(&format!(
        "tunnel: {{jwt: {{secret_file: '{secret}'}}}}\nredis: {{url: 'http://x', ttl: 1m, refresh: 2m}}\n"
    ));
    assert_eq!(
        errors,
        vec![
            "redis.url: invalid Redis URL \"http://x\": expected redis://, rediss:// or redis+unix://".to_string(),
            "redis.refresh: must be shorter than redis.ttl, or entries expire between refreshes".to_string(),
            "tunnel.private_jwt.secret_file: is required with redis: nodes sign calls to each other's private endpoints".to_string(),
        ]
    );
    let errors = errors_of("redis: {cluster: ['redis://a:1', 'redis://b:2']}\n");
    assert_eq!(
        errors,
        vec!["redis: is only used by a node with a tunnel section".to_string()]
    );
}

#[test]
fn private_tls_needs_peer_tls_and_peer_tls_is_checked() {
    let (_dir, secret, _) = secret_dir();
    // Any readable file stands in for PEM here: only TLS set-up reads the contents.
    let pem = &secret;
    let base = format!(
        "listeners: {{private: {{tls: {{cert_file: '{pem}', key_file: '{pem}'}}}}}}\nredis: {{url: 'redis://127.0.0.1:1'}}\ntunnel:\n  jwt: {{secret_file: '{secret}'}}\n  private_jwt: {{secret_file: '{secret}'}}\n"
    );
    assert_eq!(
        errors_of(&base),
        vec!["tunnel.peer_tls.ca_file: is required when listeners.private.tls is set: nodes call each other's private endpoints over TLS".to_string()]
    );
    let errors = errors_of(&format!(
        "{base}  peer_tls: {{ca_file: '{pem}', cert_file: '{pem}', server_name: 'not a name!'}}\n"
    ));
    assert_eq!(
        errors,
        vec![
            "tunnel.peer_tls.key_file: is required with cert_file".to_string(),
            "tunnel.peer_tls.server_name: \"not a name!\" is not a valid DNS name or IP address"
                .to_string(),
        ]
    );
    let config = load_str(
        &format!("{base}  peer_tls: {{ca_file: '{pem}', cert_file: '{pem}', key_file: '{pem}', server_name: sluice-private}}\n"),
        "t.yaml",
    )
    .expect("valid");
    let peer = config.tunnel.expect("tunnel").peer_tls.expect("peer tls");
    assert_eq!(peer.server_name.as_deref(), Some("sluice-private"));
    assert!(peer.identity.is_some());
}

#[test]
fn a_redis_password_never_appears_in_errors_or_debug_output() {
    let errors = errors_of("redis: {url: 'http://user:hunter2@redis.example:6379/0'}\n");
    assert!(
        errors
            .iter()
            .any(|error| error.contains("http://user:***@redis.example:6379/0")),
        "{errors:?}"
    );
    assert!(
        errors.iter().all(|error| !error.contains("hunter2")),
        "{errors:?}"
    );
    assert_eq!(crate::redact_url("redis://:pw@h:1"), "redis://:***@h:1");
    assert_eq!(crate::redact_url("redis://pw@h:1/2"), "redis://***@h:1/2");
    assert_eq!(crate::redact_url("redis://h:1"), "redis://h:1");
    let target = crate::RedisTargetConfig::Cluster(vec!["redis://u:hunter2@a:1".into()]);
    assert!(!format!("{target:?}").contains("hunter2"));
}

#[test]
fn peer_allowlist_networks_are_parsed_and_checked() {
    let network = crate::IpNetwork::parse("10.0.0.0/8").unwrap();
    assert!(network.contains("10.200.0.1".parse().unwrap()));
    assert!(!network.contains("11.0.0.1".parse().unwrap()));
    assert_eq!(crate::IpNetwork::parse("10.0.0.1").unwrap().prefix, 32);
    assert!(crate::IpNetwork::parse("::/0")
        .unwrap()
        .contains("2001:db8::1".parse().unwrap()));
    assert!(crate::IpNetwork::parse("10.0.0.0/33").is_none());
    assert!(crate::IpNetwork::parse("example.com/8").is_none());
    let errors = errors_of("tunnel: {peer_allowlist: ['10.0.0.0/8', 'nonsense']}\n");
    assert!(
        errors.iter().any(
            |error| error.starts_with("tunnel.peer_allowlist[1]: invalid network \"nonsense\"")
        ),
        "{errors:?}"
    );
}

#[test]
fn a_gateway_credentials_dir_is_optional_and_must_be_a_readable_directory() {
    let dir = tempfile::tempdir().unwrap();
    let text = |credentials: &str| {
        format!(
            "gateway: {{clusters_dir: '{}'{credentials}}}\n",
            dir.path().display()
        )
    };
    let unset = load_str(&text(""), "gw.yaml").expect("valid");
    assert_eq!(unset.gateway.unwrap().credentials_dir, None);
    let set = load_str(
        &text(&format!(", credentials_dir: '{}'", dir.path().display())),
        "gw.yaml",
    )
    .expect("valid");
    assert_eq!(
        set.gateway.unwrap().credentials_dir.as_deref(),
        Some(dir.path())
    );
    let missing = errors_of(&text(", credentials_dir: /nonexistent/credentials"));
    assert!(
        missing
            .iter()
            .any(|e| e.starts_with("gateway.credentials_dir: cannot read directory")),
        "{missing:?}"
    );
}

#[test]
fn a_gateway_agent_assertion_key_file_is_optional_and_must_be_readable() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("assertion.pem");
    std::fs::write(&key, "pem").unwrap();
    let text = |setting: &str| {
        format!(
            "gateway: {{clusters_dir: '{}'{setting}}}\n",
            dir.path().display()
        )
    };
    let unset = load_str(&text(""), "gw.yaml").expect("valid");
    assert_eq!(unset.gateway.unwrap().agent_assertion_key_file, None);
    let set = load_str(
        &text(&format!(", agent_assertion_key_file: '{}'", key.display())),
        "gw.yaml",
    )
    .expect("valid");
    assert_eq!(
        set.gateway.unwrap().agent_assertion_key_file.as_deref(),
        Some(key.as_path())
    );
    let missing = errors_of(&text(", agent_assertion_key_file: /nonexistent/key.pem"));
    assert!(
        missing.iter().any(|e| e
            .starts_with("gateway.agent_assertion_key_file: cannot read \"/nonexistent/key.pem\"")),
        "{missing:?}"
    );
}

#[test]
fn a_gateway_takes_its_clusters_from_a_directory_or_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let token = dir.path().join("token");
    std::fs::write(&ca, "pem").unwrap();
    std::fs::write(&token, "sluice_x").unwrap();
    let config = load_str(
        &format!(
            "gateway:\n  source:\n    controlplane: {{url: 'https://cp:6443/', name: gw-1, ca_file: '{}', token_file: '{}'}}\n",
            ca.display(),
            token.display()
        ),
        "gw.yaml",
    )
    .expect("valid");
    let Some(GatewayConfig {
        source: ClusterSource::ControlPlane(source),
        ..
    }) = config.gateway
    else {
        panic!("expected a control-plane source");
    };
    assert_eq!(source.url, "https://cp:6443");
    assert_eq!(source.name.as_deref(), Some("gw-1"));
    assert_eq!(source.token_file.as_deref(), Some(token.as_path()));

    let both = errors_of(&format!(
        "gateway:\n  clusters_dir: '{}'\n  source: {{controlplane: {{url: 'https://cp', ca_file: '{}', token_file: '{}'}}}}\n",
        dir.path().display(),
        ca.display(),
        token.display()
    ));
    assert!(
        both.iter()
            .any(|e| e.contains("gateway.source") && e.contains("not both")),
        "{both:?}"
    );
    let clear = errors_of(&format!(
        "gateway:\n  source: {{controlplane: {{url: 'http://cp', ca_file: '{}'}}}}\n",
        ca.display()
    ));
    assert!(
        clear
            .iter()
            .any(|e| e.contains("gateway.source.controlplane.url") && e.contains("https")),
        "{clear:?}"
    );
    assert!(
        clear
            .iter()
            .any(|e| e.contains("gateway.source.controlplane.token_file")),
        "{clear:?}"
    );
    let missing_ca = errors_of(
        "gateway:\n  source: {controlplane: {url: 'https://cp', ca_file: /nonexistent/ca}}\n",
    );
    assert!(
        missing_ca
            .iter()
            .any(|e| e.contains("ca_file") && e.contains("cannot read")),
        "{missing_ca:?}"
    );
}

#[test]
fn a_node_takes_its_agents_from_its_list_or_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let secret = dir.path().join("jwt");
    std::fs::write(&ca, "pem").unwrap();
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").unwrap();
    let both = errors_of(&format!(
        "tunnel:\n  agents: [{{id: 1, token_sha256: '{}'}}]\n  agents_from: {{controlplane: {{url: 'https://cp', ca_file: '{}', cert_file: '{}', key_file: '{}'}}}}\n  jwt: {{secret_file: '{}'}}\n",
        "a".repeat(64),
        ca.display(),
        ca.display(),
        ca.display(),
        secret.display()
    ));
    assert!(
        both.iter()
            .any(|e| e.contains("tunnel.agents_from") && e.contains("not both")),
        "{both:?}"
    );
}

#[test]
fn ebpf_names_the_interfaces_to_count_on() {
    let config = load_str("ebpf:\n  interfaces: [eth0, ens3]\n", "test.yaml").unwrap();
    assert_eq!(
        config.ebpf.map(|ebpf| ebpf.interfaces),
        Some(vec!["eth0".to_string(), "ens3".to_string()])
    );
    assert_eq!(load_str("", "test.yaml").unwrap().ebpf, None);
    assert_eq!(
        errors_of("ebpf:\n  interfaces: [eth0, eth0, a-name-longer-than-15, \"a/b\", [x]]\n"),
        [
            "ebpf.interfaces[1]: \"eth0\" is listed twice",
            "ebpf.interfaces[2]: \"a-name-longer-than-15\" is not an interface name (1 to 15 bytes)",
            "ebpf.interfaces[3]: \"a/b\" is not an interface name (no '/', ':', spaces or control characters)",
            "ebpf.interfaces[4]: expected a single value, found a list",
        ]
    );
    assert_eq!(
        errors_of("ebpf: {}\n"),
        ["ebpf.interfaces: is required: the interfaces to count on (e.g. [eth0]); remove `ebpf:` to count nothing"]
    );
}

#[test]
fn peer_timeouts_are_read_and_bounded() {
    let (_dir, secret, _) = secret_dir();
    let tunnel = |extra: &str| format!("tunnel:\n  jwt: {{secret_file: '{secret}'}}\n{extra}");
    let config = load_str(
        &tunnel("  peer_connect_timeout: 500ms\n  peer_unacked_timeout: 4s\n"),
        "t.yaml",
    )
    .expect("valid");
    let timeouts = config.tunnel.expect("tunnel").peer_timeouts;
    assert_eq!(timeouts.connect, Duration::from_millis(500));
    assert_eq!(timeouts.unacked, Duration::from_secs(4));
    let errors = errors_of(&tunnel(
        "  peer_connect_timeout: 0s\n  peer_unacked_timeout: 1h\n",
    ));
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("tunnel.peer_connect_timeout: 0ns is outside 100ms..=60s")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("tunnel.peer_unacked_timeout: 3600s is outside 1s..=600s")),
        "{errors:?}"
    );
}

#[test]
fn a_secret_file_is_read_only_up_to_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.secret");
    std::fs::write(&big, vec![b'k'; 64 * 1024 + 1]).unwrap();
    let errors = errors_of(&format!(
        "tunnel: {{jwt: {{secret_file: '{}'}}}}\n",
        big.display()
    ));
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("tunnel.jwt.secret_file: ")
                && e.contains("holds more than 65536 bytes")),
        "{errors:?}"
    );
    // /dev/zero never ends: the bound stops the read instead of filling memory.
    let errors = errors_of("tunnel: {jwt: {secret_file: '/dev/zero'}}\n");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("holds more than 65536 bytes")),
        "{errors:?}"
    );
}

#[test]
fn an_agent_only_file_defaults_its_admin_to_9902_and_a_node_keeps_9901() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef").unwrap();
    let secret = dir.path().join("jwt.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").unwrap();
    let agent = format!(
        "agent:\n  token_file: '{}'\n  nodes: ['http://127.0.0.1:8150']\n  forward_to: 'http://127.0.0.1:50051'\n",
        token.display()
    );
    let node = format!("tunnel:\n  jwt: {{secret_file: '{}'}}\n", secret.display());
    let admin = |text: &str| load_str(text, "test.yaml").unwrap().listeners.admin.address;
    assert_eq!(admin(&agent), "127.0.0.1:9902".parse().unwrap());
    assert_eq!(admin(&node), "127.0.0.1:9901".parse().unwrap());
    // A node that also runs an agent (as `sluice up` does) is a node.
    assert_eq!(
        admin(&format!("{node}{agent}")),
        "127.0.0.1:9901".parse().unwrap()
    );
    assert_eq!(
        admin(&format!(
            "{agent}listeners: {{admin: {{address: '127.0.0.1:7000'}}}}\n"
        )),
        "127.0.0.1:7000".parse().unwrap()
    );
}
