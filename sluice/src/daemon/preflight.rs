//! What a start reads beyond the config file itself (certificates, keys, CA bundles, the
//! gateway's cluster files, the control plane's client material), loaded with the start's own
//! functions so `sluice check-config` and `sluice run` refuse the same files with the same
//! messages, each naming the config field that points at the bad file.
//!
//! Secret and token files are read (and bounded) by `sluice_config::load_file` already.

use std::path::Path;

use prometheus_client::registry::Registry;
use sluice_config::{
    ClusterSource, Config, ControlPlaneSource, FieldError, InvalidConfig, ServerTlsConfig,
};
use sluice_grpc::tls::{load_certificates, load_private_key, root_store, TlsError};
use sluice_upstream_cluster::AgentReach;

/// Every error a start would hit loading the files `config` names, or `Ok` if there is none.
/// `origin` is the config file, as in the config's own errors.
pub fn check(config: &Config, origin: &str) -> Result<(), InvalidConfig> {
    let mut errors = Vec::new();
    for (name, listener) in config.listeners.data_listeners() {
        if let Some(tls) = listener.and_then(|listener| listener.tls.as_ref()) {
            listener_tls(&format!("listeners.{name}.tls"), tls, &mut errors);
        }
    }
    if let Some(tunnel) = &config.tunnel {
        if let Some(peer) = &tunnel.peer_tls {
            let identity = peer.identity.as_ref();
            let (cert, key) = (identity.map(|(c, _)| c), identity.map(|(_, k)| k));
            client_tls(
                "tunnel.peer_tls",
                Some(&peer.ca_file),
                cert,
                key,
                &mut errors,
            );
        }
        if let Some(source) = &tunnel.agents_from {
            controlplane("tunnel.agents_from.controlplane", source, &mut errors);
        }
    }
    if let Some(agent) = &config.agent {
        agent_tls(agent, &mut errors);
    }
    if let Some(gateway) = &config.gateway {
        if let Some(key) = &gateway.agent_assertion_key_file {
            if let Err(error) = super::assertion_key::read(key) {
                let field = super::assertion_key::FIELD;
                errors.push(FieldError::new(field, error.to_string()));
            }
        }
        match &gateway.source {
            ClusterSource::Directory(dir) => clusters(dir, agent_reach(config), &mut errors),
            ClusterSource::ControlPlane(source) => {
                controlplane("gateway.source.controlplane", source, &mut errors)
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(InvalidConfig {
            origin: origin.to_string(),
            errors,
        })
    }
}

/// A listener's certificate, key and client CA one by one (so the error names the field),
/// then together as the start builds them (a key that does not match its certificate).
fn listener_tls(field: &str, tls: &ServerTlsConfig, errors: &mut Vec<FieldError>) {
    let before = errors.len();
    push(
        errors,
        &format!("{field}.cert_file"),
        load_certificates(&tls.cert_file),
    );
    push(
        errors,
        &format!("{field}.key_file"),
        load_private_key(&tls.key_file),
    );
    if let Some(ca) = &tls.client_ca_file {
        push(errors, &format!("{field}.client_ca_file"), root_store(ca));
    }
    if errors.len() == before {
        let built = sluice_grpc::tls::server_config(
            &tls.cert_file,
            &tls.key_file,
            tls.client_ca_file.as_deref(),
        );
        push(errors, field, built);
    }
}

/// A client's CA and optional identity, one by one and then as the start builds them.
fn client_tls(
    field: &str,
    ca: Option<&Path>,
    cert: Option<&std::path::PathBuf>,
    key: Option<&std::path::PathBuf>,
    errors: &mut Vec<FieldError>,
) {
    let before = errors.len();
    if let Some(ca) = ca {
        push(errors, &format!("{field}.ca_file"), root_store(ca));
    }
    if let Some(cert) = cert {
        push(
            errors,
            &format!("{field}.cert_file"),
            load_certificates(cert),
        );
    }
    if let Some(key) = key {
        push(errors, &format!("{field}.key_file"), load_private_key(key));
    }
    if errors.len() == before {
        let identity = cert.zip(key).map(|(c, k)| (c.as_path(), k.as_path()));
        push(errors, field, sluice_grpc::tls::client_config(ca, identity));
    }
}

/// The agent's CA files, then the agent task as the start builds it.
fn agent_tls(agent: &sluice_config::AgentConfig, errors: &mut Vec<FieldError>) {
    let before = errors.len();
    if let Some(ca) = &agent.ca_file {
        push(errors, "agent.ca_file", root_store(ca));
    }
    if let Some(ca) = &agent.forward_ca_file {
        push(errors, "agent.forward_ca_file", root_store(ca));
    }
    if let Some(kube) = &agent.kubernetes_api {
        kubernetes_api_tls(kube, errors);
    }
    if errors.len() == before {
        let metrics = sluice_tunnel::agent::AgentMetrics::register(&mut Registry::default());
        if let Err(error) = sluice_tunnel::agent::AgentTask::new(agent.clone(), metrics) {
            errors.push(FieldError::new(error.field(), error.to_string()));
        }
    }
}

/// `agent.kubernetes_api`: the apiserver's CA and the agent's client certificate, one by one
/// (the gateway keys are read by the agent task below, which names their field).
fn kubernetes_api_tls(kube: &sluice_config::KubernetesApiConfig, errors: &mut Vec<FieldError>) {
    let (cert, key) = match &kube.credential {
        sluice_config::KubeCredential::ClientCertificate {
            cert_file,
            key_file,
        } => (Some(cert_file), Some(key_file)),
        sluice_config::KubeCredential::TokenFile(_) => (None, None),
    };
    let before = errors.len();
    push(
        errors,
        "agent.kubernetes_api.ca_file",
        root_store(&kube.ca_file),
    );
    if let Some(cert) = cert {
        let loaded = load_certificates(cert);
        push(errors, "agent.kubernetes_api.client_cert_file", loaded);
    }
    if let Some(key) = key {
        let loaded = load_private_key(key);
        push(errors, "agent.kubernetes_api.client_key_file", loaded);
    }
    if errors.len() == before {
        let identity = cert.zip(key).map(|(c, k)| (c.as_path(), k.as_path()));
        let built = sluice_grpc::tls::client_config(Some(&kube.ca_file), identity);
        push(errors, "agent.kubernetes_api", built);
    }
}

/// The gateway's cluster files, loaded as the start loads them; then their agent servers
/// against what the same config offers them.
fn clusters(dir: &Path, reach: AgentReach, errors: &mut Vec<FieldError>) {
    let metrics = sluice_gateway_proxy::GatewayMetrics::register(&mut Registry::default(), 1);
    if let Err(error) = sluice_gateway_proxy::Gateway::load(dir, metrics) {
        errors.push(FieldError::new("gateway.clusters_dir", error.to_string()));
        return;
    }
    let mut refused = sluice_upstream_cluster::InvalidSources::default();
    if let Ok(loaded) = sluice_upstream_cluster::load_dir(dir) {
        sluice_upstream_cluster::check_agent_servers(&loaded, reach, &mut refused);
    }
    if !refused.is_empty() {
        let error = sluice_gateway_proxy::ProxyError::from(refused);
        errors.push(FieldError::new("gateway.clusters_dir", error.to_string()));
    }
}

/// What this config offers a cluster's agent servers: the tunnel node in the same process and
/// the key the gateway signs users with.
pub(crate) fn agent_reach(config: &Config) -> AgentReach {
    AgentReach {
        tunnel: config.tunnel.is_some(),
        assertion_key: config
            .gateway
            .as_ref()
            .is_some_and(|gateway| gateway.agent_assertion_key_file.is_some()),
    }
}

/// The control plane's URL, CA and client certificate, as the start's watch transport loads them.
fn controlplane(field: &str, source: &ControlPlaneSource, errors: &mut Vec<FieldError>) {
    let config = super::watch_client_config(source);
    if let Err(error) = sluice_watch_client::Transport::new(&config) {
        errors.push(FieldError::new(field, error.to_string()));
    }
}

fn push<T>(errors: &mut Vec<FieldError>, field: &str, result: Result<T, TlsError>) {
    if let Err(error) = result {
        errors.push(FieldError::new(field, error.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_external_tls(cert: &Path, key: &Path) -> Config {
        let mut config = sluice_config::load_str(
            "listeners: {admin: {address: '127.0.0.1:0'}}\n",
            "test.yaml",
        )
        .unwrap();
        let mut external = config.listeners.admin.clone();
        external.tls = Some(ServerTlsConfig {
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
            client_ca_file: None,
        });
        config.listeners.external = Some(external);
        config
    }

    #[test]
    fn a_garbage_certificate_names_its_field_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a PEM at all\n").unwrap();
        let config = config_with_external_tls(&garbage, &garbage);
        let error = check(&config, "test.yaml").unwrap_err();
        let lines: Vec<String> = error.to_string().lines().map(str::to_string).collect();
        let shown = garbage.display();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "test.yaml: listeners.external.tls.cert_file: {shown}: "
            )),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with(&format!(
                "test.yaml: listeners.external.tls.key_file: {shown}: "
            )),
            "{lines:?}"
        );
    }

    #[test]
    fn a_gateway_key_that_is_no_public_key_names_its_field() {
        let certs = test_support::Certificates::generate(&[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (token, key) = (dir.path().join("token"), dir.path().join("gateway.pub"));
        std::fs::write(&token, "agent-token\n").unwrap();
        std::fs::write(&key, "not a PEM key\n").unwrap();
        let yaml = format!(
            "agent:\n  token_file: '{t}'\n  nodes: ['http://127.0.0.1:8150']\n  forward_to: 'http://127.0.0.1:50051'\n  kubernetes_api:\n    agent_id: 42\n    url: 'https://127.0.0.1:6443'\n    ca_file: '{ca}'\n    token_file: '{t}'\n    gateway_keys: ['{k}']\n",
            t = token.display(),
            ca = certs.ca_cert.display(),
            k = key.display(),
        );
        let config = sluice_config::load_str(&yaml, "agent.yaml").unwrap();
        let error = check(&config, "agent.yaml").unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "agent.yaml: agent.kubernetes_api.gateway_keys[0]: {}: ",
                key.display()
            )),
            "{error}"
        );
        std::fs::write(
            &key,
            test_support::Ed25519Keys::generate().unwrap().public_pem,
        )
        .unwrap();
        assert!(check(&config, "agent.yaml").is_ok());
    }

    #[test]
    fn a_config_that_reads_no_files_passes() {
        let config = sluice_config::load_str(
            "listeners: {admin: {address: '127.0.0.1:0'}}\n",
            "test.yaml",
        )
        .unwrap();
        assert!(check(&config, "test.yaml").is_ok());
    }
}
