use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `sluice --version`: the release and the git commit it was built from ("unknown" when built
/// outside a git checkout, e.g. from a source tarball), as `sluice_build_info{revision}` says.
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{} (commit {})",
        env!("CARGO_PKG_VERSION"),
        sluice_admin::REVISION
    )
});

/// Sluice: a thread-per-core data-plane daemon.
#[derive(Debug, Parser)]
#[command(name = "sluice", version = VERSION.as_str(), about)]
pub struct Cli {
    /// `--addresses-file` given before the subcommand, as scripts written for earlier
    /// versions do; hidden, since it means something only to the roles that bind listeners.
    #[arg(long, value_name = "PATH", hide = true)]
    pub addresses_file: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a demo on embedded defaults (loopback only, no files needed) and print how to try
    /// it: a node, an agent connected to it and an echo backend behind the agent; a Kubernetes
    /// API gateway in front of an apiserver simulator, its clusters from an embedded control
    /// plane (kubectl works with both); as root with Open vSwitch, the VM policy demo on two
    /// namespace VMs. Ctrl-C, SIGTERM or SIGHUP (terminal closed) stops it and removes
    /// everything it made.
    Up {
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// Bind every listener to an OS-chosen free port instead of the default ports.
        #[arg(long)]
        ephemeral_ports: bool,
        /// Run this many nodes over a private redis-server (needs `redis-server` installed):
        /// this process is node 1, the others are child processes; the demo agent connects to
        /// the last node, so calls to node 1 are routed through Redis to it.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=9))]
        nodes: u8,
        /// Log format of this process (the other nodes of --nodes log text to their files).
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormatArg,
        #[command(flatten)]
        addresses: AddressesArg,
    },
    /// Run the daemon with a configuration file.
    Run {
        /// Path of the YAML configuration (see docs/CONFIG.md).
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// Where other nodes dial this node's private endpoint, `IP:PORT` (an IPv6 address in
        /// brackets): replaces `tunnel.advertise_address`, so one file serves every node of a
        /// cluster (Kubernetes: `--advertise-address=$(POD_IP):8155`, the pod's IP from the
        /// downward API). Needs a `tunnel` section.
        #[arg(long, value_name = "IP:PORT")]
        advertise_address: Option<std::net::SocketAddr>,
        #[command(flatten)]
        addresses: AddressesArg,
    },
    /// Run the agent: dial out to nodes, keep tunnels open, forward calls to a local backend.
    Agent {
        /// YAML configuration with an `agent` section (see docs/CONFIG.md).
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
        #[command(flatten)]
        addresses: AddressesArg,
    },
    /// Enforce VM NetworkPolicies on an Open vSwitch bridge (see docs/VM-POLICY.md): from a
    /// file or directory (hot reloaded) with --policies, or one VM's from the control plane
    /// with --controlplane and --vm; serves /metrics, /healthz and /readyz on --admin.
    VmAgent(VmAgentArgs),
    /// Run the control plane: a kube-like API server (kubectl works with it) that pushes
    /// routes, agents and policies to gateways, nodes and VM agents (see docs/CONTROLPLANE.md).
    #[command(args_conflicts_with_subcommands = true)]
    Controlplane {
        #[command(subcommand)]
        command: Option<ControlplaneCommand>,
        #[command(flatten)]
        serve: ControlplaneArgs,
    },
    /// VM NetworkPolicy tools.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// A running node's, agent's, VM agent's or (with --ca) control plane's state from its admin
    /// endpoint, in a few lines:
    /// exit 0 when ready, 3 when not ready, 1 when it cannot be read (2: called wrongly).
    Status {
        /// The admin endpoint, `IP:PORT` or `HOST:PORT` (`listeners.admin.address`: a node's
        /// default 127.0.0.1:9901, an agent's 127.0.0.1:9902; a VM agent's `--admin`,
        /// default 127.0.0.1:9464).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9901", value_parser = admin_address)]
        admin: std::net::SocketAddr,
        /// Read the admin endpoint over HTTPS, trusting this CA (PEM): the control plane's
        /// `<data-dir>/pki/ca.crt`, whose `/readyz` and `/metrics` need no credentials.
        #[arg(long, value_name = "FILE", value_parser = |file: &str| crate::status_cmd::https_with_ca(std::path::Path::new(file)))]
        ca: Option<crate::status_cmd::Transport>,
        #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Call a gRPC method on an agent's backend through a node's external endpoint (a signed
    /// JWT, `sluice-agent-id`) and print the reply: exit 0 on OK, 64 + the gRPC status code
    /// otherwise (78 UNAVAILABLE, 80 UNAUTHENTICATED, ...), the status named on stderr.
    Call(Box<crate::call_cmd::CallArgs>),
    /// Validate a configuration file: print every error with its path and exit 2, or print "ok".
    CheckConfig {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print a shell completion script for this CLI, generated from its definition
    /// (e.g. `sluice completions bash > /usr/share/bash-completion/completions/sluice`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages generated from this CLI's definition into DIR: sluice.1 and one page per
    /// subcommand (sluice-run.1, sluice-controlplane-token-create.1, ...).
    Man {
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

/// `sluice vm-agent`'s flags.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("controlplane_credential")
    .args(["controlplane_token_file", "controlplane_cert"])
    .multiple(true)))]
pub struct VmAgentArgs {
    /// The bridge to enforce on (created on the netdev datapath if missing).
    #[arg(long, value_name = "BRIDGE")]
    pub bridge: String,
    /// Policy file (YAML, or JSON with a .json extension), or a directory whose *.yaml,
    /// *.yml and *.json files are merged.
    #[arg(
        long,
        value_name = "FILE|DIR",
        required_unless_present = "controlplane",
        conflicts_with = "controlplane"
    )]
    pub policies: Option<PathBuf>,
    /// Watch this VM's policies on the control plane (https://host:port) instead of a file;
    /// needs --controlplane-ca and --controlplane-token-file (a vm-agent token whose
    /// subject is this VM) or --controlplane-cert (CN = this VM, O = vm-agent).
    #[arg(long, value_name = "URL", requires_all = ["controlplane_ca", "controlplane_credential", "vm"])]
    pub controlplane: Option<String>,
    /// This VM's name: its VirtualMachine on the control plane (and the subject of the
    /// token). The agent is No-Op until that object says `Agented`.
    #[arg(long, value_name = "NAME", requires = "controlplane")]
    pub vm: Option<String>,
    /// Where the agent keeps the policies it enforces, so that a restart without the
    /// control plane enforces them at once.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sluice/vm-agent")]
    pub state_dir: PathBuf,
    /// How often the runtime info (the agent's heartbeat) is reported; it is also reported
    /// on every change. Keep it well below the control plane's --vm-heartbeat-timeout.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub report_interval: std::time::Duration,
    /// CA of the control plane's serving certificate.
    #[arg(long, value_name = "FILE")]
    pub controlplane_ca: Option<PathBuf>,
    /// The vm-agent bearer token (`sluice controlplane token create --role vm-agent --subject <vm>`).
    #[arg(long, value_name = "FILE", visible_alias = "token-file")]
    pub controlplane_token_file: Option<PathBuf>,
    /// Client certificate (PEM) for the control plane, with --controlplane-key; its expiry is
    /// sluice_tls_certificate_expiry_timestamp_seconds{listener="controlplane_client"}.
    #[arg(long, value_name = "FILE", requires_all = ["controlplane_key", "controlplane"])]
    pub controlplane_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "controlplane_cert")]
    pub controlplane_key: Option<PathBuf>,
    /// OVS run directory holding `<bridge>.mgmt` and, by default, `db.sock`.
    #[arg(long, value_name = "DIR", default_value = "/var/run/openvswitch")]
    pub ovs_rundir: PathBuf,
    /// OVSDB socket (default: `<ovs-rundir>/db.sock`).
    #[arg(long, value_name = "SOCKET")]
    pub db_socket: Option<PathBuf>,
    /// Admin address for /metrics, /healthz and /readyz (port 0: chosen by the OS).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub admin: std::net::SocketAddr,
    /// How often per-rule counters are read from OVS.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    pub stats_interval: std::time::Duration,
    /// Packets per second that Reject rules send to the agent, all together (an OpenFlow
    /// meter in the datapath drops the rest, counted in
    /// sluice_policy_reject_meter_dropped_packets_total).
    #[arg(long, value_name = "PPS", default_value_t = sluice_policy_engine::meter::DEFAULT_REJECT_RATE, value_parser = clap::value_parser!(u32).range(1..))]
    pub reject_rate: u32,
    /// Packets the Reject meter lets through at once above --reject-rate.
    #[arg(long, value_name = "PACKETS", default_value_t = sluice_policy_engine::meter::DEFAULT_REJECT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub reject_burst: u32,
    /// Do not load the eBPF fast-path counters on the bridge's ports (docs/EBPF.md).
    #[arg(long)]
    pub no_ebpf: bool,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormatArg,
}

