//! The policy engine on one bridge plus what keeps it true to the switch: a replay after the
//! OpenFlow connection comes back, clearing `flow-restore-wait` once our flows are on, and
//! port numbers looked up for interfaces whose documents name them only. Both agent modes
//! (a policy file, the control plane) drive one of these.

use std::path::{Path, PathBuf};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use sluice_ovs::OvsdbClient;
use sluice_policy::model::{PolicySet, UNRESOLVED_PORT};
use sluice_policy_engine::PolicyEngine;
use tokio::sync::watch;

use super::port_counters::PortCounters;
use super::{Datapath, Stopped, VmAgentError};

/// Pause before retrying a replay the switch was not ready for.
const REPLAY_RETRY: Duration = Duration::from_millis(100);

/// Counters of the policy changes both modes realize.
#[derive(Clone, Default)]
pub struct RealizeMetrics {
    pub reloads: Counter,
    pub reload_errors: Counter,
    /// Interfaces left out now because no port of their name is on the bridge.
    pub unresolved_interfaces: Gauge,
}

impl RealizeMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "sluice_policy_reloads",
            "Policy changes realized (from the file or the control plane)",
            self.reloads.clone(),
        );
        registry.register(
            "sluice_policy_reload_errors",
            "Policy changes refused (invalid, or refused by OVS); the last good state stays",
            self.reload_errors.clone(),
        );
        registry.register(
            "sluice_policy_unresolved_interfaces",
            "Applied-to interfaces given without an ofport whose name is no port of the bridge now (left out until it appears)",
            self.unresolved_interfaces.clone(),
        );
    }
}

pub struct Enforcer {
    engine: PolicyEngine,
    _responder: Option<tokio::task::JoinHandle<()>>,
    db_socket: PathBuf,
    bridge: String,
    /// The eBPF counters that follow the bridge's ports.
    ports: PortCounters,
    ovsdb: Option<OvsdbClient>,
    /// Set when our flows are on the switch but `flow-restore-wait` may still hold it back.
    restore_wait_due: bool,
    connection: watch::Receiver<u64>,
    replay_due: bool,
    metrics: RealizeMetrics,
    /// The last set asked for, before port lookup: re-resolved when ports appear.
    desired: PolicySet,
    /// Interfaces left out at the last lookup (logged when this changes, not at every poll).
    unresolved: Vec<String>,
}

impl Enforcer {
    /// Starts the engine on the datapath's bridge with `initial` realized.
    pub async fn start(datapath: &Datapath, initial: PolicySet) -> Result<Self, VmAgentError> {
        let metrics = datapath.realize.clone();
        let mut ovsdb = connect_ovsdb(&datapath.db_socket).await;
        let (resolved, unresolved) = resolve_ports(&initial, &mut ovsdb).await;
        note_unresolved(&[], &unresolved, &metrics);
        let engine =
            PolicyEngine::start(&datapath.engine, resolved, datapath.engine_metrics.clone())
                .await?;
        let responder = engine.spawn_reject_responder();
        let mut connection = engine.client().connection_generation();
        connection.borrow_and_update();
        let mut enforcer = Enforcer {
            engine,
            _responder: responder,
            db_socket: datapath.db_socket.clone(),
            bridge: datapath.bridge.clone(),
            ports: datapath.ports.clone(),
            ovsdb,
            restore_wait_due: true,
            connection,
            replay_due: false,
            metrics,
            desired: initial,
            unresolved,
        };
        enforcer.clear_restore_wait().await;
        Ok(enforcer)
    }

    /// Realizes `desired` (from `source`, for the logs); false when refused (the last good
    /// state stays, logged and counted).
    pub async fn apply(&mut self, desired: PolicySet, source: &str) -> bool {
        self.desired = desired.clone();
        let resolved = self.resolve(&desired).await;
        match self.engine.apply_set(resolved).await {
            Ok(summary) => {
                self.metrics.reloads.inc();
                tracing::info!(
                    %source,
                    generation = summary.generation,
                    flow_mods = summary.flow_mods,
                    "policies realized"
                );
                true
            }
            Err(error) => {
                self.metrics.reload_errors.inc();
                tracing::error!(%source, %error, "policy change not realized; the last good policies stay");
                false
            }
        }
    }

    /// Applies the last desired set again: port numbers may have changed (an interface came
    /// back under a new ofport after a restart of the switch).
    pub async fn refresh_ports(&mut self) -> bool {
        let desired = self.desired.clone();
        let resolved = self.resolve(&desired).await;
        if resolved == *self.engine.policy_set() {
            return true;
        }
        self.apply(desired, "port numbers from OVSDB").await
    }

    async fn resolve(&mut self, desired: &PolicySet) -> PolicySet {
        let (resolved, unresolved) = resolve_ports(desired, &mut self.ovsdb).await;
        note_unresolved(&self.unresolved, &unresolved, &self.metrics);
        self.unresolved = unresolved;
        resolved
    }

