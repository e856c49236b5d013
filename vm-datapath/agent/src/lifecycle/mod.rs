//! `sluice vm-agent --controlplane URL --vm NAME`: the seed's VM agent. No-Op until it reads
//! its VirtualMachine; Active while that says `Agented`: the uplink taken over, the span's
//! policies enforced, runtime info reported. See [`decision`] for the rules and
//! docs/VM-POLICY.md for the whole story.
//!
//! A transient loss of the control plane changes nothing on the VM: the flows and the network
//! configuration stay, and the enforced objects are saved ([`persist`]) so that an agent
//! restarted while the control plane is away enforces them again at once. Stopping the agent
//! leaves both in place too; only the VirtualMachine turning Agentless or Unmanaged (or being
//! deleted), seen through the API, takes the agent out of the datapath.

mod decision;
mod feed;
mod persist;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_ovs::OvsdbClient;
use sluice_policy::model::PolicySet;
use sluice_watch_client::{Transport, WatchClientConfig, WatchMetrics};
use tokio::sync::watch;

use super::enforcer::Enforcer;
use super::{Datapath, Notify, Stopped, VmAgentError};
use decision::{next_step, policies_current, Mode, Observed, Step};
use feed::{PolicyFeed, VmFeed};
use persist::Enforced;
use report::{Report, ReportMetrics};

/// How often a step that failed (an uplink takeover, a restore) is tried again, as Antrea's
/// ExternalNode controller reconciles every 5 s.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// The control-plane side of the agent's options.
#[derive(Debug, Clone)]
pub struct LifecycleOptions {
    /// The control plane and the credentials of this VM's agent.
    pub client: WatchClientConfig,
    pub vm: String,
    pub state_dir: PathBuf,
    pub report_interval: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
    result: &'static str,
}

/// The lifecycle's metrics, registered before the admin endpoint serves.
#[derive(Clone)]
pub struct LifecycleMetrics {
    mode: Family<ModeLabels, Gauge>,
    steps: Family<StepLabels, Counter>,
    report: ReportMetrics,
    watch: WatchMetrics,
}

impl LifecycleMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = LifecycleMetrics {
            mode: Family::default(),
            steps: Family::default(),
            report: ReportMetrics::default(),
            watch: WatchMetrics::register(registry),
        };
        registry.register(
            "sluice_vm_agent_mode",
            "1 for the agent's mode (NoOp, Active), 0 for the other",
            metrics.mode.clone(),
        );
        registry.register(
            "sluice_vm_agent_steps",
            "Lifecycle steps (takeover, restore, announce, withdraw) by result (ok, error)",
            metrics.steps.clone(),
        );
        metrics.report.register(registry);
        metrics
    }
}

/// Whom the agent tells that it serves: the admin endpoint's `/readyz` and the supervisor.
pub struct Serving<'a> {
    pub ready: &'a std::sync::atomic::AtomicBool,
    pub notify: Notify,
}

/// Runs the agent until `shutdown` resolves.
pub async fn run(
    datapath: Datapath,
    options: LifecycleOptions,
    metrics: LifecycleMetrics,
    serving: Serving<'_>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), VmAgentError> {
    let (reports, receiver) = watch::channel(None);
    let mut agent = Agent {
        datapath,
        options,
        metrics,
        mode: Mode::NoOp,
        ovsdb: None,
        taken_over: None,
        enforcer: None,
        observed: Observed::Unknown,
        enforced: None,
        generations: BTreeMap::new(),
        realized: true,
        reports,
    };
    agent.set_mode(Mode::NoOp);
    agent.cold_start().await;
    let client = &agent.options.client;
    // One Transport: over h2 the four watches and the reports share one connection, so a
    // control plane serving 5,000 VMs holds 5,000 connections, not 25,000.
    let transport = std::sync::Arc::new(Transport::new(client)?);
    let mut vm_feed = VmFeed::spawn(client, &transport, &agent.options.vm, &agent.metrics.watch);
    let mut policies = PolicyFeed::spawn(client, &transport, &agent.metrics.watch);
    report::spawn(
        transport,
        &agent.options.vm,
        agent.options.report_interval,
        receiver,
        agent.metrics.report.clone(),
    );
    serving
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    (serving.notify.ready)();
    let mut reconcile = tokio::time::interval(RECONCILE_INTERVAL);
    let mut stats = tokio::time::interval(agent.datapath.stats_interval);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            alive = vm_feed.changed() => {
                if !alive {
                    return Err(VmAgentError::Stopped(Stopped::VirtualMachineWatch));
                }
                agent.observed = vm_feed.observed();
                agent.step().await;
                agent.enforce_watched(&mut policies).await;
            }
            alive = policies.changed() => {
                if !alive {
                    return Err(VmAgentError::Stopped(Stopped::PolicyWatches));
                }
                agent.enforce_watched(&mut policies).await;
            }
            attention = agent.enforcer_attention() => {
                attention?;
                agent.maintain().await;
            }
            _ = reconcile.tick() => {
                agent.step().await;
                agent.enforce_watched(&mut policies).await;
            }
            _ = stats.tick() => agent.poll_stats().await,
        }
        agent.publish_report();
    }
    (serving.notify.stopping)();
    tracing::info!(
        mode = agent.mode.as_str(),
        "stopping; the flows and the uplink stay as they are"
    );
    Ok(())
}

