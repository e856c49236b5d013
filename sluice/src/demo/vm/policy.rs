//! The VM demo's objects: vm1 (Agented, its uplink `eth0` taken over by its agent), vm2
//! (Agentless, the peer), and the policy `demo` on vm1's `eth0`: ICMP from vm2 allowed, every
//! other ingress dropped. The same policy, in the policy-file format, is what the demo prints
//! compiled when it cannot run.

use std::net::Ipv4Addr;

use anyhow::Context;
use serde_json::{json, Value};
use sluice_apiserver::kinds::{applied_to_group, network_policy, virtual_machine};
use sluice_policy::compile::{compile_to_text, CompileOptions};
use sluice_policy::load::{load_str, Format};

/// The policy's name (what `kubectl delete vmnp` takes).
pub const POLICY: &str = "demo";
/// The OpenFlow port the printed flows assume for vm1's `eth0` (the agent looks the real one
/// up by name on its bridge).
pub const FALLBACK_OFPORT: u32 = 1;

/// The policy's spec: Ingress only, so whatever its one rule does not allow is dropped (each
/// applied-to interface gets a default drop below the rules).
fn policy_spec(vm2_ip: Ipv4Addr) -> Value {
    json!({
        "priority": 10,
        "appliedTo": ["vm1"],
        "policyTypes": ["Ingress"],
        "rules": [{
            "name": "ping-from-vm2",
            "direction": "Ingress",
            "action": "Allow",
            "peers": {"ipBlocks": [{"cidr": format!("{vm2_ip}/32")}]},
            "services": [{"protocol": "ICMP"}],
        }],
    })
}

fn object(api_version: String, kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// What the demo stores in the control plane, in order: the VMs, vm1's applied-to group, the
/// policy. The group leaves `ofport` out: the agent resolves `eth0` on its bridge.
pub fn control_plane_objects(vm1_ip: Ipv4Addr, vm2_ip: Ipv4Addr) -> Vec<Value> {
    let (vm, group, policy) = (virtual_machine(), applied_to_group(), network_policy());
    let members = json!([{"name": "eth0", "vm": "vm1", "ips": [vm1_ip.to_string()]}]);
    vec![
        object(
            vm.api_version(),
            &vm.kind,
            "vm1",
            json!({"management": "Agented", "uplink": {"name": "eth0"}}),
        ),
        object(
            vm.api_version(),
            &vm.kind,
            "vm2",
            json!({"management": "Agentless"}),
        ),
        object(
            group.api_version(),
            &group.kind,
            "vm1",
            json!({ "members": members }),
        ),
        object(
            policy.api_version(),
            &policy.kind,
            POLICY,
            policy_spec(vm2_ip),
        ),
    ]
}

/// The demo policy as a policy file (`sluice policy compile`'s input), vm1's `eth0` on
/// [`FALLBACK_OFPORT`].
pub fn policy_file(vm1_ip: Ipv4Addr, vm2_ip: Ipv4Addr) -> Value {
    let mut entry = policy_spec(vm2_ip);
    if let Some(fields) = entry.as_object_mut() {
        fields.insert("name".into(), json!(POLICY));
    }
    json!({
        "appliedToGroups": [{
            "name": "vm1",
            "members": [{"name": "eth0", "ofport": FALLBACK_OFPORT, "ips": [vm1_ip.to_string()]}],
        }],
        "policies": [entry],
    })
}

/// The flows of [`policy_file`], one `ovs-ofctl` line each, as `sluice policy compile` prints
/// them.
pub fn compiled_flows(vm1_ip: Ipv4Addr, vm2_ip: Ipv4Addr) -> anyhow::Result<String> {
    let text = policy_file(vm1_ip, vm2_ip).to_string();
    let set = load_str(&text, "the demo policy", Format::Json)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    compile_to_text(&set, &CompileOptions::default()).context("compiling the demo policy")
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM1: Ipv4Addr = Ipv4Addr::new(10, 70, 3, 11);
    const VM2: Ipv4Addr = Ipv4Addr::new(10, 70, 3, 12);

    #[test]
    fn the_fallback_flows_allow_icmp_from_vm2_and_drop_the_rest() {
        let flows = compiled_flows(VM1, VM2).expect("the demo policy compiles");
        assert!(flows.contains("nw_src=10.70.3.12"), "{flows}");
        assert!(flows.contains("icmp"), "{flows}");
        // An ingress rule matches the applied-to interface by its address.
        assert!(flows.contains("nw_dst=10.70.3.11"), "{flows}");
        assert!(
            flows.lines().any(|line| line.contains("actions=drop")),
            "{flows}"
        );
    }

    #[test]
    fn the_objects_pass_the_control_plane_validation() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = sluice_store::EmbeddedStore::open(dir.path().join("store.redb"))
            .expect("an embedded store");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        for object in control_plane_objects(VM1, VM2) {
            let stored = runtime.block_on(crate::demo::controlplane::create_demo_object(
                &store,
                object.clone(),
            ));
            assert!(stored.is_ok(), "{object}: {stored:?}");
        }
    }
}
