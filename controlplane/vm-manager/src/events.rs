//! The Event a VM's state change records (`kubectl describe vm` shows it): the state machine's
//! reason as the event's reason, Warning when a connected agent went quiet.

use serde_json::Value;
use sluice_apiserver::events::{EventType, Involved, Occurrence};
use sluice_apiserver::kinds::virtual_machine;

use crate::state::{Reason, VmDecision, VmState};

/// The component VM events name as their source.
pub const COMPONENT: &str = "vm-manager";

/// The event of a written decision that changes the VM's state.
pub fn transition_event(vm: &Value, decision: &VmDecision) -> Occurrence {
    let spec = virtual_machine();
    let text = |field: &str| vm.pointer(field).and_then(Value::as_str).unwrap_or("");
    let involved = Involved {
        api_version: spec.api_version(),
        kind: spec.kind,
        name: text("/metadata/name").to_string(),
        namespace: None,
        uid: text("/metadata/uid").to_string(),
    };
    let warning =
        decision.to == VmState::AgentedBootstrap && decision.reason == Reason::HeartbeatMissed;
    let event_type = if warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let message = format!(
        "state {} -> {}",
        decision.from.map_or("None", VmState::as_str),
        decision.to.as_str()
    );
    Occurrence::new(
        involved,
        event_type,
        decision.reason.as_str(),
        &message,
        COMPONENT,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decision(from: Option<VmState>, to: VmState, reason: Reason) -> VmDecision {
        VmDecision {
            status: json!({}),
            from,
            to,
            reason,
        }
    }

    #[test]
    fn a_missed_heartbeat_is_a_warning_and_the_rest_normal() {
        let vm = json!({"metadata": {"name": "vm1", "uid": "u-1"}});
        let connected = transition_event(
            &vm,
            &decision(
                Some(VmState::AgentedBootstrap),
                VmState::AgentedConnected,
                Reason::HeartbeatReceived,
            ),
        );
        assert_eq!(connected.event_type, EventType::Normal);
        assert_eq!(connected.reason, "HeartbeatReceived");
        assert_eq!(
            connected.message,
            "state AgentedBootstrap -> AgentedConnected"
        );
        assert_eq!(
            (
                connected.involved.name.as_str(),
                connected.involved.uid.as_str()
            ),
            ("vm1", "u-1")
        );
        assert_eq!(connected.involved.kind, "VirtualMachine");
        assert_eq!(connected.involved.namespace, None);
        let missed = transition_event(
            &vm,
            &decision(
                Some(VmState::AgentedConnected),
                VmState::AgentedBootstrap,
                Reason::HeartbeatMissed,
            ),
        );
        assert_eq!(missed.event_type, EventType::Warning);
        let first = transition_event(
            &vm,
            &decision(None, VmState::AgentedBootstrap, Reason::NeverReported),
        );
        assert_eq!(
            (first.event_type, first.message.as_str()),
            (EventType::Normal, "state None -> AgentedBootstrap")
        );
    }
}