struct Agent {
    datapath: Datapath,
    options: LifecycleOptions,
    metrics: LifecycleMetrics,
    mode: Mode,
    ovsdb: Option<OvsdbClient>,
    taken_over: Option<sluice_uplink::TakenOver>,
    enforcer: Option<Enforcer>,
    observed: Observed,
    /// The objects enforced now (saved on disk).
    enforced: Option<Enforced>,
    generations: BTreeMap<String, String>,
    /// The last policy change asked for was realized.
    realized: bool,
    reports: watch::Sender<Option<Report>>,
}

impl Agent {
    /// Picks up where the last run left: an uplink taken over (from OVSDB's external_ids) and
    /// saved policies mean the agent was Active, and enforces again before the control plane
    /// is reached.
    async fn cold_start(&mut self) {
        let saved = match persist::load(&self.options.state_dir, &self.options.vm) {
            Ok(saved) => saved,
            Err(error) => {
                tracing::error!(%error, "saved policies not read; starting without them");
                None
            }
        };
        let bridge = self.datapath.bridge.clone();
        let recovered = match self.ovsdb().await {
            Some(ovsdb) => sluice_uplink::recover(ovsdb, &bridge).await,
            None => Ok(None),
        };
        let recovered = match recovered {
            Ok(taken) => taken,
            Err(error) => {
                tracing::error!(%error, "the uplink's state in OVSDB was not read");
                None
            }
        };
        if saved.is_none() && recovered.is_none() {
            return;
        }
        let (set, generations) = match &saved {
            Some(enforced) => self.load_saved(enforced),
            None => (PolicySet::default(), BTreeMap::new()),
        };
        let policies = set.policies.len();
        if self.start_enforcer(set).await {
            self.enforced = saved;
            self.generations = generations;
            self.set_mode(Mode::Active);
            // Taking over again is idempotent and repairs what a restart of ovs-vswitchd undid
            // (the internal port's addresses and routes go with its device).
            if let Some(taken) = recovered {
                self.take_over(Some(&taken.uplink)).await;
            }
            tracing::info!(
                policies,
                uplink = ?self.taken_over.as_ref().map(|taken| &taken.uplink),
                "resumed Active: enforcing the saved policies until the control plane answers"
            );
        }
    }

    fn load_saved(&self, enforced: &Enforced) -> (PolicySet, BTreeMap<String, String>) {
        let origin = persist::path(&self.options.state_dir).display().to_string();
        match feed::load(enforced, &origin) {
            Ok(loaded) => (loaded.set, loaded.generations),
            Err(error) => {
                for field in &error.errors {
                    tracing::error!(origin = %error.origin, path = %field.path, reason = %field.reason,
                        "saved policies refused");
                }
                (PolicySet::default(), BTreeMap::new())
            }
        }
    }

    /// Acts on what is known of the VirtualMachine now.
    async fn step(&mut self) {
        match next_step(self.mode, &self.observed) {
            Step::Stay => {
                if self.mode == Mode::Active {
                    self.ensure_uplink().await;
                }
            }
            Step::Activate { uplink } => self.activate(uplink).await,
            Step::Extract => self.extract().await,
        }
    }