    /// Resolves when the enforcer needs [`Enforcer::maintain`]: the OpenFlow connection came
    /// back (a replay is due) or a failed replay is to be retried.
    pub async fn attention(&mut self) -> Result<(), VmAgentError> {
        if self.replay_due {
            tokio::time::sleep(REPLAY_RETRY).await;
            return Ok(());
        }
        if self.connection.changed().await.is_err() {
            return Err(VmAgentError::Stopped(Stopped::OpenFlowClient));
        }
        self.replay_due = true;
        Ok(())
    }

    /// Replays when due; clears `flow-restore-wait` when our flows are on the switch.
    pub async fn maintain(&mut self) {
        if self.replay_due {
            self.connection.borrow_and_update();
            match self.engine.replay().await {
                Ok(_) => {
                    self.replay_due = false;
                    self.restore_wait_due = true;
                }
                Err(error) => tracing::warn!(%error, "replay failed, retrying"),
            }
        }
        if self.restore_wait_due && !self.replay_due {
            self.clear_restore_wait().await;
        }
    }

    /// Whether the OpenFlow connection is up and our state is on it.
    pub fn in_sync(&self) -> bool {
        !self.replay_due
    }

    pub fn ovsdb_connected(&self) -> bool {
        self.ovsdb.is_some()
    }

    /// Reads the flow stats, and attaches the eBPF counters to ports that came (releasing
    /// those gone).
    pub async fn poll_stats(&mut self) {
        if let Err(error) = self.engine.poll_stats().await {
            tracing::debug!(%error, "flow stats not read");
        }
        if let Some(ovsdb) = self.ovsdb.as_mut() {
            self.ports.follow(ovsdb, &self.bridge).await;
        }
    }

    /// Takes this agent's flows off the bridge (see [`PolicyEngine::withdraw`]).
    pub async fn withdraw(self) -> Result<(), VmAgentError> {
        Ok(self.engine.withdraw().await?)
    }

    /// Clears `other_config:flow-restore-wait` (see [`OvsdbClient::clear_flow_restore_wait`]);
    /// reconnects to OVSDB when needed; retried on the next maintenance when it fails.
    async fn clear_restore_wait(&mut self) {
        if self.ovsdb.is_none() {
            self.ovsdb = connect_ovsdb(&self.db_socket).await;
        }
        let Some(client) = self.ovsdb.as_mut() else {
            return;
        };
        match client.clear_flow_restore_wait().await {
            Ok(cleared) => {
                if cleared {
                    tracing::info!("flows restored: cleared other_config:flow-restore-wait");
                }
                self.restore_wait_due = false;
            }
            Err(error) => {
                tracing::warn!(%error, "flow-restore-wait not checked; retrying");
                self.ovsdb = None;
            }
        }
    }
}

async fn connect_ovsdb(db_socket: &Path) -> Option<OvsdbClient> {
    match OvsdbClient::connect(db_socket, Duration::from_secs(2)).await {
        Ok(client) => Some(client),
        Err(error) => {
            tracing::warn!(%error, socket = %db_socket.display(), "OVSDB unreachable; retrying later");
            None
        }
    }
}

/// `desired` with every interface given without an ofport resolved by name on the bridge, and
/// the names of those whose name is no port (yet): they are left out, so the compiler never
/// sees port 0. Without OVSDB, unresolved interfaces are left out the same way.
async fn resolve_ports(
    desired: &PolicySet,
    ovsdb: &mut Option<OvsdbClient>,
) -> (PolicySet, Vec<String>) {
    let unresolved = desired
        .applied_to_groups
        .values()
        .flat_map(|group| group.members.values())
        .any(|member| member.ofport == UNRESOLVED_PORT);
    if !unresolved {
        return (desired.clone(), Vec::new());
    }
    let ports = match ovsdb.as_mut() {
        Some(client) => match sluice_ovs::interface_ports(client).await {
            Ok(ports) => ports,
            Err(error) => {
                tracing::warn!(%error, "port numbers not read from OVSDB");
                *ovsdb = None;
                Default::default()
            }
        },
        None => Default::default(),
    };
    let mut missing = Vec::new();
    let mut resolved = desired.clone();
    for group in resolved.applied_to_groups.values_mut() {
        group.members.retain(|name, member| {
            if member.ofport != UNRESOLVED_PORT {
                return true;
            }
            match ports.get(name) {
                Some(&ofport) => {
                    member.ofport = ofport;
                    true
                }
                None => {
                    missing.push(name.clone());
                    false
                }
            }
        });
    }
    missing.sort();
    missing.dedup();
    (resolved, missing)
}

/// Sets the gauge, and logs when the set of unresolved interfaces changed.
fn note_unresolved(before: &[String], now: &[String], metrics: &RealizeMetrics) {
    metrics
        .unresolved_interfaces
        .set(i64::try_from(now.len()).unwrap_or(i64::MAX));
    if before != now && !now.is_empty() {
        tracing::warn!(interfaces = ?now, "no port of these names on the bridge yet; their rules wait");
    } else if before != now {
        tracing::info!("every applied-to interface is on the bridge");
    }
}
