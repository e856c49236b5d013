//! `vm.sluice.dev/v1alpha1 VirtualMachine`: cluster-scoped; the operator's choice of how a VM
//! is managed (`spec.management`) and its uplink, and (status subresource, written only by the
//! control plane's VMManager) the state the VMManager derives from its agent's heartbeats.

use std::net::IpAddr;

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_vm_lifecycle::{Management, VmState};

use super::vm_fields::{self, GROUP, MAX_SHORT, VERSION};

/// `spec.management` values.
pub const MANAGEMENTS: [&str; 3] = Management::NAMES;
/// `status.state` values, as the VMManager writes them.
pub const VM_STATES: [&str; 4] = VmState::NAMES;
/// The state in which a VM's agent receives policies.
pub const CONNECTED: &str = VmState::AgentedConnected.as_str();
/// Most uplink addresses.
const MAX_IPS: usize = 64;

pub fn virtual_machine() -> KindSpec {
    KindSpec {
        group: GROUP.into(),
        version: VERSION.into(),
        kind: sluice_vm_lifecycle::VIRTUAL_MACHINE.into(),
        plural: "virtualmachines".into(),
        singular: "virtualmachine".into(),
        short_names: vec!["vm".into()],
        namespaced: false,
        status_subresource: true,
        printer_columns: vec![
            PrinterColumn::new(
                "Management",
                ".spec.management",
                "string",
                &Management::one_of(),
            ),
            PrinterColumn::new(
                "State",
                ".status.state",
                "string",
                "the VMManager's state of the VM",
            ),
            PrinterColumn::new(
                "Agent",
                ".status.agentVersion",
                "string",
                "the agent's version",
            ),
            PrinterColumn::new(
                "Policies",
                ".status.policiesRealized",
                "integer",
                "policies the agent reports realized",
            ),
            PrinterColumn::new(
                "Heartbeat",
                ".status.lastHeartbeat",
                "date",
                "when the VMManager saw the agent's runtime info (refreshed once per timeout)",
            ),
        ],
        schema: json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "required": ["management"], "properties": {
                "management": {"type": "string", "description": Management::one_of()},
                "uplink": {"type": "object", "properties": {
                    "name": {"type": "string", "description": "the VM's uplink interface (eth0)"},
                    "ips": {"type": "array", "items": {"type": "string"}}}}}},
            "status": {"type": "object", "properties": {
                "state": {"type": "string"},
                "lastHeartbeat": {"type": "string"},
                "agentVersion": {"type": "string"},
                "os": {"type": "string"},
                "agentState": {"type": "string"},
                "networkPolicies": vm_fields::policies_schema(),
                "policiesRealized": {"type": "integer"},
                "conditions": vm_fields::conditions_schema()}}}}),
        validate,
    }
}

fn validate(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let management = object.pointer("/spec/management");
    match management {
        None | Some(Value::Null) => errors.push(FieldError::required(
            "spec.management",
            Management::one_of(),
        )),
        Some(_) => vm_fields::check_one_of(object, "spec.management", &MANAGEMENTS, &mut errors),
    }
    check_uplink(object, &mut errors);
    vm_fields::check_one_of(object, "status.state", &VM_STATES, &mut errors);
    vm_fields::check_time(object, "status.lastHeartbeat", &mut errors);
    for field in ["status.agentVersion", "status.os", "status.agentState"] {
        vm_fields::check_string(object, field, MAX_SHORT, &mut errors);
    }
    vm_fields::check_policies(object, "status.networkPolicies", &mut errors);
    vm_fields::check_conditions(object, "status.conditions", &mut errors);
    errors
}