    async fn activate(&mut self, uplink: Option<String>) {
        tracing::info!(vm = %self.options.vm, ?uplink, "the VirtualMachine is agented: going Active");
        // The pipeline first: the agent's bridge is in fail mode secure, so without flows the
        // taken-over uplink would forward nothing.
        if self.enforcer.is_none() && !self.start_enforcer(PolicySet::default()).await {
            return;
        }
        if !self.take_over(uplink.as_deref()).await {
            return;
        }
        self.set_mode(Mode::Active);
    }

    /// Takes the VM's uplink over when the VirtualMachine names one not yet taken.
    async fn ensure_uplink(&mut self) {
        let Observed::Present(view) = &self.observed else {
            return;
        };
        let wanted = view.uplink.clone();
        if wanted.is_some() && self.taken_over.is_none() {
            self.take_over(wanted.as_deref()).await;
        }
    }

    async fn take_over(&mut self, uplink: Option<&str>) -> bool {
        let Some(uplink) = uplink else {
            return true;
        };
        let bridge = self.datapath.bridge.clone();
        let Some(ovsdb) = self.ovsdb().await else {
            return false;
        };
        let announced_before = sluice_uplink::announcements();
        let outcome = sluice_uplink::take_over(ovsdb, &bridge, uplink).await;
        self.count_announcements(announced_before, uplink);
        match outcome {
            Ok(taken) => {
                tracing::info!(uplink, renamed = %taken.renamed, internal_ofport = taken.internal_ofport,
                    "uplink taken over");
                self.count_step("takeover", "ok");
                self.taken_over = Some(taken);
                true
            }
            Err(error) => {
                self.count_step("takeover", "error");
                tracing::error!(uplink, %error, "uplink takeover failed; rolled back, retrying");
                self.ovsdb = None;
                false
            }
        }
    }

    /// Leaves the datapath: flows withdrawn, uplink given back, saved policies forgotten.
    async fn extract(&mut self) {
        tracing::info!(vm = %self.options.vm, observed = ?self.observed,
            "the VirtualMachine is no longer agented: leaving the datapath");
        if let Some(enforcer) = self.enforcer.take() {
            let result = enforcer.withdraw().await;
            self.count_step("withdraw", if result.is_ok() { "ok" } else { "error" });
            if let Err(error) = result {
                tracing::error!(%error, "flows not withdrawn; the uplink is restored anyway");
            }
        }
        self.datapath.ports.release_all();
        let uplink = self.taken_over.as_ref().map(|taken| taken.uplink.clone());
        if let Some(uplink) = uplink {
            let bridge = self.datapath.bridge.clone();
            let Some(ovsdb) = self.ovsdb().await else {
                return;
            };
            let announced_before = sluice_uplink::announcements();
            let outcome = sluice_uplink::restore(ovsdb, &bridge, &uplink).await;
            self.count_announcements(announced_before, &uplink);
            if let Err(error) = outcome {
                self.count_step("restore", "error");
                tracing::error!(%uplink, %error, "uplink not restored; retrying");
                self.ovsdb = None;
                return;
            }
            self.count_step("restore", "ok");
            tracing::info!(%uplink, "uplink restored");
            self.taken_over = None;
        }
        if let Err(error) = persist::remove(&self.options.state_dir) {
            tracing::error!(%error, "saved policies not removed");
        }
        self.enforced = None;
        self.generations.clear();
        self.realized = true;
        self.set_mode(Mode::NoOp);
    }

