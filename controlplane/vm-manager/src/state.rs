//! The VMManager's decisions as plain functions on plain data: a VM's state (seed 004's state
//! machine), the status the VMManager writes on a `VirtualMachine`, and a NetworkPolicy's
//! realization status. No I/O, no clock: `now` is an argument, so every transition is a table
//! row in the tests. The words (managements, states, reasons, condition types, phases) are
//! `sluice-vm-lifecycle`'s, shared with the kinds' validation and the VM agent.
//!
//! ```text
//!   spec.management    runtime info / heartbeat           state
//!   Unmanaged          any                                Unmanaged
//!   Agentless          any                                Agentless
//!   Agented            never reported                     AgentedBootstrap
//!   Agented            last heartbeat younger than T      AgentedConnected
//!   Agented            last heartbeat T or older          AgentedBootstrap
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde_json::{json, Map, Value};
use sluice_apimachinery::timestamp::{format_rfc3339, parse_rfc3339};

use sluice_vm_lifecycle::{ConditionStatus, PolicyPhase, VmCondition};
pub use sluice_vm_lifecycle::{ConnectedReason as Reason, Management, VmState, AGENT_CONDITIONS};

/// The management a stored VM asks for (`None`: not one of the three, which validation
/// refuses; such an object is left alone).
pub fn management_of(vm: &Value) -> Option<Management> {
    Management::parse(vm.pointer("/spec/management").and_then(Value::as_str)?)
}

/// The state a stored VM's status records, if any.
pub fn state_of(vm: &Value) -> Option<VmState> {
    vm.pointer("/status/state")
        .and_then(Value::as_str)
        .and_then(VmState::parse)
}

/// The state machine: `heartbeat` is when a runtime-info write was last seen (`None`: the
/// agent never reported, or its runtime info is gone).
pub fn evaluate(
    management: Management,
    heartbeat: Option<SystemTime>,
    now: SystemTime,
    timeout: Duration,
) -> (VmState, Reason) {
    match (management, heartbeat) {
        (Management::Unmanaged, _) => (VmState::Unmanaged, Reason::Unmanaged),
        (Management::Agentless, _) => (VmState::Agentless, Reason::Agentless),
        (Management::Agented, None) => (VmState::AgentedBootstrap, Reason::NeverReported),
        // A heartbeat in the future (another replica's clock ahead of this one) is fresh.
        (Management::Agented, Some(at)) => match now.duration_since(at) {
            Ok(age) if age >= timeout => (VmState::AgentedBootstrap, Reason::HeartbeatMissed),
            _ => (VmState::AgentedConnected, Reason::HeartbeatReceived),
        },
    }
}

/// What the VMManager knows about one VM.
#[derive(Debug, Clone, Copy)]
pub struct VmInputs<'a> {
    /// The stored `VirtualMachine` (its current status included).
    pub vm: &'a Value,
    /// Its stored runtime info, if any.
    pub runtime_info: Option<&'a Value>,
    /// When this replica last saw the runtime info written.
    pub seen: Option<SystemTime>,
    /// When this replica last listed the VMs: a VM stored `AgentedConnected` counts as heard
    /// from then. While the control plane was away its agents could not report, so it gives
    /// them one timeout to do so instead of demoting every VM as it starts (Kubernetes' node
    /// controller grants the same grace after it starts).
    pub listed: SystemTime,
    pub now: SystemTime,
    pub timeout: Duration,
}

/// The status a VM should have, and the state change it makes.
#[derive(Debug, Clone, PartialEq)]
pub struct VmDecision {
    pub status: Value,
    pub from: Option<VmState>,
    pub to: VmState,
    pub reason: Reason,
}

impl VmDecision {
    /// Whether the state changes (a first status counts).
    pub fn transition(&self) -> bool {
        self.from != Some(self.to)
    }
}

/// The last heartbeat anyone saw: the later of this replica's sighting and the stored
/// `status.lastHeartbeat` (another replica's), and none without a runtime info.
pub fn heartbeat(inputs: &VmInputs<'_>) -> Option<SystemTime> {
    inputs.runtime_info?;
    let stored = stored_heartbeat(inputs.vm);
    match (inputs.seen, stored) {
        (Some(seen), Some(stored)) => Some(seen.max(stored)),
        (seen, stored) => seen.or(stored),
    }
}

fn stored_heartbeat(vm: &Value) -> Option<SystemTime> {
    vm.pointer("/status/lastHeartbeat")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
}

/// The heartbeat the state machine judges: the last one seen, or the replica's list time for
/// a VM stored `AgentedConnected` (the grace of [`VmInputs::listed`]). The grace never
/// promotes a VM: once stored otherwise, only a report makes it Connected.
fn judged_heartbeat(inputs: &VmInputs<'_>, beat: Option<SystemTime>) -> Option<SystemTime> {
    let beat = beat?;
    if state_of(inputs.vm) == Some(VmState::AgentedConnected) {
        return Some(beat.max(inputs.listed));
    }
    Some(beat)
}

