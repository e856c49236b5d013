//! The VMManager's metrics, on the control plane's `/metrics`. Label values come from fixed
//! sets (the four states, `ok`/`conflict`/`error`), never from object names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::state::VmState;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// The previous state, or `None` for a VM's first status.
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Counters and gauges of one VMManager (one per control-plane replica).
#[derive(Debug, Clone, Default)]
pub struct VmMetrics {
    pub states: Family<StateLabels, Gauge>,
    pub transitions: Family<TransitionLabels, Counter>,
    pub heartbeats: Counter,
    pub status_writes: Family<ResultLabels, Counter>,
}

impl VmMetrics {
    /// Registers the metrics in `registry` (the API server's) and returns them.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // Every state is present from the start, so a dashboard sees 0 rather than nothing.
        for state in VmState::ALL {
            let _ = metrics.states.get_or_create(&StateLabels {
                state: state.as_str(),
            });
        }
        registry.register(
            "sluice_vm_state",
            "VirtualMachines per state, as stored",
            metrics.states.clone(),
        );
        registry.register(
            "sluice_vm_state_transitions",
            "VirtualMachine state changes this replica wrote",
            metrics.transitions.clone(),
        );
        registry.register(
            "sluice_vm_heartbeats",
            "runtime-info writes this replica saw",
            metrics.heartbeats.clone(),
        );
        registry.register(
            "sluice_vm_manager_status_writes",
            "status writes of VirtualMachines and NetworkPolicies, by result",
            metrics.status_writes.clone(),
        );
        metrics
    }

    pub fn set_states(&self, counts: &[(VmState, i64)]) {
        for (state, count) in counts {
            self.states
                .get_or_create(&StateLabels {
                    state: state.as_str(),
                })
                .set(*count);
        }
    }

    pub fn transition(&self, from: Option<VmState>, to: VmState) {
        let labels = TransitionLabels {
            from: from.map_or("None", VmState::as_str),
            to: to.as_str(),
        };
        self.transitions.get_or_create(&labels).inc();
    }

    pub fn write(&self, result: &'static str) {
        self.status_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}
