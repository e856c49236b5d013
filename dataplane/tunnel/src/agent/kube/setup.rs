//! What the agent task builds once from `agent.kubernetes_api`: the apiserver's TLS client
//! config (its CA, the agent's client certificate if any, ALPN h2), the assertion verifier with
//! the trusted gateway keys, and the apiserver's authority. A bad file fails the start, naming
//! its field.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use http::uri::Authority;
use sluice_config::{KubeCredential, KubernetesApiConfig};
use sluice_kube_tunnel::{AssertionError, AssertionVerifier, VerifierOptions};

use super::KubeMetrics;

/// Why the forwarder could not be set up; [`KubeSetupError::field`] names the config field.
#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    #[error("{0}")]
    Tls(#[from] sluice_grpc::tls::TlsError),
    #[error("{path}: {why}")]
    GatewayKey {
        index: usize,
        path: String,
        why: String,
    },
    #[error("{0:?} is not a valid authority")]
    Authority(String),
}

impl KubeSetupError {
    /// The `agent.kubernetes_api` field whose file or value is wrong.
    pub fn field(&self) -> String {
        match self {
            Self::Tls(_) => "agent.kubernetes_api".into(),
            Self::GatewayKey { index, .. } => {
                format!("agent.kubernetes_api.gateway_keys[{index}]")
            }
            Self::Authority(_) => "agent.kubernetes_api.url".into(),
        }
    }
}

/// Most bytes of one gateway key file (a PEM public key is about 113 bytes).
const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// The forwarder's immutable parts, shared by the agent task's clones.
pub struct KubeSetup {
    pub(super) config: KubernetesApiConfig,
    pub(super) tls: Arc<rustls::ClientConfig>,
    /// The same, offering HTTP/1.1: upgrades cannot go over HTTP/2.
    pub(super) tls_http1: Arc<rustls::ClientConfig>,
    pub(super) authority: Authority,
    /// One replay cache for the whole agent: a lock taken only to verify, never across an
    /// await (the agent's tunnels run on one worker, so it is never contended).
    verifier: Mutex<AssertionVerifier>,
    pub(super) metrics: KubeMetrics,
}

impl std::fmt::Debug for KubeSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSetup")
            .field("url", &self.config.url)
            .finish_non_exhaustive()
    }
}

impl KubeSetup {
    pub fn new(config: KubernetesApiConfig, metrics: KubeMetrics) -> Result<Self, KubeSetupError> {
        let identity = match &config.credential {
            KubeCredential::ClientCertificate {
                cert_file,
                key_file,
            } => Some((cert_file.as_path(), key_file.as_path())),
            KubeCredential::TokenFile(_) => None,
        };
        let tls = sluice_grpc::tls::client_config(Some(&config.ca_file), identity)?;
        let mut http1 = (*tls).clone();
        http1.alpn_protocols = vec![b"http/1.1".to_vec()];
        let keys = config
            .gateway_keys
            .iter()
            .enumerate()
            .map(|(index, path)| read_key(index, path))
            .collect::<Result<Vec<_>, _>>()?;
        let verifier = AssertionVerifier::new(keys, config.agent_id, VerifierOptions::default())
            .map_err(|error| key_error(&config, &error))?;
        let authority = authority(&config.host, config.port)
            .ok_or_else(|| KubeSetupError::Authority(config.url.clone()))?;
        Ok(Self {
            config,
            tls,
            tls_http1: Arc::new(http1),
            authority,
            verifier: Mutex::new(verifier),
            metrics,
        })
    }

    pub(super) fn verifier(&self) -> MutexGuard<'_, AssertionVerifier> {
        self.verifier
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn read_key(index: usize, path: &Path) -> Result<Vec<u8>, KubeSetupError> {
    use std::io::Read;
    let failed = |why: String| KubeSetupError::GatewayKey {
        index,
        path: path.display().to_string(),
        why,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_KEY_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|error| failed(error.to_string()))?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(failed(format!(
            "more than {MAX_KEY_FILE_BYTES} bytes: a key file holds one PEM public key"
        )));
    }
    Ok(bytes)
}

/// The verifier refuses a key without saying which: each is tried alone to name it.
fn key_error(config: &KubernetesApiConfig, error: &AssertionError) -> KubeSetupError {
    for (index, path) in config.gateway_keys.iter().enumerate() {
        let alone = read_key(index, path).and_then(|key| {
            AssertionVerifier::new(vec![key], config.agent_id, VerifierOptions::default()).map_err(
                |error| KubeSetupError::GatewayKey {
                    index,
                    path: path.display().to_string(),
                    why: error.to_string(),
                },
            )
        });
        if let Err(error) = alone {
            return error;
        }
    }
    KubeSetupError::GatewayKey {
        index: 0,
        path: String::new(),
        why: error.to_string(),
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub(super) fn authority(host: &str, port: u16) -> Option<Authority> {
    let text = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_host_and_port_only() {
        assert_eq!(
            authority("api.example", 6443).map(|a| a.to_string()),
            Some("api.example:6443".into())
        );
        assert_eq!(
            authority("fd00::1", 443).map(|a| a.to_string()),
            Some("[fd00::1]:443".into())
        );
        assert!(authority("evil/path", 443).is_none());
    }
}