/// The `status.lastHeartbeat` to write: the stored one while the last heartbeat is less than a
/// timeout newer and the state stays, else the last heartbeat. The state is judged from this
/// replica's sightings, not from this field, so refreshing it once per timeout (not per
/// report) costs one VM write per timeout instead of one per report (issue 36: at 5,000 VMs
/// the per-report write was a tenth of the control plane's steady CPU).
fn recorded_heartbeat(
    inputs: &VmInputs<'_>,
    beat: Option<SystemTime>,
    state: VmState,
) -> Option<SystemTime> {
    let beat = beat?;
    let stored = stored_heartbeat(inputs.vm).filter(|_| state_of(inputs.vm) == Some(state));
    match stored {
        Some(stored) if beat.duration_since(stored).unwrap_or_default() < inputs.timeout => {
            Some(stored)
        }
        _ => Some(beat),
    }
}

/// The VM's status as the VMManager writes it; `None` for a VM whose management is invalid.
pub fn vm_status(inputs: &VmInputs<'_>) -> Option<VmDecision> {
    let management = management_of(inputs.vm)?;
    let beat = heartbeat(inputs);
    let judged = judged_heartbeat(inputs, beat);
    let (state, reason) = evaluate(management, judged, inputs.now, inputs.timeout);
    let mut status = Map::new();
    status.insert("state".into(), json!(state.as_str()));
    if let Some(beat) = recorded_heartbeat(inputs, beat, state) {
        status.insert("lastHeartbeat".into(), json!(format_rfc3339(beat)));
    }
    if let Some(info) = inputs.runtime_info {
        for field in ["agentVersion", "os", "agentState"] {
            if let Some(value) = info.get(field).filter(|value| value.is_string()) {
                status.insert(field.into(), value.clone());
            }
        }
        // What is enforced now: only a connected agent's report counts (a VM gone Agentless,
        // or whose agent stopped reporting, keeps its agent's last report on the runtime info,
        // but nothing says those flows still stand). `kubectl get vmnp` counts the same way.
        let policies = info.get("networkPolicies").and_then(Value::as_object);
        if let Some(policies) = policies.filter(|_| state == VmState::AgentedConnected) {
            status.insert("networkPolicies".into(), Value::Object(policies.clone()));
            status.insert("policiesRealized".into(), json!(policies.len()));
        }
    }
    if state != VmState::AgentedConnected {
        status.insert("policiesRealized".into(), json!(0));
    }
    let conditions = conditions(inputs, state, reason);
    status.insert("conditions".into(), Value::Array(conditions));
    Some(VmDecision {
        status: Value::Object(status),
        from: state_of(inputs.vm),
        to: state,
        reason,
    })
}

fn conditions(inputs: &VmInputs<'_>, state: VmState, reason: Reason) -> Vec<Value> {
    let connected = state == VmState::AgentedConnected;
    let message = match reason {
        Reason::HeartbeatReceived => "the agent reports its runtime info".to_string(),
        Reason::NeverReported => "the agent has not reported its runtime info yet".to_string(),
        Reason::HeartbeatMissed => format!(
            "no runtime info from the agent for {}s or more",
            inputs.timeout.as_secs_f64()
        ),
        Reason::Agentless => "the VM runs without an agent".to_string(),
        Reason::Unmanaged => "Sluice does not manage the VM".to_string(),
    };
    let mut list = vec![condition(
        inputs,
        VmCondition::AgentConnected.as_str(),
        connected,
        reason.as_str(),
        &message,
    )];
    if state == VmState::Agentless {
        list.push(condition(
            inputs,
            VmCondition::SecurityGroupsRequired.as_str(),
            true,
            Reason::Agentless.as_str(),
            "no agent enforces this VM's policies: a cloud security-group integration must",
        ));
    }
    let reported = inputs
        .runtime_info
        .and_then(|info| info.get("conditions"))
        .and_then(Value::as_array);
    for reported in reported.into_iter().flatten() {
        let kind = reported.get("type").and_then(Value::as_str);
        if kind.is_some_and(|kind| AGENT_CONDITIONS.contains(&kind)) {
            list.push(reported.clone());
        }
    }
    list
}

/// A condition whose lastTransitionTime moves only when its status does.
fn condition(
    inputs: &VmInputs<'_>,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> Value {
    let status = ConditionStatus::of(status).as_str();
    let previous = inputs
        .vm
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|old| old.get("type").and_then(Value::as_str) == Some(kind));
    let since = previous
        .filter(|old| old.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|old| old.get("lastTransitionTime"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format_rfc3339(inputs.now));
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since})
}

/// A NetworkPolicy's realization status: `desiredVMs` are the `AgentedConnected` VMs of its
/// span, `realizedVMs` those of them whose runtime info reports the policy at its current
/// generation; `Pending` until a VM is desired, `Realizing` until all are realized.
pub fn policy_status(
    policy: &Value,
    span: &BTreeSet<String>,
    states: &BTreeMap<String, VmState>,
    runtime_infos: &BTreeMap<String, Value>,
) -> Value {
    let name = policy
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let generation = policy
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let wanted = generation.to_string();
    let desired: Vec<&String> = span
        .iter()
        .filter(|vm| {
            states
                .get(*vm)
                .is_some_and(|state| state.receives_policies())
        })
        .collect();
    let realized = desired
        .iter()
        .filter(|vm| {
            runtime_infos
                .get(vm.as_str())
                .and_then(|info| info.pointer("/networkPolicies"))
                .and_then(|policies| policies.get(name))
                .and_then(Value::as_str)
                == Some(wanted.as_str())
        })
        .count();
    let phase = PolicyPhase::of(desired.len(), realized).as_str();
    json!({"observedGeneration": generation, "desiredVMs": desired.len(),
           "realizedVMs": realized, "phase": phase})
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
