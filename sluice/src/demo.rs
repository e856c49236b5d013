//! `sluice up`: the embedded-defaults demo. One process runs a node, an agent whose tunnels go
//! to that node, and an echo backend behind the agent, with a fresh JWT secret and agent token
//! written to a private temporary directory that is removed on exit.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use anyhow::Context;
use sha2::{Digest, Sha256};
use sluice_config::{
    AgentConfig, AgentTokenConfig, Config, Endpoint, JwtConfig, PoolConfig, ReconnectConfig,
    TunnelConfig,
};

/// The agent id the demo agent gets.
pub const DEMO_AGENT_ID: i64 = 1;

/// What `up` created and must print and clean up.
#[derive(Debug)]
pub struct UpDemo {
    pub dir: PathBuf,
    pub jwt_secret_file: PathBuf,
}

impl Drop for UpDemo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut buffer))
        .context("cannot read /dev/urandom")?;
    Ok(hex::encode(buffer))
}

fn endpoint(address: &str) -> Endpoint {
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "0"));
    Endpoint {
        url: format!("http://{address}"),
        tls: false,
        host: host.to_string(),
        port: port.parse().unwrap_or(0),
    }
}

impl UpDemo {
    /// The demo config (the agent's node and backend addresses are filled in once bound).
    pub fn prepare(ephemeral_ports: bool) -> anyhow::Result<(Config, UpDemo)> {
        let mut config = Config::embedded_defaults()?;
        let dir = std::env::temp_dir().join(format!("sluice-up-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let demo = UpDemo {
            jwt_secret_file: dir.join("jwt.secret"),
            dir,
        };
        let secret = random_hex(32)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&demo.jwt_secret_file)
            .and_then(|mut file| std::io::Write::write_all(&mut file, secret.as_bytes()))
            .with_context(|| format!("cannot write {}", demo.jwt_secret_file.display()))?;
        let agent_token = random_hex(24)?;

        let mut listener = config.listeners.admin.clone();
        listener.address = "127.0.0.1:8150".parse()?;
        let agent_listener = listener.clone();
        listener.address = "127.0.0.1:8151".parse()?;
        let external_listener = listener;
        config.listeners.agent = Some(agent_listener);
        config.listeners.external = Some(external_listener);
        if ephemeral_ports {
            config.listeners.admin.address.set_port(0);
            for listener in [&mut config.listeners.agent, &mut config.listeners.external]
                .into_iter()
                .flatten()
            {
                listener.address.set_port(0);
            }
        }
        config.tunnel = Some(TunnelConfig {
            node_name: "sluice-up".to_string(),
            max_wait: std::time::Duration::from_secs(20),
            max_message_bytes: 32 * 1024 * 1024,
            agents: vec![AgentTokenConfig {
                id: DEMO_AGENT_ID,
                token_sha256: Sha256::digest(agent_token.as_bytes()).into(),
            }],
            jwt: JwtConfig {
                secret: secret.into_bytes(),
                secret_file: demo.jwt_secret_file.clone(),
                issuer: "gitlab".to_string(),
                audience: "gitlab-kas".to_string(),
                leeway: std::time::Duration::from_secs(5),
                max_lifetime: std::time::Duration::from_secs(60),
            },
            private_jwt: None,
            advertise_address: None,
            peer_tls: None,
        });
        config.agent = Some(AgentConfig {
            token: agent_token,
            token_file: PathBuf::new(),
            nodes: Vec::new(),
            ca_file: None,
            forward_to: endpoint("127.0.0.1:0"),
            forward_ca_file: None,
            max_message_bytes: 32 * 1024 * 1024,
            pool: PoolConfig {
                min_idle: 2,
                max: 500,
                grow_by: 10,
                idle_timeout: std::time::Duration::from_secs(60),
            },
            reconnect: ReconnectConfig {
                initial_backoff: std::time::Duration::from_secs(1),
                max_backoff: std::time::Duration::from_secs(20),
            },
        });
        Ok((config, demo))
    }

    /// Points the demo agent at the bound node and backend addresses.
    pub fn wire_agent(
        config: &mut AgentConfig,
        agent_listener: std::net::SocketAddr,
        backend: std::net::SocketAddr,
    ) {
        config.nodes = vec![endpoint(&agent_listener.to_string())];
        config.forward_to = endpoint(&backend.to_string());
    }
}
