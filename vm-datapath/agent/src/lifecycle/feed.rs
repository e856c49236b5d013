//! What the agent watches on the control plane: its span of the three policy resources (the
//! server sends only the objects in its span, with only this VM's interfaces in each applied-to
//! group, and only while the VM is AgentedConnected) and its own VirtualMachine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_policy::model::PolicySet;
use sluice_watch_client::{
    Resource, Snapshot, Transport, WatchClient, WatchClientConfig, WatchMetrics,
};
use tokio::sync::watch;

use super::decision::{Observed, VmView};
use super::persist::Enforced;

const POLICY_GROUP: &str = "policy.sluice.dev";
const VM_GROUP: &str = sluice_vm_lifecycle::GROUP;
const VERSION: &str = "v1alpha1";
/// The three policy resources, in the order `load_objects` takes them.
const POLICY_RESOURCES: [&str; 3] = ["addressgroups", "appliedtogroups", "networkpolicies"];

/// The agent's watch settings: a short backoff ceiling, since a VM agent that lost its control
/// plane has nothing better to do than to come back quickly (jitter spreads a fleet).
fn agent_config(client: &WatchClientConfig) -> WatchClientConfig {
    let mut config = client.clone();
    config.backoff_max = Duration::from_secs(2);
    config
}

/// The three policy watches.
pub struct PolicyFeed {
    snapshots: Vec<watch::Receiver<Arc<Snapshot>>>,
    progress: Vec<watch::Receiver<String>>,
}

/// The policy objects the agent may see now, and the revision all three watches are
/// complete at.
pub struct PolicyView {
    pub objects: [Vec<Value>; 3],
    pub progress: u64,
}

/// A policy set built from objects, with what the runtime info reports of it.
pub struct Loaded {
    pub set: PolicySet,
    /// Policy `metadata.name` -> the `metadata.generation` realized (decimal).
    pub generations: BTreeMap<String, String>,
}

impl PolicyFeed {
    /// Starts the watches on `transport` (shared with the agent's other watch and its reports).
    pub fn spawn(
        client: &WatchClientConfig,
        transport: &Arc<Transport>,
        metrics: &WatchMetrics,
    ) -> Self {
        let mut feed = PolicyFeed {
            snapshots: Vec::new(),
            progress: Vec::new(),
        };
        for plural in POLICY_RESOURCES {
            let client = WatchClient::with_transport(
                agent_config(client),
                Resource::new(POLICY_GROUP, VERSION, plural),
                metrics.for_resource(plural),
                transport.clone(),
            );
            feed.snapshots.push(client.subscribe());
            feed.progress.push(client.progress());
            tokio::spawn(client.run(std::future::pending()));
        }
        feed
    }

    /// Resolves when a snapshot or a watch's progress changed; `false` once the watches are
    /// gone (they run until the process ends, so: never).
    pub async fn changed(&mut self) -> bool {
        let snapshots = futures_util::future::select_all(
            self.snapshots
                .iter_mut()
                .map(|receiver| Box::pin(receiver.changed())),
        );
        let progress = futures_util::future::select_all(
            self.progress
                .iter_mut()
                .map(|receiver| Box::pin(receiver.changed())),
        );
        tokio::select! {
            (result, _, _) = snapshots => result.is_ok(),
            (result, _, _) = progress => result.is_ok(),
        }
    }

    /// The objects now, once all three resources have been listed.
    pub fn view(&mut self) -> Option<PolicyView> {
        let snapshots: Vec<Arc<Snapshot>> = self
            .snapshots
            .iter_mut()
            .map(|receiver| receiver.borrow_and_update().clone())
            .collect();
        if !snapshots.iter().all(|snapshot| snapshot.synced) {
            return None;
        }
        let progress = self
            .progress
            .iter_mut()
            .map(|receiver| receiver.borrow_and_update().parse::<u64>().unwrap_or(0))
            .min()
            .unwrap_or(0);
        let list = |index: usize| -> Vec<Value> {
            snapshots[index]
                .objects
                .values()
                .map(|object| object.as_ref().clone())
                .collect()
        };
        Some(PolicyView {
            objects: [list(0), list(1), list(2)],
            progress,
        })
    }
}

impl PolicyView {
    pub fn into_enforced(self, vm: &str) -> Enforced {
        let [address_groups, applied_to_groups, network_policies] = self.objects;
        Enforced {
            vm: vm.to_string(),
            address_groups,
            applied_to_groups,
            network_policies,
        }
    }
}

/// Builds the policy set of saved or watched objects; `origin` names them in errors.
pub fn load(
    enforced: &Enforced,
    origin: &str,
) -> Result<Loaded, sluice_config_error::InvalidConfig> {
    let loaded = sluice_policy::object::load_objects(
        &enforced.address_groups,
        &enforced.applied_to_groups,
        &enforced.network_policies,
        origin,
    )?;
    if !loaded.waiting.is_empty() {
        tracing::info!(policies = ?loaded.waiting, "policies wait for groups this agent does not hold yet");
    }
    let generations = enforced
        .network_policies
        .iter()
        .filter_map(|policy| {
            let name = policy.pointer("/metadata/name")?.as_str()?;
            let generation = policy.pointer("/metadata/generation")?.as_i64()?;
            (!loaded.waiting.iter().any(|waiting| waiting == name))
                .then(|| (name.to_string(), generation.to_string()))
        })
        .collect();
    Ok(Loaded {
        set: loaded.set,
        generations,
    })
}

/// The watch of the agent's own VirtualMachine (the server shows a VM agent no other).
pub struct VmFeed {
    vm: String,
    snapshot: watch::Receiver<Arc<Snapshot>>,
}

impl VmFeed {
    pub fn spawn(
        client: &WatchClientConfig,
        transport: &Arc<Transport>,
        vm: &str,
        metrics: &WatchMetrics,
    ) -> Self {
        let plural = "virtualmachines";
        let client = WatchClient::with_transport(
            agent_config(client),
            Resource::new(VM_GROUP, VERSION, plural),
            metrics.for_resource(plural),
            transport.clone(),
        );
        let snapshot = client.subscribe();
        tokio::spawn(client.run(std::future::pending()));
        VmFeed {
            vm: vm.to_string(),
            snapshot,
        }
    }

    pub async fn changed(&mut self) -> bool {
        self.snapshot.changed().await.is_ok()
    }

    /// What the control plane says of this VM now.
    pub fn observed(&mut self) -> Observed {
        let snapshot = self.snapshot.borrow_and_update().clone();
        if !snapshot.synced {
            return Observed::Unknown;
        }
        let object = snapshot
            .objects
            .iter()
            .find_map(|(key, object)| (key.name == self.vm).then_some(object));
        match object {
            None => Observed::Absent,
            Some(object) => match VmView::from_object(object) {
                Ok(view) => Observed::Present(view),
                Err(error) => {
                    tracing::warn!(vm = %self.vm, %error, "the VirtualMachine does not read; nothing changes");
                    Observed::Unknown
                }
            },
        }
    }
}
