//! `agent.kubernetes_api`: the one apiserver the agent forwards the gateway's Kubernetes API
//! requests to, the agent's own credential for it, and the gateway keys it trusts.

use std::path::PathBuf;

use serde_norway::Value;

use super::super::{readable_file, scalar, secret_from_file, unsigned, Errors};
use crate::raw::{Leaf, RawKubernetesApi};
use crate::{KubeCredential, KubernetesApiConfig};

/// Where a pod's service-account files are mounted.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Default of `max_in_flight`, and its bounds.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: u64 = 256;
const MAX_IN_FLIGHT_LIMIT: u64 = 65_536;
/// Most gateway keys one agent trusts (a rotation needs two; a list of thousands is a mistake).
const MAX_GATEWAY_KEYS: usize = 16;

/// The in-cluster apiserver a pod sees (`KUBERNETES_SERVICE_HOST`/`_PORT`), when it runs in one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InCluster {
    pub(crate) host: String,
    pub(crate) port: String,
    /// The service-account directory (a test points it elsewhere).
    pub(crate) dir: PathBuf,
}

impl InCluster {
    /// From this process's environment; `None` outside a pod.
    pub(crate) fn from_env() -> Option<Self> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok()?;
        (!host.is_empty() && !port.is_empty()).then(|| Self {
            host,
            port,
            dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        })
    }

    fn url(&self) -> String {
        if self.host.contains(':') {
            format!("https://[{}]:{}", self.host, self.port)
        } else {
            format!("https://{}:{}", self.host, self.port)
        }
    }

    fn file(&self, name: &str) -> Leaf {
        Some(Value::String(self.dir.join(name).display().to_string()))
    }
}

/// `agent.kubernetes_api`, with the in-cluster defaults when `in_cluster` is given.
pub(crate) fn kubernetes_api(
    raw: &RawKubernetesApi,
    in_cluster: Option<&InCluster>,
    errors: &mut Errors,
) -> Option<KubernetesApiConfig> {
    const P: &str = "agent.kubernetes_api";
    let agent_id = match &raw.agent_id {
        Some(_) => unsigned(
            &raw.agent_id,
            &format!("{P}.agent_id"),
            0,
            (1, i64::MAX as u64),
            errors,
        ),
        None => {
            errors.push(
                format!("{P}.agent_id"),
                "is required: this agent's id on the nodes (tunnel.agents[].id); the gateway's assertions name it",
            );
            0
        }
    };
    let url = match (&raw.url, in_cluster) {
        (Some(value), _) => scalar(value, &format!("{P}.url"), errors),
        (None, Some(pod)) => Some(pod.url()),
        (None, None) => {
            errors.push(
                format!("{P}.url"),
                "is required outside a pod: the apiserver's https://host:port",
            );
            None
        }
    };
    let target = url.and_then(|url| apiserver_url(&url, &format!("{P}.url"), errors));
    let ca_leaf = raw
        .ca_file
        .clone()
        .or_else(|| in_cluster.and_then(|pod| pod.file("ca.crt")));
    let ca_file = readable_file(&ca_leaf, &format!("{P}.ca_file"), true, errors);
    let credential = credential(raw, in_cluster, errors);
    let gateway_keys = gateway_keys(&raw.gateway_keys, errors);
    let max_in_flight = unsigned(
        &raw.max_in_flight,
        &format!("{P}.max_in_flight"),
        DEFAULT_MAX_IN_FLIGHT,
        (1, MAX_IN_FLIGHT_LIMIT),
        errors,
    ) as usize;
    // Any error above fails the whole load; `None` only where no value could be made.
    let ((url, host, port), ca_file, credential) = (target?, ca_file?, credential?);
    Some(KubernetesApiConfig {
        agent_id,
        url,
        host,
        port,
        ca_file,
        credential,
        gateway_keys,
        max_in_flight,
    })
}

/// `https://host[:port]` and nothing else: the agent takes no part of where it connects from a
/// request, so the URL alone says it, and a path, query or user name in it would be ignored.
pub(crate) fn apiserver_url(
    text: &str,
    path: &str,
    errors: &mut Errors,
) -> Option<(String, String, u16)> {
    let invalid = |errors: &mut Errors, why: &str| {
        errors.push(path, format!("invalid URL {text:?}: {why}"));
    };
    let uri = match text.parse::<http::Uri>() {
        Ok(uri) => uri,
        Err(error) => {
            invalid(errors, &error.to_string());
            return None;
        }
    };
    if uri.scheme_str() != Some("https") {
        invalid(
            errors,
            "expected https://host:port (the apiserver is reached over TLS)",
        );
        return None;
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    if authority.contains('@') {
        invalid(
            errors,
            "user information is not allowed (set token_file or client_cert_file)",
        );
        return None;
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        invalid(errors, "expected https://host:port without a path or query");
        return None;
    }
    let Some(host) = uri.host().filter(|host| !host.is_empty()) else {
        invalid(errors, "no host");
        return None;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Some((text.to_string(), host, uri.port_u16().unwrap_or(443)))
}

/// Exactly one credential: a token file or a client certificate and key; in a pod without
/// either, the service account's token.
fn credential(
    raw: &RawKubernetesApi,
    in_cluster: Option<&InCluster>,
    errors: &mut Errors,
) -> Option<KubeCredential> {
    const P: &str = "agent.kubernetes_api";
    let certificate = raw.client_cert_file.is_some() || raw.client_key_file.is_some();
    if raw.token_file.is_some() && certificate {
        errors.push(
            format!("{P}.token_file"),
            "set token_file or client_cert_file/client_key_file, not both",
        );
        return None;
    }
    if certificate {
        let cert = readable_file(
            &raw.client_cert_file,
            &format!("{P}.client_cert_file"),
            true,
            errors,
        );
        let key = readable_file(
            &raw.client_key_file,
            &format!("{P}.client_key_file"),
            true,
            errors,
        );
        return Some(KubeCredential::ClientCertificate {
            cert_file: cert?,
            key_file: key?,
        });
    }
    let leaf = match (&raw.token_file, in_cluster) {
        (Some(value), _) => Some(value.clone()),
        (None, Some(pod)) => pod.file("token"),
        (None, None) => {
            errors.push(
                format!("{P}.token_file"),
                "is required outside a pod (or client_cert_file and client_key_file): the agent's own credential for the apiserver",
            );
            return None;
        }
    };
    let (file, _) = secret_from_file(&leaf, &format!("{P}.token_file"), errors)?;
    Some(KubeCredential::TokenFile(file))
}

fn gateway_keys(raw: &[Value], errors: &mut Errors) -> Vec<PathBuf> {
    const P: &str = "agent.kubernetes_api.gateway_keys";
    if raw.is_empty() {
        errors.push(
            P,
            "is required: the gateway's Ed25519 public key files (PEM); the agent accepts only identities they signed",
        );
    }
    if raw.len() > MAX_GATEWAY_KEYS {
        errors.push(P, format!("{} keys: at most {MAX_GATEWAY_KEYS}", raw.len()));
        return Vec::new();
    }
    raw.iter()
        .enumerate()
        .filter_map(|(index, value)| {
            readable_file(&Some(value.clone()), &format!("{P}[{index}]"), true, errors)
        })
        .collect()
}

#[cfg(test)]
#[path = "agent_kube_tests.rs"]
mod tests;
