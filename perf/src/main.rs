//! `sluice-perf`: runs one scenario of the macro benchmark (see `perf/README.md`). Normally
//! started by `perf/run.sh SCENARIO [--smoke]`, which builds the binaries and installs the peers.

mod affinity;
mod certs;
mod loadgen;
mod machine;
mod measure;
mod peers;
mod plot;
mod process;
mod record;
mod report;
mod scenario;
mod sluice;

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// The load generator must not be what a scale run measures: the in-process peers of the scale
/// scenarios decode, mirror and drop an object per event, and with glibc's allocator
/// `_int_malloc`, `free` and their helpers were about half of the fan-out client's samples at
/// 10,000 watchers (docs/PERFORMANCE.md, "Issue 36: 5,000 VMs and 10,000 watchers again").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Scenario {
    /// Kubernetes API requests over TLS through the gateway vs HAProxy, nginx and direct.
    Gateway,
    /// Unary gRPC through the tunnel (one and two nodes) vs HAProxy and direct.
    Tunnel,
    /// 10,000 idle agent tunnels on one node: RSS and CPU.
    Idle,
    /// Criterion benches of `sluice-benches`, lifted into a summary.
    Policy,
    /// 1,000 watchers and steady writes through the control plane: embedded store and etcd.
    Controlplane,
    /// Packet rate through a veth pair with and without Sluice's eBPF counters, and their cost.
    Ebpf,
    /// The gateway with one worker against two: per-request CPU, the split between workers.
    Scaling,
    /// The gateway's CPU per request with its access log off, on, and sampled one in 100.
    AccessLog,
    /// The seeds' scale questions: 5,000 VMs on one control plane, 10,000 clients through one
    /// gateway, 10,000 watchers, idle tunnel agents across nodes (`--only vms|gateway|fanout|agents`).
    Scale,
    /// Mixed tunnel and gateway load at half capacity for minutes, agents and clients churning:
    /// RSS, fds, p99 and errors over time.
    Soak,
}

#[derive(Debug, Parser)]
#[command(name = "sluice-perf", about)]
struct Cli {
    scenario: Scenario,
    /// The `sluice` binary under test (a release build).
    #[arg(long, value_name = "PATH")]
    sluice: PathBuf,
    /// The `sluice-apiserver-sim` binary (default: next to `--sluice`).
    #[arg(long, value_name = "PATH")]
    apiserver_sim: Option<PathBuf>,
    /// The `sluice-perf-pingora` binary (built from perf/peers/pingora/): adds the Pingora case
    /// to the gateway and tunnel scenarios (without it, that case is skipped).
    #[arg(long, value_name = "PATH")]
    pingora: Option<PathBuf>,
    /// Where JSON, Markdown and plots go.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The workspace root (for the policy benches).
    #[arg(long, value_name = "DIR", default_value = ".")]
    workspace: PathBuf,
    /// A few seconds instead of minutes: one short run per case, to keep the harness working.
    #[arg(long)]
    smoke: bool,
    /// CPU list (taskset) of the load generator.
    #[arg(long, default_value = "1")]
    client_cpu: String,
    /// CPU list of the proxy side (Sluice node(s) and agent, HAProxy or nginx).
    #[arg(long, default_value = "0")]
    proxy_cpu: String,
    /// CPU list of the upstream (echo backend, apiserver simulator).
    #[arg(long, default_value = "0")]
    upstream_cpu: String,
    /// Run only these cases (tunnel: for example `sluice-1-node`; controlplane: `embedded`,
    /// `etcd`; ebpf: `without`, `with`, `with-stats`), to profile one.
    #[arg(long, value_delimiter = ',', value_name = "CASE")]
    only: Vec<String>,
    /// Replace the concurrency levels (tunnel scenario; the gateway scenario takes the clients),
    /// as CLIENTSxSTREAMS: `50x10,10x10`.
    #[arg(long, value_delimiter = ',', value_name = "CxS", value_parser = parse_level)]
    levels: Vec<(u32, u32)>,
    /// Replace the number of requests per run (tunnel scenario).
    #[arg(long)]
    requests: Option<u64>,
    /// Run only the workloads whose name contains one of these (gateway scenario; for example
    /// `@5000` for the fixed-rate runs, `h2 get` for the HTTP/2 small GETs).
    #[arg(long, value_delimiter = ',', value_name = "TEXT")]
    workloads: Vec<String>,
    /// Measure each run for this many seconds instead of the plan's (gateway scenario).
    #[arg(long, value_name = "SECONDS")]
    seconds: Option<u64>,
    /// How long the soak scenario runs (default 30; 1 with --smoke).
    #[arg(long, value_name = "MINUTES", value_parser = parse_minutes)]
    minutes: Option<f64>,
    /// Soak: no run; write summary.md, summary.json and the plot again from the samples an
    /// earlier run left in --out (raw/samples.json).
    #[arg(long)]
    resummarize: bool,
}

fn parse_minutes(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|minutes| minutes.is_finite() && *minutes > 0.0 && *minutes <= 24.0 * 60.0)
        .ok_or_else(|| format!("{text:?} is not a number of minutes between 0 and 1440"))
}

fn parse_level(text: &str) -> Result<(u32, u32), String> {
    let (clients, streams) = text
        .split_once('x')
        .ok_or_else(|| format!("{text:?} is not CLIENTSxSTREAMS"))?;
    let number = |part: &str| {
        part.parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{part:?} in {text:?} is not a positive number"))
    };
    Ok((number(clients)?, number(streams)?))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::fs::create_dir_all(&cli.out)?;
    // The ebpf scenario runs no Sluice process (run.sh builds only the harness for it).
    let sluice = match cli.scenario {
        Scenario::Ebpf => cli.sluice.clone(),
        _ => std::fs::canonicalize(&cli.sluice)?,
    };
    let apiserver_sim = cli.apiserver_sim.unwrap_or_else(|| {
        sluice
            .parent()
            .map_or_else(PathBuf::new, |dir| dir.join("sluice-apiserver-sim"))
    });
    let harness = scenario::Harness {
        sluice: sluice::SluiceBinary(sluice),
        apiserver_sim,
        pingora: cli.pingora,
        out: cli.out,
        workspace: cli.workspace,
        smoke: cli.smoke,
        client_cpu: cli.client_cpu,
        proxy_cpu: cli.proxy_cpu,
        upstream_cpu: cli.upstream_cpu,
        only: cli.only,
        levels: cli.levels,
        requests: cli.requests,
        workloads: cli.workloads,
        seconds: cli.seconds.map(std::time::Duration::from_secs),
        minutes: cli.minutes,
        resummarize: cli.resummarize,
    };
    match cli.scenario {
        Scenario::Gateway => scenario::gateway::run(&harness),
        Scenario::Tunnel => scenario::tunnel::run(&harness),
        Scenario::Idle => scenario::idle::run(&harness),
        Scenario::Policy => scenario::policy::run(&harness),
        Scenario::Controlplane => scenario::controlplane::run(&harness),
        Scenario::Ebpf => scenario::ebpf::run(&harness),
        Scenario::Scaling => scenario::scaling::run(&harness),
        Scenario::AccessLog => scenario::access_log::run(&harness),
        Scenario::Scale => scenario::scale::run(&harness),
        Scenario::Soak => scenario::soak::run(&harness),
    }
}
