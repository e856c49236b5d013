//! `sluice up`: the embedded-defaults demo. One process runs a node, an agent whose tunnels go
//! to that node, and an echo backend behind the agent, with a fresh JWT secret and agent token
//! written to a private temporary directory that is removed on exit.

mod banner;
pub mod cluster;
pub mod controlplane;
pub mod gateway;
pub mod vm;

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use anyhow::Context;
use sha2::{Digest, Sha256};
use sluice_config::{
    AgentConfig, AgentTokenConfig, Config, Endpoint, JwtConfig, PoolConfig, ReconnectConfig,
    TunnelConfig,
};
use sluice_runtime::{Placement, ServerBuilder};
use sluice_tunnel::echo::EchoBackend;

/// The agent id the demo agent gets.
pub const DEMO_AGENT_ID: i64 = 1;

/// What `up` created and must print and clean up.
#[derive(Debug)]
pub struct UpDemo {
    pub dir: PathBuf,
    pub jwt_secret_file: PathBuf,
    /// With `--nodes N` (N > 1): the other nodes and the Redis they share.
    pub cluster: Option<crate::demo::cluster::DemoCluster>,
    /// The apiserver simulator behind the gateway, and its kubeconfig.
    pub gateway: Option<crate::demo::gateway::DemoGateway>,
    /// The embedded control plane the gateway takes its clusters from.
    pub controlplane: Option<crate::demo::controlplane::DemoControlPlane>,
    /// The VM policy demo (or why it did not start), on the embedded control plane.
    pub vm: Option<crate::demo::vm::VmPillar>,
}

impl Drop for UpDemo {
    fn drop(&mut self) {
        // The other nodes, Redis and the simulator stop before their directory goes; the VM
        // agent before the control plane it watches.
        self.vm = None;
        self.cluster = None;
        self.controlplane = None;
        self.gateway = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Creates `dir` for this process alone (mode 0700). One that exists already was left by an
/// earlier `up` with the same process id, killed before it could remove it: no live process
/// owns it (two live processes never share an id), so it goes first. Without that, a reused
/// id made `up` fail with "File exists".
fn fresh_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot remove {}, left by an earlier run", dir.display()))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
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
        fresh_private_dir(&dir)?;
        let demo = UpDemo {
            jwt_secret_file: dir.join("jwt.secret"),
            dir,
            cluster: None,
            gateway: None,
            controlplane: None,
            vm: None,
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
        config.tunnel = Some(demo_tunnel(
            secret.into_bytes(),
            demo.jwt_secret_file.clone(),
            &agent_token,
        ));
        config.agent = Some(demo_agent(agent_token));

        // The Kubernetes API gateway in front of an apiserver simulator.
        let gateway = crate::demo::gateway::DemoGateway::start(&demo.dir)?;
        let mut gateway_listener = config.listeners.admin.clone();
        gateway_listener.address = "127.0.0.1:8443".parse()?;
        if ephemeral_ports {
            gateway_listener.address.set_port(0);
        }
        config.listeners.gateway = Some(gateway_listener);
        // The gateway's clusters live in the embedded control plane, which pushes them.
        let mut listen: SocketAddr = "127.0.0.1:6443".parse()?;
        if ephemeral_ports {
            listen.set_port(0);
        }
        let controlplane = crate::demo::controlplane::DemoControlPlane::start(
            &demo.dir.join("controlplane"),
            listen,
            &gateway.cluster_yaml,
        )?;
        config.gateway = Some(sluice_config::GatewayConfig {
            source: sluice_config::ClusterSource::ControlPlane(controlplane.source.clone()),
            // The pushed cluster names the demo's certificates, all in the CA's directory.
            credentials_dir: gateway.ca.parent().map(std::path::Path::to_path_buf),
            reload_interval: std::time::Duration::from_secs(1),
            access_log: Default::default(),
            agent_assertion_key_file: Some(gateway.signing_key.clone()),
        });
        if let Some(agent) = config.agent.as_mut() {
            agent.kubernetes_api = Some(demo_kubernetes_api(&gateway)?);
        }
        let mut demo = demo;
        demo.vm = Some(crate::demo::vm::VmPillar::start(&demo.dir, &controlplane));
        demo.gateway = Some(gateway);
        demo.controlplane = Some(controlplane);
        Ok((config, demo))
    }

    /// The demo across several nodes: the parent process is the first node, runs the agent
    /// and the echo backend; the other nodes are child processes sharing a private
    /// `redis-server`. The agent connects to the last node, so a call to the first one is
    /// routed through Redis and the last node's private endpoint.
    pub fn prepare_cluster(
        nodes: usize,
        ephemeral_ports: bool,
    ) -> anyhow::Result<(Config, UpDemo)> {
        let (single, mut demo) = Self::prepare(ephemeral_ports)?;
        let tunnel = single.tunnel.as_ref().context("demo tunnel section")?;
        let agent = single.agent.clone().context("demo agent section")?;
        let agent_token_sha256 = hex::encode(tunnel.agents[0].token_sha256);
        let private_secret = demo.dir.join("private.secret");
        let private_secret_text = random_hex(32)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&private_secret)
            .and_then(|mut file| {
                std::io::Write::write_all(&mut file, private_secret_text.as_bytes())
            })
            .with_context(|| format!("cannot write {}", private_secret.display()))?;
        let settings = crate::demo::cluster::NodeSettings {
            jwt_secret_file: demo.jwt_secret_file.clone(),
            private_secret_file: private_secret,
            agent_id: DEMO_AGENT_ID,
            agent_token_sha256,
            ephemeral_ports,
        };
        let cluster = crate::demo::cluster::DemoCluster::start(&demo.dir, nodes, &settings)?;
        let first = cluster.first_node_config();
        let mut config = sluice_config::load_file(&first)
            .map_err(|error| anyhow::anyhow!("{error}"))
            .context("the first node's generated config")?;
        config.agent = Some(agent);
        // Node 1 (this process) also runs the demo gateway.
        config.gateway = single.gateway.clone();
        config.listeners.gateway = single.listeners.gateway.clone();
        demo.cluster = Some(cluster);
        Ok((config, demo))
    }