impl VmAgentArgs {
    /// The agent's options: the lifecycle mode when a control plane is given, otherwise the
    /// policy file (clap requires one of them).
    pub fn options(self) -> sluice_vm_agent::VmAgentOptions {
        let lifecycle = self.controlplane.zip(self.vm).map(|(url, vm)| {
            let source = sluice_config::ControlPlaneSource {
                url,
                name: Some(vm.clone()),
                ca_file: self.controlplane_ca.unwrap_or_default(),
                token_file: self.controlplane_token_file,
                cert_file: self.controlplane_cert,
                key_file: self.controlplane_key,
            };
            sluice_vm_agent::LifecycleOptions {
                client: crate::daemon::watch_client_config(&source),
                vm,
                state_dir: self.state_dir,
                report_interval: self.report_interval,
            }
        });
        sluice_vm_agent::VmAgentOptions {
            bridge: self.bridge,
            policies: self.policies,
            lifecycle,
            ovs_rundir: self.ovs_rundir,
            db_socket: self.db_socket,
            admin: self.admin,
            stats_interval: self.stats_interval,
            reject_meter: sluice_policy_engine::RejectMeter {
                rate: self.reject_rate,
                burst: self.reject_burst,
            },
            ebpf: !self.no_ebpf,
            notify: sluice_vm_agent::Notify {
                ready: || crate::notify::ready("vm-agent"),
                stopping: || crate::notify::stopping("vm-agent"),
            },
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ControlplaneArgs {
    /// Address of the HTTPS API listener.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6443")]
    pub listen: std::net::SocketAddr,
    /// Where the embedded store, the generated certificates (pki/) and admin.kubeconfig live.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/sluice/controlplane"
    )]
    pub data_dir: PathBuf,
    /// Where the CA and serving certificate are generated or found (default: <data-dir>/pki).
    /// Replicas over one etcd share one: start the others with a copy of the first's.
    #[arg(long, value_name = "DIR")]
    pub pki_dir: Option<PathBuf>,
    /// Where the objects are kept: etcd instead of the embedded store when given.
    #[command(flatten)]
    pub etcd: Box<crate::controlplane::EtcdArgs>,
    /// Serving certificate (PEM); with --tls-key. Default: generated in the PKI directory.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Serving certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA of client certificates to accept (CN = subject, O = role); default: tokens only.
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
    /// Extra DNS names or IPs for the generated serving certificate (repeatable).
    #[arg(long, value_name = "NAME")]
    pub hostname: Vec<String>,
    /// History kept for watchers to resume from; older revisions are compacted away.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub compaction_interval: std::time::Duration,
    /// How long an Agented VM stays AgentedConnected after its agent's last runtime-info
    /// report (three missed reports at the agent's default 30 s interval): then it is
    /// AgentedBootstrap and its agent's policy span is empty until it reports again.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = humantime::parse_duration)]
    pub vm_heartbeat_timeout: std::time::Duration,
    /// Connections, watches and requests in flight: the shares and timeouts.
    #[command(flatten)]
    pub limits: Box<crate::controlplane::LimitArgs>,
    /// The store's quota and the write budgets.
    #[command(flatten)]
    pub store_limits: Box<crate::controlplane::StoreLimitArgs>,
    /// Near the memory or descriptor limit: stop accepting, then shed new requests.
    #[command(flatten)]
    pub overload: Box<crate::controlplane::OverloadArgs>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormatArg,
    #[command(flatten)]
    pub addresses: AddressesArg,
}

impl ControlplaneArgs {
    /// The server's options; an invalid share, budget, overload bound or etcd setting is
    /// refused with a message naming the flag.
    pub fn options(self) -> Result<crate::controlplane::ControlPlaneOptions, String> {
        let mut limits = self.limits.limits()?;
        let store_quota_bytes = self.store_limits.apply(&mut limits)?;
        let overload = self.overload.config()?;
        let store = self.etcd.store().map_err(|error| format!("{error:#}"))?;
        Ok(crate::controlplane::ControlPlaneOptions {
            pki_dir: self.pki_dir,
            store,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            client_ca: self.client_ca,
            hostnames: self.hostname,
            compaction_interval: self.compaction_interval,
            vm_heartbeat_timeout: self.vm_heartbeat_timeout,
            limits,
            store_quota_bytes,
            overload,
            ..crate::controlplane::ControlPlaneOptions::embedded(self.listen, self.data_dir)
        })
    }

