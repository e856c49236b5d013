#![allow(clippy::unwrap_used)]

use super::*;

fn files() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for name in ["ca.crt", "token", "gateway.pub", "client.crt", "client.key"] {
        std::fs::write(dir.path().join(name), "content\n").unwrap();
    }
    let path = dir.path().display().to_string();
    (dir, path)
}

fn raw(yaml: &str) -> RawKubernetesApi {
    serde_norway::from_str(yaml).unwrap()
}

fn check(yaml: &str, pod: Option<&InCluster>) -> (Option<KubernetesApiConfig>, Vec<String>) {
    let mut errors = Errors::default();
    let config = kubernetes_api(&raw(yaml), pod, &mut errors);
    let listed = match errors.finish("agent.yaml") {
        Ok(()) => Vec::new(),
        Err(invalid) => invalid.errors.iter().map(ToString::to_string).collect(),
    };
    (config, listed)
}

#[test]
fn a_full_section_is_read() {
    let (_dir, d) = files();
    let (config, errors) = check(
        &format!("agent_id: 42\nurl: https://api.example:6443\nca_file: {d}/ca.crt\ntoken_file: {d}/token\ngateway_keys: ['{d}/gateway.pub']\nmax_in_flight: 8\n"),
        None,
    );
    assert_eq!(errors, Vec::<String>::new());
    let config = config.unwrap();
    assert_eq!(config.agent_id, 42);
    assert_eq!((config.host.as_str(), config.port), ("api.example", 6443));
    assert_eq!(
        config.credential,
        KubeCredential::TokenFile(format!("{d}/token").into())
    );
    assert_eq!(config.gateway_keys.len(), 1);
    assert_eq!(config.max_in_flight, 8);
}

#[test]
fn in_a_pod_the_service_account_is_the_default() {
    let (_dir, d) = files();
    let pod = InCluster {
        host: "fd00::1".into(),
        port: "443".into(),
        dir: d.clone().into(),
    };
    let (config, errors) = check(
        &format!("agent_id: 1\ngateway_keys: ['{d}/gateway.pub']\n"),
        Some(&pod),
    );
    assert_eq!(errors, Vec::<String>::new());
    let config = config.unwrap();
    assert_eq!(config.url, "https://[fd00::1]:443");
    assert_eq!(config.host, "fd00::1");
    assert_eq!(config.ca_file, PathBuf::from(format!("{d}/ca.crt")));
    assert_eq!(
        config.credential,
        KubeCredential::TokenFile(format!("{d}/token").into())
    );
    assert_eq!(config.max_in_flight, DEFAULT_MAX_IN_FLIGHT as usize);
}

#[test]
fn a_url_with_more_than_scheme_host_and_port_is_refused() {
    let (_dir, d) = files();
    for (url, why) in [
        ("http://api:6443", "expected https://host:port"),
        ("https://api:6443/prefix", "without a path or query"),
        ("https://api:6443/?x=1", "without a path or query"),
        (
            "https://user:pw@api:6443",
            "user information is not allowed",
        ),
        ("api:6443", "expected https://host:port"),
    ] {
        let (_, errors) = check(
            &format!("agent_id: 1\nurl: '{url}'\nca_file: {d}/ca.crt\ntoken_file: {d}/token\ngateway_keys: ['{d}/gateway.pub']\n"),
            None,
        );
        assert_eq!(errors.len(), 1, "{url}: {errors:?}");
        assert!(
            errors[0].contains("agent.kubernetes_api.url") && errors[0].contains(why),
            "{url}: {errors:?}"
        );
    }
}

#[test]
fn every_missing_or_conflicting_field_is_named() {
    let (_dir, d) = files();
    let (config, errors) = check("{}", None);
    assert!(config.is_none());
    let joined = errors.join("\n");
    for field in ["agent_id", "url", "ca_file", "token_file", "gateway_keys"] {
        assert!(
            joined.contains(&format!("agent.kubernetes_api.{field}: is required")),
            "{field}: {joined}"
        );
    }
    let (_, errors) = check(
        &format!("agent_id: 0\nurl: https://a\nca_file: {d}/ca.crt\ntoken_file: {d}/token\nclient_cert_file: {d}/client.crt\ngateway_keys: ['/nonexistent.pub']\nmax_in_flight: 0\n"),
        None,
    );
    let joined = errors.join("\n");
    assert!(joined.contains("agent_id: 0 is out of range"), "{joined}");
    assert!(
        joined.contains("token_file: set token_file or client_cert_file"),
        "{joined}"
    );
    assert!(joined.contains("gateway_keys[0]: cannot read"), "{joined}");
    assert!(
        joined.contains("max_in_flight: 0 is out of range 1..=65536"),
        "{joined}"
    );
}

#[test]
fn a_client_certificate_needs_its_key() {
    let (_dir, d) = files();
    let (_, errors) = check(
        &format!("agent_id: 1\nurl: https://a\nca_file: {d}/ca.crt\nclient_cert_file: {d}/client.crt\ngateway_keys: ['{d}/gateway.pub']\n"),
        None,
    );
    assert_eq!(
        errors,
        vec!["agent.kubernetes_api.client_key_file: is required".to_string()]
    );
    let (config, errors) = check(
        &format!("agent_id: 1\nurl: https://a\nca_file: {d}/ca.crt\nclient_cert_file: {d}/client.crt\nclient_key_file: {d}/client.key\ngateway_keys: ['{d}/gateway.pub']\n"),
        None,
    );
    assert_eq!(errors, Vec::<String>::new());
    assert!(matches!(
        config.unwrap().credential,
        KubeCredential::ClientCertificate { .. }
    ));
}