    /// Where the demo agent dials: the last node of a cluster, else this process's node.
    pub fn agent_target(&self) -> Option<std::net::SocketAddr> {
        self.cluster
            .as_ref()
            .and_then(|cluster| cluster.agent_target())
    }
}

/// The demo agent: its token in memory, nodes and backend filled in once addresses are known.
fn demo_agent(token: String) -> AgentConfig {
    AgentConfig {
        token,
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
        kubernetes_api: None,
    }
}

/// The demo agent's Kubernetes API forwarder: the simulator, reached with the agent's own
/// certificate, on behalf of users the demo gateway vouches for.
fn demo_kubernetes_api(
    gateway: &crate::demo::gateway::DemoGateway,
) -> anyhow::Result<sluice_config::KubernetesApiConfig> {
    let address = gateway.simulator.address();
    let (cert_file, key_file) = gateway.agent_identity.clone();
    Ok(sluice_config::KubernetesApiConfig {
        agent_id: u64::try_from(DEMO_AGENT_ID).context("the demo agent's id")?,
        url: gateway.simulator.url(),
        host: address.ip().to_string(),
        port: address.port(),
        ca_file: gateway.ca.clone(),
        credential: sluice_config::KubeCredential::ClientCertificate {
            cert_file,
            key_file,
        },
        gateway_keys: vec![gateway.signing_public.clone()],
        max_in_flight: 256,
    })
}

/// The demo node's tunnel: the demo agent's token and a fresh JWT secret, generous limits.
fn demo_tunnel(secret: Vec<u8>, secret_file: PathBuf, agent_token: &str) -> TunnelConfig {
    TunnelConfig {
        node_name: "sluice-up".to_string(),
        max_wait: std::time::Duration::from_secs(20),
        max_message_bytes: 32 * 1024 * 1024,
        max_metadata_entries: 512,
        max_metadata_bytes: 64 * 1024,
        max_buffered_bytes: 256 * 1024 * 1024,
        agents: vec![AgentTokenConfig {
            id: DEMO_AGENT_ID,
            token_sha256: Sha256::digest(agent_token.as_bytes()).into(),
        }],
        agents_from: None,
        jwt: JwtConfig {
            secret,
            secret_file,
            issuer: "gitlab".to_string(),
            audience: "gitlab-kas".to_string(),
            leeway: std::time::Duration::from_secs(5),
            max_lifetime: std::time::Duration::from_secs(60),
        },
        private_jwt: None,
        advertise_address: None,
        peer_tls: None,
        peer_allowlist: Vec::new(),
        peer_timeouts: Default::default(),
        splice_private_hop: true,
        agent_limits: Default::default(),
        access_log: Default::default(),
    }
}

impl crate::daemon::RunHook for UpDemo {
    /// Serves the demo's echo backend and points the demo agent at the bound node and backend.
    fn wire(&self, config: &mut Config, server: &mut ServerBuilder) -> anyhow::Result<()> {
        let mut backend_listener = config.listeners.admin.clone();
        backend_listener.address.set_port(0);
        let backend = server.bind("demo-backend", &backend_listener, Placement::Workers)?;
        server.serve(backend, EchoBackend);
        let local_agent_listener = server
            .addresses()
            .into_iter()
            .find(|(name, _)| name == "agent")
            .map(|(_, address)| address);
        let agent_address = self
            .agent_target()
            .or(local_agent_listener)
            .context("the demo needs an agent listener")?;
        if let Some(agent) = config.agent.as_mut() {
            agent.nodes = vec![endpoint(&agent_address.to_string())];
            agent.forward_to = endpoint(&server.local_addr(backend).to_string());
        }
        Ok(())
    }

    /// Once everything listens: writes the gateway's kubeconfig and prints how to try each part.
    fn announce(
        &self,
        workers: usize,
        driver: &str,
        addresses: &[(String, SocketAddr)],
    ) -> anyhow::Result<()> {
        let gateway_address = addresses
            .iter()
            .find(|(name, _)| name == "gateway")
            .map(|(_, address)| *address);
        if let (Some(gateway), Some(address)) = (&self.gateway, gateway_address) {
            gateway.write_kubeconfig(address)?;
        }
        banner::print_banner(workers, driver, addresses, self);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::fresh_private_dir;

    #[test]
    fn a_directory_left_by_an_earlier_run_is_replaced_by_an_empty_private_one() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("sluice-up-1");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("jwt.secret"), "an earlier run's").unwrap();

        fresh_private_dir(&dir).unwrap();

        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let new = parent.path().join("sluice-up-2");
        fresh_private_dir(&new).unwrap();
        assert!(new.is_dir());
    }
}
