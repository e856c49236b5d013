//! The VirtualMachine lifecycle vocabulary, written once: what the operator chooses
//! (`spec.management`), what the VMManager decides (`status.state` and the `AgentConnected`
//! condition's reasons), what the agent reports (`agentState` and its four conditions with
//! their reasons), and a NetworkPolicy's realization phase.
//!
//! The control plane validates objects against these names and the VMManager writes them
//! (`controlplane/vm-manager`, `controlplane/apiserver/src/kinds/`); the VM agent reads and
//! writes the same words. Each word is an enum with `as_str`/`parse`, its names in declaration
//! order (`NAMES`), and serde as its wire name; parsing an unknown name is a [`UnknownName`]
//! error that says which field and which names are allowed.

#[macro_use]
mod vocabulary;
mod condition;

pub use condition::{AgentCondition, ConditionStatus, VmCondition, AGENT_CONDITIONS};

/// The API group of the VM kinds.
pub const GROUP: &str = "vm.sluice.dev";
/// Their version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the VM kinds.
pub const API_VERSION: &str = "vm.sluice.dev/v1alpha1";
/// The kind the operator writes and the VMManager sets the status of.
pub const VIRTUAL_MACHINE: &str = "VirtualMachine";
/// The kind a VM's agent writes (its heartbeat).
pub const RUNTIME_INFO: &str = "VirtualMachineRuntimeInfo";

/// A name that is not one of a word's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {found:?} is not one of {allowed:?}")]
pub struct UnknownName {
    /// The field the word is read from (`spec.management`).
    pub field: &'static str,
    /// What was found, cut to 64 characters.
    pub found: String,
    pub allowed: &'static [&'static str],
}

vocabulary! {
    /// What the operator chose in `spec.management`.
    Management, "spec.management", 3 {
        /// An agent in the VM enforces its policies.
        Agented => "Agented",
        /// No agent: a cloud security-group integration must enforce them.
        Agentless => "Agentless",
        /// Sluice leaves the VM alone.
        Unmanaged => "Unmanaged",
    }
}

vocabulary! {
    /// A VM's state, as the VMManager writes `status.state`.
    VmState, "status.state", 4 {
        Unmanaged => "Unmanaged",
        Agentless => "Agentless",
        /// Agented, but no fresh heartbeat: never reported, or missed.
        AgentedBootstrap => "AgentedBootstrap",
        /// Agented with a fresh heartbeat: the only state whose agent receives policies.
        AgentedConnected => "AgentedConnected",
    }
}

impl VmState {
    /// Whether a VM in this state has an agent that is sent (and counted for) policies.
    pub const fn receives_policies(self) -> bool {
        matches!(self, VmState::AgentedConnected)
    }
}

vocabulary! {
    /// Why a VM is in its state: the reason of the VMManager's `AgentConnected` condition.
    ConnectedReason, "status.conditions[AgentConnected].reason", 5 {
        HeartbeatReceived => "HeartbeatReceived",
        NeverReported => "NeverReported",
        HeartbeatMissed => "HeartbeatMissed",
        Agentless => "Agentless",
        Unmanaged => "Unmanaged",
    }
}

vocabulary! {
    /// The agent's mode, as its runtime info's `agentState` reports it.
    AgentMode, "agentState", 2 {
        /// The agent touches nothing until it can read its Agented VirtualMachine.
        NoOp => "NoOp",
        /// The uplink is taken over and policies are enforced.
        Active => "Active",
    }
}

vocabulary! {
    /// A NetworkPolicy's realization `status.phase`.
    PolicyPhase, "status.phase", 3 {
        /// No `AgentedConnected` VM in the policy's span.
        Pending => "Pending",
        /// Some desired VMs do not report the current generation yet.
        Realizing => "Realizing",
        /// Every desired VM reports the current generation.
        Realized => "Realized",
    }
}

impl PolicyPhase {
    /// The phase of a policy `desired` VMs should realize and `realized` do.
    pub const fn of(desired: usize, realized: usize) -> Self {
        if desired == 0 {
            PolicyPhase::Pending
        } else if realized >= desired {
            PolicyPhase::Realized
        } else {
            PolicyPhase::Realizing
        }
    }
}

#[cfg(test)]
mod tests;