    /// Enforces what the policy watches show, once they are the control plane's intent for
    /// this VM ([`policies_current`]).
    async fn enforce_watched(&mut self, policies: &mut PolicyFeed) {
        if self.mode != Mode::Active || self.enforcer.is_none() {
            return;
        }
        let Observed::Present(view) = &self.observed else {
            return;
        };
        let Some(watched) = policies.view() else {
            return;
        };
        if !policies_current(view, &[watched.progress]) {
            return;
        }
        let enforced = watched.into_enforced(&self.options.vm);
        if self.enforced.as_ref() == Some(&enforced) {
            return;
        }
        let origin = format!(
            "{}/apis/policy.sluice.dev/v1alpha1",
            self.options.client.url
        );
        let loaded = match feed::load(&enforced, &origin) {
            Ok(loaded) => loaded,
            Err(error) => {
                self.datapath.realize.reload_errors.inc();
                for field in &error.errors {
                    tracing::error!(origin = %error.origin, path = %field.path, reason = %field.reason,
                        "policies from the control plane refused; the last good policies stay");
                }
                return;
            }
        };
        let Some(enforcer) = self.enforcer.as_mut() else {
            return;
        };
        self.realized = enforcer.apply(loaded.set, "the control plane").await;
        if !self.realized {
            return;
        }
        if let Err(error) = persist::save(&self.options.state_dir, &enforced) {
            tracing::error!(%error, "enforced policies not saved; a restart without the control plane would lose them");
        }
        self.enforced = Some(enforced);
        self.generations = loaded.generations;
    }

    async fn start_enforcer(&mut self, initial: PolicySet) -> bool {
        match Enforcer::start(&self.datapath, initial).await {
            Ok(enforcer) => {
                self.enforcer = Some(enforcer);
                true
            }
            Err(error) => {
                tracing::error!(%error, "the policy engine did not start; retrying");
                false
            }
        }
    }

    async fn enforcer_attention(&mut self) -> Result<(), VmAgentError> {
        match self.enforcer.as_mut() {
            Some(enforcer) => enforcer.attention().await,
            None => std::future::pending().await,
        }
    }

    async fn maintain(&mut self) {
        if let Some(enforcer) = self.enforcer.as_mut() {
            enforcer.maintain().await;
        }
    }

    async fn poll_stats(&mut self) {
        if let Some(enforcer) = self.enforcer.as_mut() {
            enforcer.poll_stats().await;
            enforcer.refresh_ports().await;
        }
    }

    async fn ovsdb(&mut self) -> Option<&mut OvsdbClient> {
        if self.ovsdb.is_none() {
            match OvsdbClient::connect(&self.datapath.db_socket, Duration::from_secs(10)).await {
                Ok(client) => self.ovsdb = Some(client),
                Err(error) => {
                    tracing::warn!(%error, "OVSDB unreachable; retrying");
                    return None;
                }
            }
        }
        self.ovsdb.as_mut()
    }

    fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
        for each in [Mode::NoOp, Mode::Active] {
            self.metrics
                .mode
                .get_or_create(&ModeLabels {
                    mode: each.as_str(),
                })
                .set(i64::from(each == mode));
        }
    }

    /// Counts the announcements (gratuitous ARP, unsolicited NA) a takeover or restore made
    /// since `before`. A failed one keeps the move (neighbours fall back on their own ARP retry,
    /// about 1 s without replies), so it is a warning, not an error.
    fn count_announcements(&self, before: sluice_uplink::Announcements, uplink: &str) {
        let after = sluice_uplink::announcements();
        for _ in before.sent..after.sent {
            self.count_step("announce", "ok");
        }
        for _ in before.failed..after.failed {
            self.count_step("announce", "error");
            tracing::warn!(
                uplink,
                "the move of the uplink's addresses was not announced; \
                neighbours relearn the VM's MAC on their own ARP/ND retry"
            );
        }
    }

    fn count_step(&self, step: &'static str, result: &'static str) {
        self.metrics
            .steps
            .get_or_create(&StepLabels { step, result })
            .inc();
    }

    /// What the reporter sends next: only an Active agent reports (its reports are what keep
    /// the VM AgentedConnected, and a No-Op agent enforces nothing).
    fn publish_report(&self) {
        let report = (self.mode == Mode::Active).then(|| Report {
            mode: self.mode,
            network_policies: self.generations.clone(),
            ovsdb_connected: self
                .enforcer
                .as_ref()
                .is_some_and(Enforcer::ovsdb_connected),
            openflow_connected: self.enforcer.as_ref().is_some_and(Enforcer::in_sync),
            policies_realized: self.realized,
        });
        self.reports.send_if_modified(|current| {
            if *current == report {
                return false;
            }
            *current = report;
            true
        });
    }
}
