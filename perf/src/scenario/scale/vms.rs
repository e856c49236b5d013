//! Seed 004's open question, "Antrea Plus aims to support up-to 5000 VMs per cluster. TODO:
//! Need to find out Antrea plus can handle 5000 VMs with acceptable response time", asked of
//! `sluice controlplane`: a VirtualMachine and a token per VM, a policy set over them, and a
//! fleet of simulated agents (`fleet.rs`) reporting and watching as `sluice vm-agent` does.
//!
//! Measured: the control plane's CPU and RSS at steady state (heartbeats only), the time from
//! a policy write to each affected agent's watch event, whether any VM left AgentedConnected
//! while its agent reported on time, and the time for every agent to see a write made right
//! after a control-plane restart (reconnect and resync).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use sluice_apiserver::auth::{issue, Identity, Role};
use sluice_watch_client::{Transport, WatchClientConfig};
use tokio::sync::{watch, Semaphore};

use super::fleet::{self, retrying, Fleet, SENT_ANNOTATION};
use crate::measure::CpuMeter;
use crate::process::Managed;
use crate::scenario::controlplane::{kubeconfig_token, percentile_ms, start_etcd};
use crate::scenario::Harness;

/// Sizes and durations of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Plan {
    pub vms: usize,
    pub policies: usize,
    pub heartbeat: Duration,
    /// How long CPU and RSS are sampled with only heartbeats going on.
    pub steady: Duration,
    /// Policy writes timed to their affected agents.
    pub writes: usize,
    /// The control plane's store is an etcd member (on the upstream CPU) instead of the
    /// embedded one.
    pub etcd: bool,
}

impl Plan {
    pub fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                vms: 20,
                policies: 4,
                heartbeat: Duration::from_secs(1),
                steady: Duration::from_secs(3),
                writes: 4,
                etcd: false,
            }
        } else {
            Self {
                vms: 5_000,
                policies: 500,
                heartbeat: Duration::from_secs(30),
                steady: Duration::from_secs(90),
                writes: 50,
                etcd: false,
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct VmRecord {
    pub plan: Plan,
    pub seconds_to_set_up: f64,
    pub seconds_to_connect_all: f64,
    pub steady_controlplane_cpu_percent: f64,
    /// etcd's CPU over the same window, when the store is etcd.
    pub steady_etcd_cpu_percent: Option<f64>,
    pub steady_controlplane_rss_mib: f64,
    /// `sluice_controlplane_connections` at steady state: one per agent (its watches and
    /// reports share an h2 connection) and the admin's one.
    pub steady_controlplane_connections: usize,
    pub heartbeats: usize,
    pub deliveries_expected: usize,
    pub deliveries: usize,
    pub delivery_p50_ms: f64,
    pub delivery_p99_ms: f64,
    pub delivery_max_ms: f64,
    /// VMs that left AgentedConnected during the run although every agent kept reporting.
    pub misjudged_heartbeats: u64,
    pub seconds_to_resync_after_restart: f64,
    pub agent_write_errors: usize,
}

impl VmRecord {
    pub fn errors(&self) -> usize {
        self.agent_write_errors
            + self.deliveries_expected.saturating_sub(self.deliveries)
            + self.misjudged_heartbeats as usize
            + self.extra_connections()
    }

    /// Connections beyond one per agent and the admin's: an agent that went back to a
    /// connection per watch.
    pub fn extra_connections(&self) -> usize {
        self.steady_controlplane_connections
            .saturating_sub(self.plan.vms + 1)
    }
}

/// The admin's write budget in these runs: far above what the set-up asks, so the store alone
/// paces it.
const ADMIN_BULK_LOAD: &str = "admin=1000000/1000000,1073741824/1073741824";

/// Everything the admin side of the run needs.
struct Admin {
    transport: Transport,
}

impl Admin {
    async fn create(&self, plural_path: &str, object: &Value) -> anyhow::Result<()> {
        let body = Bytes::from(object.to_string());
        retrying(|| async {
            match self
                .transport
                .post_json(plural_path, body.clone(), 4 << 20)
                .await
            {
                Err(sluice_watch_client::WatchError::Status { status: 409, .. }) => {
                    Ok(Bytes::new())
                }
                other => other,
            }
        })
        .await
        .with_context(|| format!("creating in {plural_path}"))?;
        Ok(())
    }

    async fn mark(&self, path: &str) -> anyhow::Result<u128> {
        let sent = fleet::now_nanos();
        let patch = json!({"metadata": {"annotations": {SENT_ANNOTATION: sent.to_string()}}});
        let body = Bytes::from(patch.to_string());
        retrying(|| self.transport.merge_patch(path, body.clone(), 4 << 20))
            .await
            .with_context(|| format!("patching {path}"))?;
        Ok(sent)
    }

    async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        use http_body_util::BodyExt;
        let answer = self.transport.get("/metrics").await?;
        let text = answer.body.collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&text);
        Ok(text
            .lines()
            .find_map(|line| line.strip_prefix(series))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0))
    }
}

