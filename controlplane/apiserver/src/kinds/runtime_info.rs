//! `vm.sluice.dev/v1alpha1 VirtualMachineRuntimeInfo`: cluster-scoped, named as its VM; what a
//! VM's agent reports every few seconds and on every change (the seed's shape: top-level
//! fields, no spec or status). Only that VM's agent may write it; the VMManager reads each
//! write as a heartbeat.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_vm_lifecycle::AgentMode;

use super::vm_fields::{self, GROUP, MAX_SHORT, VERSION};

/// `agentState` values: No-Op until the agent found its Agented VM, then Active.
pub const AGENT_STATES: [&str; 2] = AgentMode::NAMES;

pub fn runtime_info() -> KindSpec {
    KindSpec {
        group: GROUP.into(),
        version: VERSION.into(),
        kind: sluice_vm_lifecycle::RUNTIME_INFO.into(),
        plural: "virtualmachineruntimeinfos".into(),
        singular: "virtualmachineruntimeinfo".into(),
        short_names: vec!["vmri".into()],
        namespaced: false,
        status_subresource: false,
        printer_columns: vec![
            PrinterColumn::new("Agent State", ".agentState", "string", &AgentMode::one_of()),
            PrinterColumn::new("Agent", ".agentVersion", "string", "the agent's version"),
            PrinterColumn::new("OS", ".os", "string", "the VM's operating system"),
            PrinterColumn::new(
                "Reported",
                ".reportedAt",
                "date",
                "the agent's clock at its last report",
            ),
        ],
        schema: json!({"type": "object", "properties": {
            "agentState": {"type": "string", "description": AgentMode::one_of()},
            "os": {"type": "string"},
            "agentVersion": {"type": "string"},
            "networkPolicies": vm_fields::policies_schema(),
            "conditions": vm_fields::conditions_schema(),
            "reportedAt": {"type": "string", "description": "the agent's clock (informational)"}}}),
        validate,
    }
}

fn validate(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    vm_fields::check_one_of(object, "agentState", &AGENT_STATES, &mut errors);
    vm_fields::check_string(object, "os", MAX_SHORT, &mut errors);
    vm_fields::check_string(object, "agentVersion", MAX_SHORT, &mut errors);
    vm_fields::check_policies(object, "networkPolicies", &mut errors);
    vm_fields::check_conditions(object, "conditions", &mut errors);
    vm_fields::check_time(object, "reportedAt", &mut errors);
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::policy::tests::created;

    fn info(fields: Value) -> Value {
        let mut object = json!({"apiVersion": "vm.sluice.dev/v1alpha1",
            "kind": "VirtualMachineRuntimeInfo", "metadata": {"name": "vm1"}});
        if let (Some(object), Some(fields)) = (object.as_object_mut(), fields.as_object()) {
            object.extend(fields.clone());
        }
        object
    }

    #[test]
    fn a_full_report_passes() {
        let report = info(json!({"agentState": "Active", "os": "Debian 12",
            "agentVersion": "0.1.0", "networkPolicies": {"web": "3"},
            "conditions": [{"type": "OVSDBConnected", "status": "True",
                            "lastTransitionTime": "2026-01-02T03:04:05Z"}],
            "reportedAt": "2026-01-02T03:04:05Z"}));
        let stored = created(&runtime_info(), report);
        assert_eq!(stored["networkPolicies"], json!({"web": "3"}));
    }

    #[test]
    fn hostile_reports_are_refused_field_by_field() {
        let report = info(json!({"agentState": "Sleeping", "os": "x".repeat(300),
            "agentVersion": 7, "networkPolicies": {"web": "03x"},
            "conditions": [{"type": "X", "status": "Yes"}], "reportedAt": "soon"}));
        let fields: Vec<String> = validate(&report).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "agentState",
                "os",
                "agentVersion",
                "networkPolicies[web]",
                "conditions[0].status",
                "reportedAt"
            ]
        );
    }
}
