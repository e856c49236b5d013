//! The gateway part of `sluice up`: an apiserver **simulator** (not Kubernetes; see
//! `sluice-apiserver-sim`) behind the gateway, fresh certificates for both and for a demo user,
//! and a kubeconfig that works as printed.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use sluice_apiserver_sim::{ApiServer, ApiServerOptions};

/// The demo cluster's name, also the TLS server name kubectl sends.
pub const DEMO_CLUSTER_HOST: &str = "kube.sluice.local";
/// The demo cluster behind NAT: its only server is the demo agent, which reaches the same
/// simulator through its reverse tunnel (the gateway never dials it for this cluster).
pub const BEHIND_NAT_HOST: &str = "behind-nat.sluice.local";
/// The kubeconfig context that reaches [`BEHIND_NAT_HOST`].
pub const BEHIND_NAT_CONTEXT: &str = "behind-nat";

/// The simulator and the files the demo wrote (inside the demo directory).
pub struct DemoGateway {
    pub simulator: ApiServer,
    pub clusters_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub(crate) ca: PathBuf,
    user_cert: PathBuf,
    user_key: PathBuf,
    /// The clusters the control plane pushes: the direct one, then the one behind NAT.
    pub(crate) cluster_yaml: Vec<String>,
    /// The gateway's Ed25519 key for assertions, and the public half the demo agent trusts.
    pub(crate) signing_key: PathBuf,
    pub(crate) signing_public: PathBuf,
    /// The demo agent's own client certificate towards the simulator.
    pub(crate) agent_identity: (PathBuf, PathBuf),
}

impl std::fmt::Debug for DemoGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoGateway")
            .field("simulator", &self.simulator.address())
            .field("clusters_dir", &self.clusters_dir)
            .finish_non_exhaustive()
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

impl DemoGateway {
    /// Certificates, the simulator with one pod, and the cluster directory.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let tls = dir.join("gateway-tls");
        std::fs::create_dir_all(&tls)
            .with_context(|| format!("cannot create {}", tls.display()))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sluice up demo CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let ca_path = write(&tls, "ca.pem", &ca.pem())?;

        let issue = |name: &str,
                     sans: Vec<String>,
                     organization: Option<&str>,
                     usage: ExtendedKeyUsagePurpose|
         -> anyhow::Result<(PathBuf, PathBuf)> {
            let mut params = CertificateParams::new(sans)?;
            params.distinguished_name.push(DnType::CommonName, name);
            if let Some(organization) = organization {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, organization);
            }
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca)?;
            Ok((
                write(&tls, &format!("{name}.pem"), &cert.pem())?,
                write(&tls, &format!("{name}-key.pem"), &key.serialize_pem())?,
            ))
        };
        let (server_cert, server_key) = issue(
            DEMO_CLUSTER_HOST,
            vec![
                DEMO_CLUSTER_HOST.to_string(),
                BEHIND_NAT_HOST.to_string(),
                "127.0.0.1".to_string(),
            ],
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (gateway_cert, gateway_key) = issue(
            "sluice-gateway",
            Vec::new(),
            None,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let agent_identity = issue(
            "sluice-up-agent",
            Vec::new(),
            None,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let signing = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let signing_key = write(&tls, "gateway-signing.pem", &signing.serialize_pem())?;
        let signing_public = write(&tls, "gateway-signing.pub.pem", &signing.public_key_pem())?;
        let (user_cert, user_key) = issue(
            "demo-user",
            Vec::new(),
            Some("demo-team"),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;

        let simulator =
            ApiServer::start_with(ApiServerOptions::new(&server_cert, &server_key, &ca_path))
                .context("cannot start the apiserver simulator")?;
        simulator.create_pod("default", "hello-sluice");

        let clusters_dir = dir.join("clusters");
        std::fs::create_dir_all(&clusters_dir)
            .with_context(|| format!("cannot create {}", clusters_dir.display()))?;
        let cluster = |host: &str, server: &str, extra: &str| {
            format!(
                "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {host}\nspec:\n  servers:\n  - {server}\n  clientConfig:\n    certFile: {gateway_cert}\n    keyFile: {gateway_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {server_cert}\n    keyFile: {server_key}\n    clientCAFile: {ca}\n{extra}",
                gateway_cert = gateway_cert.display(),
                gateway_key = gateway_key.display(),
                ca = ca_path.display(),
                server_cert = server_cert.display(),
                server_key = server_key.display(),
            )
        };
        let direct = cluster(
            DEMO_CLUSTER_HOST,
            &format!("endpoint: {}", simulator.url()),
            "    extraHostnames: ['127.0.0.1']\n",
        );
        let behind_nat = cluster(
            BEHIND_NAT_HOST,
            &format!("agent: {{id: {}}}", crate::demo::DEMO_AGENT_ID),
            "",
        );
        write(
            &clusters_dir,
            "demo.yaml",
            &format!("# Generated by `sluice up`: the gateway in front of an apiserver simulator.\n{direct}"),
        )?;
        write(
            &clusters_dir,
            "behind-nat.yaml",
            &format!("# Generated by `sluice up`: the same simulator, reached only through the demo agent's tunnel.\n{behind_nat}"),
        )?;
        Ok(Self {
            simulator,
            kubeconfig: dir.join("kubeconfig"),
            clusters_dir,
            ca: ca_path,
            user_cert,
            user_key,
            cluster_yaml: vec![direct, behind_nat],
            signing_key,
            signing_public,
            agent_identity,
        })
    }

    /// Writes the kubeconfig for the gateway's bound address.
    pub fn write_kubeconfig(&self, gateway: std::net::SocketAddr) -> anyhow::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sluice-up\n  cluster:\n    server: https://{gateway}\n    certificate-authority: {ca}\n    tls-server-name: {DEMO_CLUSTER_HOST}\n- name: {BEHIND_NAT_CONTEXT}\n  cluster:\n    server: https://{gateway}\n    certificate-authority: {ca}\n    tls-server-name: {BEHIND_NAT_HOST}\nusers:\n- name: demo-user\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: sluice-up\n  context: {{cluster: sluice-up, user: demo-user, namespace: default}}\n- name: {BEHIND_NAT_CONTEXT}\n  context: {{cluster: {BEHIND_NAT_CONTEXT}, user: demo-user, namespace: default}}\ncurrent-context: sluice-up\n",
            ca = self.ca.display(),
            cert = self.user_cert.display(),
            key = self.user_key.display(),
        );
        std::fs::write(&self.kubeconfig, text)
            .with_context(|| format!("cannot write {}", self.kubeconfig.display()))
    }
}