fn policy_path(plural: &str) -> String {
    format!("/apis/{}/{}/{plural}", fleet::POLICY_GROUP, fleet::VERSION)
}

fn vm_path() -> String {
    format!(
        "/apis/{}/{}/virtualmachines",
        fleet::VM_GROUP,
        fleet::VERSION
    )
}

/// Starts the control plane on `listen` with limits sized for the fleet: every agent holds
/// four watches on its one connection, more watches than the defaults allow (reported in the
/// docs).
fn start_controlplane(
    harness: &Harness,
    dir: &Path,
    plan: &Plan,
    listen: &str,
    etcd: Option<&str>,
) -> anyhow::Result<(Managed, String)> {
    let addresses = dir.join("controlplane-addresses.json");
    let _ = std::fs::remove_file(&addresses);
    // A resized pool keeps the other roles' default reservations (22% of it): room for them
    // beside the agents' four watches each (at 5,000 VMs, 4 x VMs + 2,000 was refused).
    let watches = plan.vms * 6 + 2_000;
    let args: Vec<String> = vec![
        "--addresses-file".into(),
        addresses.display().to_string(),
        "controlplane".into(),
        "--listen".into(),
        listen.into(),
        "--data-dir".into(),
        dir.join("controlplane").display().to_string(),
        // A resized table keeps the default shares' proportions: the vm-agent role may hold
        // about 65 % of the authenticated part (the table less the 1,024 unauthenticated), so
        // twice the agents plus room for the rest (with VMs + 3,072, 4,554 of 5,000 agents
        // could connect and the others were refused until the run gave up).
        "--max-connections".into(),
        (plan.vms * 2 + 2_048).to_string(),
        "--max-watches".into(),
        watches.to_string(),
        "--watch-share".into(),
        format!("vm-agent={}/8", plan.vms * 4),
        // Every simulated agent dials from 127.0.0.1, where real VMs have an address each: the
        // per-address cap on connections not yet authenticated (64) would evict them in turn
        // while thousands connect at once (11,129 evictions in the first 5,000-VM run).
        "--max-unauthenticated-connections-per-address".into(),
        "1024".into(),
        "--vm-heartbeat-timeout".into(),
        format!("{}s", (plan.heartbeat * 3).as_secs().max(2)),
        // The set-up is one admin's bulk load (5,000 VMs: 10,500 creates). At the admin's
        // default budget (100 writes/s after a burst of 2,000) it took 95 s, the budget's pace
        // rather than the store's; raised here so the set-up line measures the store. A real
        // admin gets the defaults (docs/CONFIG.md, `--write-budget`).
        "--write-budget".into(),
        ADMIN_BULK_LOAD.into(),
        "--role-write-budget".into(),
        ADMIN_BULK_LOAD.into(),
    ];
    let mut args = args;
    if let Some(endpoint) = etcd {
        args.extend(["--etcd-endpoints".to_string(), endpoint.to_string()]);
    }
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let mut process = Managed::spawn(
        "controlplane",
        &harness.proxy_cpu,
        dir,
        &harness.sluice.0,
        &args,
    )?;
    let listening = process.wait_for_addresses(&addresses, Duration::from_secs(30))?;
    let address = crate::process::address(&listening, "controlplane")?;
    Ok((process, address.to_string()))
}