    /// The process-wide log settings of `sluice controlplane` (the level is not a flag).
    pub fn logging(&self) -> sluice_config::LoggingConfig {
        sluice_config::LoggingConfig {
            format: self.log_format.format(),
            level: "info".to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl LogFormatArg {
    pub fn format(self) -> sluice_config::LogFormat {
        match self {
            LogFormatArg::Text => sluice_config::LogFormat::Text,
            LogFormatArg::Json => sluice_config::LogFormat::Json,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ControlplaneCommand {
    /// Bearer tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue a token for a role and subject, store its SHA-256 on the control plane (as the
    /// admin of the kubeconfig) and print the token; it is not shown again.
    Create {
        /// admin, gateway, node or vm-agent.
        #[arg(long)]
        role: String,
        /// The gateway's, node's or VM's name (for vm-agent: the VM whose policies it reads).
        #[arg(long)]
        subject: String,
        /// An admin kubeconfig (default: <data-dir>/admin.kubeconfig).
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
        /// The control plane's data directory, for the default kubeconfig.
        #[arg(
            long,
            value_name = "DIR",
            default_value = "/var/lib/sluice/controlplane"
        )]
        data_dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the OpenFlow flows a policy file (or directory) compiles to; exit 2 with every
    /// error on a bad file.
    Compile {
        #[arg(value_name = "FILE|DIR")]
        file: PathBuf,
    },
}

/// `--addresses-file`, on the subcommands that bind listeners.
#[derive(Debug, Clone, Args)]
pub struct AddressesArg {
    /// Once every listener is bound, write their addresses as JSON ({"admin": "127.0.0.1:9901"})
    /// to this file. Useful with port 0.
    #[arg(long, value_name = "PATH")]
    pub addresses_file: Option<PathBuf>,
}

/// Command-line overrides of the `runtime` config block.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Data-plane worker threads (default: runtime.workers, which defaults to one per CPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub workers: Option<u16>,
    /// I/O driver (default: runtime.driver): auto tries io_uring and falls back to epoll.
    #[arg(long, value_enum, value_name = "DRIVER")]
    pub driver: Option<DriverArg>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DriverArg {
    Auto,
    Uring,
    Legacy,
}

impl From<DriverArg> for sluice_config::DriverChoice {
    fn from(arg: DriverArg) -> Self {
        match arg {
            DriverArg::Auto => Self::Auto,
            DriverArg::Uring => Self::Uring,
            DriverArg::Legacy => Self::Legacy,
        }
    }
}

/// `IP:PORT`, or `HOST:PORT` resolved now (the first address the resolver gives).
fn admin_address(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let mut resolved = text
        .to_socket_addrs()
        .map_err(|error| format!("expected IP:PORT or HOST:PORT: {error}"))?;
    resolved
        .next()
        .ok_or_else(|| format!("{text}: the name resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_address_may_be_a_host_name() {
        assert_eq!(
            admin_address("localhost:9901").map(|address| address.port()),
            Ok(9901)
        );
        assert!(admin_address("localhost:9901").is_ok_and(|a| a.ip().is_loopback()));
        assert_eq!(
            admin_address("[::1]:7").map(|address| address.to_string()),
            Ok("[::1]:7".to_string())
        );
        assert!(admin_address("localhost").is_err(), "a port is required");
    }

    #[test]
    fn a_vm_agent_on_the_control_plane_needs_a_token_or_a_certificate() {
        let parse = |extra: &[&str]| {
            let base = ["sluice", "vm-agent", "--bridge", "br", "--vm", "vm1"];
            let cp = [
                "--controlplane",
                "https://cp:6443",
                "--controlplane-ca",
                "ca.pem",
            ];
            Cli::try_parse_from(base.iter().chain(&cp).chain(extra))
        };
        assert!(parse(&[]).is_err(), "no credential");
        assert!(parse(&["--token-file", "t"]).is_ok());
        let Ok(Cli {
            command: Command::VmAgent(args),
            ..
        }) = parse(&[
            "--controlplane-cert",
            "c.pem",
            "--controlplane-key",
            "k.pem",
        ])
        else {
            panic!("a certificate alone is a credential");
        };
        let source = args
            .options()
            .lifecycle
            .unwrap()
            .client
            .client_cert
            .unwrap();
        assert_eq!((source.cert, source.key), ("c.pem".into(), "k.pem".into()));
        assert!(parse(&["--controlplane-cert", "c.pem"]).is_err(), "no key");
        assert!(parse(&["--token-file", "t", "--controlplane-key", "k.pem"]).is_err());
    }
}