fn check_uplink(object: &Value, errors: &mut Vec<FieldError>) {
    // Without an uplink the agent enforces on the VM's ports already on its bridge (an agent on
    // the VM's host rather than inside it): nothing to take over.
    match object.pointer("/spec/uplink/name") {
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if interface_name_error(name).is_none() => {}
        Some(other) => errors.push(FieldError::invalid(
            "spec.uplink.name",
            other.clone(),
            other
                .as_str()
                .and_then(interface_name_error)
                .unwrap_or("must be a string"),
        )),
    }
    let ips = match object.pointer("/spec/uplink/ips") {
        None | Some(Value::Null) => return,
        Some(Value::Array(ips)) if ips.len() <= MAX_IPS => ips,
        Some(other) => {
            return errors.push(FieldError::invalid(
                "spec.uplink.ips",
                other.clone(),
                format!("must be a list of at most {MAX_IPS} CIDRs"),
            ))
        }
    };
    for (index, ip) in ips.iter().enumerate() {
        if !ip.as_str().is_some_and(is_cidr) {
            errors.push(FieldError::invalid(
                format!("spec.uplink.ips[{index}]"),
                ip.clone(),
                "must be an address with its prefix length, e.g. 10.1.2.3/24",
            ));
        }
    }
}

/// Why `name` cannot be a Linux interface name (`dev_valid_name`), if it cannot.
fn interface_name_error(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 15 {
        return Some("an interface name has 1 to 15 bytes");
    }
    if name == "." || name == ".." {
        return Some("an interface name cannot be . or ..");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Some("an interface name has no '/', ':', whitespace or control characters");
    }
    None
}

fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(address) = address.parse::<IpAddr>() else {
        return false;
    };
    let max = if address.is_ipv4() { 32 } else { 128 };
    !prefix.is_empty()
        && prefix.len() <= 3
        && prefix.bytes().all(|byte| byte.is_ascii_digit())
        && prefix.parse::<u8>().is_ok_and(|length| length <= max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::policy::tests::created;

    fn vm(spec: Value) -> Value {
        json!({"apiVersion": "vm.sluice.dev/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": "vm1"}, "spec": spec})
    }

    #[test]
    fn valid_vms_pass() {
        let agented = vm(json!({"management": "Agented",
            "uplink": {"name": "eth0", "ips": ["10.1.2.3/24", "fd00::3/64"]}}));
        created(&virtual_machine(), agented);
        created(&virtual_machine(), vm(json!({"management": "Unmanaged"})));
        created(&virtual_machine(), vm(json!({"management": "Agentless"})));
    }

    #[test]
    fn each_mistake_names_its_field() {
        let fields = |object: Value| -> Vec<String> {
            validate(&object)
                .into_iter()
                .map(|error| error.field)
                .collect()
        };
        assert_eq!(fields(vm(json!({}))), ["spec.management"]);
        assert!(
            fields(vm(json!({"management": "Agented"}))).is_empty(),
            "an agent on the VM's host takes no uplink over"
        );
        assert_eq!(
            fields(vm(json!({"management": "Manual"}))),
            ["spec.management"]
        );
        let bad = vm(json!({"management": "Agented", "uplink": {
            "name": "a-very-long-name0", "ips": ["10.1.2.3", "10.1.2.3/33", "x/8", "::1/129"]}}));
        assert_eq!(
            fields(bad),
            [
                "spec.uplink.name",
                "spec.uplink.ips[0]",
                "spec.uplink.ips[1]",
                "spec.uplink.ips[2]",
                "spec.uplink.ips[3]"
            ]
        );
        for name in ["eth/0", "eth 0", "", ".."] {
            let object = vm(json!({"management": "Agented", "uplink": {"name": name}}));
            assert_eq!(fields(object), ["spec.uplink.name"], "{name:?}");
        }
        let mut object = vm(json!({"management": "Agentless"}));
        object["status"] = json!({"state": "Happy", "lastHeartbeat": "now",
            "networkPolicies": {"web": "one"}});
        assert_eq!(
            fields(object),
            [
                "status.state",
                "status.lastHeartbeat",
                "status.networkPolicies[web]"
            ]
        );
    }
}