pub fn run(harness: &Harness, dir: &Path, plan: Plan) -> anyhow::Result<VmRecord> {
    raise_fd_limit(plan.vms * 2 + 4_096)?;
    let etcd = match plan.etcd {
        true => Some(start_etcd(dir, &harness.upstream_cpu)?),
        false => None,
    };
    let endpoint = etcd.as_ref().map(|etcd| etcd.endpoint.as_str());
    let (controlplane, address) = start_controlplane(harness, dir, &plan, "127.0.0.1:0", endpoint)?;
    let url = format!("https://{address}");
    let ca = dir.join("controlplane/pki/ca.crt");
    let admin_token = dir.join("admin.token");
    std::fs::write(
        &admin_token,
        kubeconfig_token(&dir.join("controlplane/admin.kubeconfig"))?,
    )?;
    let mut config = WatchClientConfig::new(url.clone(), ca.clone());
    config.token_file = Some(admin_token);
    let admin = Arc::new(Admin {
        transport: Transport::new(&config)?,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("perf-fleet")
        .enable_all()
        .build()?;
    let fleet = Arc::new(Fleet::new(url, ca, plan.heartbeat, plan.vms));
    let (stop, stopping) = watch::channel(false);
    let started = Instant::now();
    let tokens = runtime.block_on(set_up(&admin, dir, &plan))?;
    let seconds_to_set_up = started.elapsed().as_secs_f64();
    println!(
        "vms: {} VMs, tokens and policies stored in {seconds_to_set_up:.1} s",
        plan.vms
    );

    let started = Instant::now();
    for (index, token) in tokens.into_iter().enumerate() {
        let task = fleet::run_agent(
            fleet.clone(),
            index,
            token,
            fleet::policy_name(index % plan.policies),
            fleet::marker_name(),
            stopping.clone(),
        );
        runtime.spawn(task);
    }
    let connected = runtime.block_on(all_connected(&admin, &plan, &fleet))?;
    let seconds_to_connect_all = started.elapsed().as_secs_f64();
    println!(
        "vms: all {} AgentedConnected after {connected:.1} s",
        plan.vms
    );

    let mut metered_processes = vec![("controlplane".to_string(), controlplane.pid())];
    if let Some(etcd) = &etcd {
        metered_processes.push(("etcd".to_string(), etcd.process.pid()));
    }
    let meter = CpuMeter::start(&metered_processes)?;
    let metered = Instant::now();
    std::thread::sleep(plan.steady);
    let usage = meter.finish()?;
    let steady_seconds = metered.elapsed().as_secs_f64();
    let steady_cpu = usage[0].cpu_us as f64 / 1e6 / steady_seconds * 100.0;
    let connections = runtime.block_on(admin.metric("sluice_controlplane_connections "))? as usize;
    println!("vms: {connections} control-plane connections at steady state");

    let (expected, sent) = runtime.block_on(timed_writes(&admin, &plan))?;
    let deliveries = delivered(&fleet, &sent, expected, &runtime);
    let misjudged = runtime.block_on(admin.metric(
        "sluice_vm_state_transitions_total{from=\"AgentedConnected\",to=\"AgentedBootstrap\"} ",
    ))? as u64;

    // SIGTERM and wait (dropping a managed process stops it), then start on the same port
    // and store: the agents' clients reconnect as they would to a restarted replica.
    drop(controlplane);
    let restarted = Instant::now();
    let (mut controlplane, _) = start_controlplane(harness, dir, &plan, &address, endpoint)?;
    let resync = runtime.block_on(resync(&admin, &fleet, restarted))?;
    let _ = stop.send(true);
    controlplane.check_alive()?;
    let mut latencies = fleet
        .latencies_us
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default();
    latencies.sort_unstable();
    let latencies: Vec<u32> = latencies
        .iter()
        .map(|us| u32::try_from(*us).unwrap_or(u32::MAX))
        .collect();
    drop(runtime);
    Ok(VmRecord {
        plan,
        seconds_to_set_up,
        seconds_to_connect_all,
        steady_controlplane_cpu_percent: steady_cpu,
        steady_etcd_cpu_percent: usage
            .get(1)
            .map(|etcd| etcd.cpu_us as f64 / 1e6 / steady_seconds * 100.0),
        steady_controlplane_rss_mib: usage[0].rss_kib as f64 / 1024.0,
        steady_controlplane_connections: connections,
        heartbeats: fleet.heartbeats.load(Ordering::Relaxed),
        deliveries_expected: expected,
        deliveries,
        delivery_p50_ms: percentile_ms(&latencies, 0.50),
        delivery_p99_ms: percentile_ms(&latencies, 0.99),
        delivery_max_ms: latencies.last().map_or(0.0, |us| f64::from(*us) / 1000.0),
        misjudged_heartbeats: misjudged,
        seconds_to_resync_after_restart: resync,
        agent_write_errors: fleet.write_errors.load(Ordering::Relaxed),
    })
}

/// Stores the VMs, one vm-agent token per VM, and the policy set; returns the token files.
async fn set_up(
    admin: &Arc<Admin>,
    dir: &Path,
    plan: &Plan,
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let tokens_dir = dir.join("tokens");
    std::fs::create_dir_all(&tokens_dir)?;
    // Below the server's cap on unauthenticated connections per address (64).
    let handshakes = Arc::new(Semaphore::new(32));
    let mut tasks = Vec::new();
    let mut files = Vec::new();
    for index in 0..plan.vms {
        let vm = fleet::vm_name(index);
        let issued = issue(Identity::new(Role::VmAgent, &vm)?)?;
        let file = tokens_dir.join(&vm);
        std::fs::write(&file, &issued.secret)?;
        files.push(file);
        let spec = sluice_apiserver::kinds::token();
        let token = json!({"apiVersion": spec.api_version(), "kind": spec.kind,
            "metadata": {"name": format!("vm-agent.{vm}.{}", &issued.record.sha256[..8])},
            "spec": {"role": "vm-agent", "subject": vm, "tokenSha256": issued.record.sha256}});
        let machine = json!({"apiVersion": format!("{}/{}", fleet::VM_GROUP, fleet::VERSION),
            "kind": "VirtualMachine", "metadata": {"name": vm},
            "spec": {"management": "Agented",
                "uplink": {"name": "eth0", "ips": [format!("{}/8", fleet::vm_ip(index))]}}});
        let (admin, handshakes) = (admin.clone(), handshakes.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = handshakes.acquire().await?;
            admin.create(&token_path(), &token).await?;
            admin.create(&vm_path(), &machine).await
        }));
    }
    for (plural, object) in fleet::policy_set(plan.vms, plan.policies) {
        let (admin, handshakes) = (admin.clone(), handshakes.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = handshakes.acquire().await?;
            admin.create(&policy_path(plural), &object).await
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(files)
}

fn token_path() -> String {
    let spec = sluice_apiserver::kinds::token();
    format!("/apis/{}/{}/{}", spec.group, spec.version, spec.plural)
}

/// Waits until every VM is AgentedConnected (the VMManager saw its agent's report); returns
/// the seconds it took.
async fn all_connected(admin: &Admin, plan: &Plan, fleet: &Fleet) -> anyhow::Result<f64> {
    let started = Instant::now();
    let series = "sluice_vm_state{state=\"AgentedConnected\"} ";
    loop {
        let connected = admin.metric(series).await? as usize;
        if connected >= plan.vms {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "{connected} of {} VMs AgentedConnected after 10 minutes ({} reported, {} write errors)",
                plan.vms,
                fleet.reported.load(Ordering::Relaxed),
                fleet.write_errors.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Writes each timed policy change (a new send-time annotation) one after another, a second
/// apart; returns the deliveries expected (each policy's VMs) and the writes' send times.
async fn timed_writes(admin: &Admin, plan: &Plan) -> anyhow::Result<(usize, Vec<(String, u128)>)> {
    let mut expected = 0;
    let mut sent = Vec::new();
    for write in 0..plan.writes {
        let k = (write * 7) % plan.policies;
        let name = fleet::policy_name(k);
        let at = admin
            .mark(&format!("{}/{name}", policy_path("networkpolicies")))
            .await?;
        expected += (k..plan.vms).step_by(plan.policies).count();
        sent.push((name, at));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok((expected, sent))
}

/// How many of the expected deliveries arrived, waiting up to 30 s for stragglers.
fn delivered(
    fleet: &Fleet,
    sent: &[(String, u128)],
    expected: usize,
    runtime: &tokio::runtime::Runtime,
) -> usize {
    let count = || {
        fleet.received.lock().map_or(0, |received| {
            sent.iter()
                .map(|key| received.get(key).copied().unwrap_or(0))
                .sum::<usize>()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while count() < expected && Instant::now() < deadline {
        // The timer is made inside the runtime: `sleep` needs one when it is created.
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    }
    count()
}

/// After a restart: a write to the marker group every agent sees, made as soon as the control
/// plane answers; returns the seconds from the restart's start until the last agent saw it.
async fn resync(admin: &Admin, fleet: &Fleet, restarted: Instant) -> anyhow::Result<f64> {
    let path = format!("{}/{}", policy_path("addressgroups"), fleet::marker_name());
    let sent = admin.mark(&path).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let seen = fleet.markers_seen();
        let behind = seen.iter().filter(|at| **at < sent).count();
        if behind == 0 {
            return Ok(restarted.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            bail!(
                "{behind} of {} agents never saw the write made after the restart",
                seen.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every agent holds one connection (its watches and reports share it over h2): a descriptor
/// per agent in the harness and in the control plane it starts (which inherits the limit),
/// more than a shell's default; twice the count leaves room for re-dials after a restart.
pub(super) fn raise_fd_limit(wanted: usize) -> anyhow::Result<()> {
    let wanted = wanted as libc::rlim_t;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        if limit.rlim_cur >= wanted {
            return Ok(());
        }
        limit.rlim_cur = wanted.min(limit.rlim_max.max(wanted));
        limit.rlim_max = limit.rlim_max.max(limit.rlim_cur);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            bail!(
                "cannot raise the open-file limit to {wanted}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}
