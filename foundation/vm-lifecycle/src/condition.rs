//! The conditions on a VirtualMachine and on its runtime info, with their reasons.

vocabulary! {
    /// The conditions the VMManager itself writes on a VirtualMachine.
    VmCondition, "status.conditions[].type", 2 {
        /// True in `AgentedConnected`; its reason is a [`crate::ConnectedReason`].
        AgentConnected => "AgentConnected",
        /// Set (True, reason `Agentless`) on an Agentless VM: nothing in Sluice enforces its
        /// policies.
        SecurityGroupsRequired => "SecurityGroupsRequired",
    }
}

vocabulary! {
    /// The conditions an agent reports in its runtime info; the VMManager copies exactly these
    /// onto the VM (others stay on the runtime info, so the VM's list stays bounded).
    AgentCondition, "conditions[].type", 4 {
        ControlPlaneConnected => "ControlPlaneConnected",
        OVSDBConnected => "OVSDBConnected",
        OpenFlowConnected => "OpenFlowConnected",
        PoliciesRealized => "PoliciesRealized",
    }
}

/// The agent conditions the VMManager copies onto the VM.
pub const AGENT_CONDITIONS: [&str; 4] = AgentCondition::NAMES;

impl AgentCondition {
    /// The condition's reason when it holds (`up`) and when it does not.
    pub const fn reason(self, up: bool) -> &'static str {
        match (self, up) {
            (AgentCondition::ControlPlaneConnected, true) => "Reporting",
            (AgentCondition::OVSDBConnected | AgentCondition::ControlPlaneConnected, false) => {
                "Unreachable"
            }
            (AgentCondition::OVSDBConnected, true) => "Connected",
            (AgentCondition::OpenFlowConnected, true) => "InSync",
            (AgentCondition::OpenFlowConnected, false) => "Reconnecting",
            (AgentCondition::PoliciesRealized, true) => "Realized",
            (AgentCondition::PoliciesRealized, false) => "Failed",
        }
    }
}

vocabulary! {
    /// A condition's `status` (kube's `ConditionStatus`; Sluice never writes `Unknown`).
    ConditionStatus, "status.conditions[].status", 2 {
        True => "True",
        False => "False",
    }
}

impl ConditionStatus {
    pub const fn of(holds: bool) -> Self {
        if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}
