//! `sluice controlplane token create`: issues a token, stores its digest through the API (as
//! an admin, from a kubeconfig) and prints the token once.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde_json::Value;
use sluice_apiserver::auth::{issue, Identity, Role};
use sluice_watch_client::{Transport, WatchClientConfig};

/// Issues a token for `role`/`subject` on the control plane `kubeconfig` points at.
pub fn create_token(kubeconfig: &Path, role: &str, subject: &str) -> anyhow::Result<String> {
    let role: Role = role.parse()?;
    let identity = Identity::new(role, subject)?;
    let issued = issue(identity)?;
    let access = Access::from_kubeconfig(kubeconfig)?;
    let spec = sluice_apiserver::kinds::token();
    let object = serde_json::json!({
        "apiVersion": spec.api_version(),
        "kind": spec.kind,
        "metadata": {"name": format!("{role}.{subject}.{}", &issued.record.sha256[..8])},
        "spec": {"role": role.as_str(), "subject": subject, "tokenSha256": issued.record.sha256},
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut config = WatchClientConfig::new(access.server.clone(), access.ca_file.path());
        config.token_file = Some(access.token_file.path().to_path_buf());
        let transport = Transport::new(&config)?;
        let path = format!("/apis/{}/{}/{}", spec.group, spec.version, spec.plural);
        transport
            .post_json(&path, Bytes::from(serde_json::to_vec(&object)?), 1 << 20)
            .await
            .with_context(|| format!("storing the token on {}", access.server))?;
        anyhow::Ok(())
    })?;
    Ok(issued.secret)
}

/// The server, CA and admin token of a kubeconfig's current context, the CA and token in
/// private temporary files for the HTTPS client.
struct Access {
    server: String,
    ca_file: tempfile::NamedTempFile,
    token_file: tempfile::NamedTempFile,
}

impl Access {
    fn from_kubeconfig(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
        let document: Value = serde_norway::from_str(&text)
            .with_context(|| format!("{}: not a kubeconfig", path.display()))?;
        let context_name = document["current-context"].as_str().unwrap_or_default();
        let named = |list: &str, name: &str| -> anyhow::Result<Value> {
            document[list]
                .as_array()
                .and_then(|items| items.iter().find(|item| item["name"] == name))
                .cloned()
                .with_context(|| format!("{}: no {list} entry named {name:?}", path.display()))
        };
        let context = named("contexts", context_name)?;
        let cluster = named(
            "clusters",
            context["context"]["cluster"].as_str().unwrap_or(""),
        )?;
        let user = named("users", context["context"]["user"].as_str().unwrap_or(""))?;
        let server = cluster["cluster"]["server"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let ca_pem = match cluster["cluster"]["certificate-authority-data"].as_str() {
            Some(data) => {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .context("certificate-authority-data is not base64")?;
                String::from_utf8(bytes).context("certificate-authority-data is not PEM")?
            }
            None => match cluster["cluster"]["certificate-authority"].as_str() {
                Some(file) => std::fs::read_to_string(PathBuf::from(file))
                    .with_context(|| format!("reading {file}"))?,
                None => bail!(
                    "{}: the cluster names no certificate authority",
                    path.display()
                ),
            },
        };
        let Some(token) = user["user"]["token"].as_str() else {
            bail!("{}: the user has no bearer token", path.display());
        };
        Ok(Self {
            server,
            ca_file: private_file(&ca_pem)?,
            token_file: private_file(token)?,
        })
    }
}

fn private_file(text: &str) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::NamedTempFile::new()?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(file)
}
