//! What a VM agent does next, from what it knows of its VirtualMachine: the seed's No-Op and
//! Active modes as a pure function (no I/O), so every transition is unit-tested.
//!
//! - No-Op: the agent touches nothing; it waits until it can read its VirtualMachine.
//! - Active: the VirtualMachine says `Agented`: the uplink is taken over and policies are
//!   enforced.
//! - Only an explicit answer from the control plane (the VirtualMachine is `Agentless`,
//!   `Unmanaged` or gone) takes an Active agent out of the datapath. Not knowing (the control
//!   plane unreachable, a watch not yet synced) changes nothing: a transient loss must not open
//!   the VM's traffic or cut it.

use serde_json::Value;

use crate::VmAgentError;

// The words are the control plane's: one vocabulary for the VMManager, the kinds and the agent.
pub use sluice_vm_lifecycle::{AgentMode as Mode, Management, VmState};

/// The agent's VirtualMachine as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmView {
    pub management: Management,
    /// `spec.uplink.name`: the interface to take over; `None`: the VM's ports are already on
    /// the bridge (a host-side agent) and only policies are enforced.
    pub uplink: Option<String>,
    /// `None` until the VMManager has written a status.
    pub state: Option<VmState>,
    pub resource_version: u64,
}

impl VmView {
    pub fn from_object(object: &Value) -> Result<Self, VmAgentError> {
        let management = object
            .pointer("/spec/management")
            .and_then(Value::as_str)
            .and_then(Management::parse)
            .ok_or(VmAgentError::VirtualMachineField {
                field: Management::FIELD,
                expected: "Agented, Agentless or Unmanaged",
            })?;
        // No status yet (or one this agent does not know) reads as "not decided".
        let state = object
            .pointer("/status/state")
            .and_then(Value::as_str)
            .and_then(VmState::parse);
        let resource_version = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|text| text.parse().ok())
            .ok_or(VmAgentError::VirtualMachineField {
                field: "metadata.resourceVersion",
                expected: "a decimal revision",
            })?;
        let uplink = object
            .pointer("/spec/uplink/name")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(VmView {
            management,
            uplink,
            state,
            resource_version,
        })
    }
}

/// What the agent knows of its VirtualMachine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Nothing reliable: the control plane was not reached, or its answer did not parse.
    Unknown,
    /// The control plane answered and the VM has no VirtualMachine.
    Absent,
    Present(VmView),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Stay,
    /// Take the uplink over (when named) and start enforcing.
    Activate {
        uplink: Option<String>,
    },
    /// Withdraw the flows, give the uplink back, forget the persisted policies.
    Extract,
}

pub fn next_step(mode: Mode, observed: &Observed) -> Step {
    match (mode, observed) {
        (_, Observed::Unknown) => Step::Stay,
        (Mode::NoOp, Observed::Present(view)) if view.management == Management::Agented => {
            Step::Activate {
                uplink: view.uplink.clone(),
            }
        }
        (Mode::NoOp, _) => Step::Stay,
        (Mode::Active, Observed::Present(view)) if view.management == Management::Agented => {
            Step::Stay
        }
        (Mode::Active, Observed::Absent | Observed::Present(_)) => Step::Extract,
    }
}

/// Whether the policies the agent's watches show now are the ones the control plane means it
/// to enforce: its VM is AgentedConnected, and every policy watch has caught up with the
/// revision at which the agent read that state. Before that, the watches may still show the
/// span of a VM that was not connected (empty): enforcing it would drop every policy until
/// the next event, so the agent keeps what it enforces.
pub fn policies_current(view: &VmView, progress: &[u64]) -> bool {
    view.state == Some(VmState::AgentedConnected)
        && progress
            .iter()
            .all(|&revision| revision >= view.resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(management: Management, state: Option<VmState>) -> VmView {
        VmView {
            management,
            uplink: Some("eth0".into()),
            state,
            resource_version: 10,
        }
    }

    #[test]
    fn a_vm_object_reads_into_a_view() {
        let object = json!({"metadata": {"name": "vm1", "resourceVersion": "42"},
            "spec": {"management": "Agented", "uplink": {"name": "eth0"}},
            "status": {"state": "AgentedConnected"}});
        let view = VmView::from_object(&object).unwrap();
        assert_eq!(view.management, Management::Agented);
        assert_eq!(view.uplink.as_deref(), Some("eth0"));
        assert_eq!(view.state, Some(VmState::AgentedConnected));
        assert_eq!(view.resource_version, 42);
        let no_status =
            json!({"metadata": {"resourceVersion": "3"}, "spec": {"management": "Agentless"}});
        assert_eq!(VmView::from_object(&no_status).unwrap().state, None);
        let maybe = VmView::from_object(
            &json!({"metadata": {"resourceVersion": "3"}, "spec": {"management": "Maybe"}}),
        );
        assert_eq!(
            maybe.map_err(|error| error.to_string()),
            Err("spec.management: expected Agented, Agentless or Unmanaged".to_string())
        );
        let unversioned = VmView::from_object(&json!({"spec": {"management": "Agented"}}));
        assert!(matches!(
            unversioned,
            Err(VmAgentError::VirtualMachineField {
                field: "metadata.resourceVersion",
                ..
            })
        ));
    }

    #[test]
    fn no_op_activates_only_for_an_agented_vm() {
        let agented = Observed::Present(view(Management::Agented, None));
        assert_eq!(
            next_step(Mode::NoOp, &agented),
            Step::Activate {
                uplink: Some("eth0".into())
            }
        );
        for observed in [
            Observed::Unknown,
            Observed::Absent,
            Observed::Present(view(Management::Agentless, None)),
            Observed::Present(view(Management::Unmanaged, None)),
        ] {
            assert_eq!(next_step(Mode::NoOp, &observed), Step::Stay, "{observed:?}");
        }
    }

    #[test]
    fn active_extracts_only_on_an_explicit_answer() {
        assert_eq!(next_step(Mode::Active, &Observed::Unknown), Step::Stay);
        for state in [
            None,
            Some(VmState::AgentedBootstrap),
            Some(VmState::AgentedConnected),
        ] {
            let observed = Observed::Present(view(Management::Agented, state));
            assert_eq!(next_step(Mode::Active, &observed), Step::Stay);
        }
        for observed in [
            Observed::Absent,
            Observed::Present(view(Management::Agentless, Some(VmState::Agentless))),
            Observed::Present(view(Management::Unmanaged, None)),
        ] {
            assert_eq!(
                next_step(Mode::Active, &observed),
                Step::Extract,
                "{observed:?}"
            );
        }
    }

    #[test]
    fn policies_are_current_once_connected_and_caught_up() {
        let connected = view(Management::Agented, Some(VmState::AgentedConnected));
        assert!(policies_current(&connected, &[10, 12, 10]));
        assert!(
            !policies_current(&connected, &[10, 9, 12]),
            "one watch behind"
        );
        let bootstrap = view(Management::Agented, Some(VmState::AgentedBootstrap));
        assert!(!policies_current(&bootstrap, &[20, 20, 20]));
        assert!(!policies_current(&view(Management::Agented, None), &[20]));
    }
}
