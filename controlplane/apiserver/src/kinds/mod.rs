//! The kinds Sluice's control plane serves, declared as data for `sluice-apimachinery`. Each
//! kind's semantic validation is the one its data-plane consumer applies to files, so an object
//! the API accepts is one the gateway, node or VM agent accepts, with the same messages.

mod address_group;
mod agent;
mod applied_to_group;
mod event;
mod network_policy;
mod policy;
mod runtime_info;
pub mod span;
mod status_entries;
mod token;
mod upstream_cluster;
mod virtual_machine;
pub mod vm_fields;

use serde_json::Value;
use sluice_apimachinery::{FieldError, Registry, RegistryError};

pub use address_group::address_group;
pub use agent::agent;
pub use applied_to_group::applied_to_group;
pub use event::{event, EVENT_TYPES, MAX_MESSAGE, MAX_REASON};
pub use network_policy::network_policy;
pub use runtime_info::{runtime_info, AGENT_STATES};
pub use span::{in_span, receives_policies, PolicyResource, SpanByVm, SpanIndex};
pub use status_entries::foreign_status_change;
pub use token::{token, token_identity};
pub use upstream_cluster::upstream_cluster;
pub use virtual_machine::{virtual_machine, CONNECTED, MANAGEMENTS, VM_STATES};

/// Every kind the control plane serves.
pub fn registry() -> Result<Registry, RegistryError> {
    Registry::new()
        .with(upstream_cluster())?
        .with(agent())?
        .with(network_policy())?
        .with(address_group())?
        .with(applied_to_group())?
        .with(token())?
        .with(virtual_machine())?
        .with(runtime_info())?
        .with(event())
}

/// An error at `path` (kube notation: `spec.servers[0].endpoint`) quoting the value there.
fn invalid_at(object: &Value, path: &str, reason: impl Into<String>) -> FieldError {
    FieldError::invalid(path, value_at(object, path).clone(), reason)
}

/// The value at a kube-notation path; `Null` where the path leads nowhere (a missing field).
fn value_at<'a>(object: &'a Value, path: &str) -> &'a Value {
    let mut current = object;
    for part in path.split('.').filter(|part| !part.is_empty()) {
        let (key, indexes) = match part.find('[') {
            Some(at) => (&part[..at], &part[at..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            current = current.get(key).unwrap_or(&Value::Null);
        }
        for index in indexes.split('[').filter(|index| !index.is_empty()) {
            let index = index.trim_end_matches(']').parse::<usize>().ok();
            current = index
                .and_then(|index| current.get(index))
                .unwrap_or(&Value::Null);
        }
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_registry_serves_every_kind_once() {
        let registry = registry().unwrap();
        assert!(registry
            .by_resource("proxy.sluice.dev", "v1alpha1", "upstreamclusters")
            .is_some());
        assert!(registry
            .by_resource("tunnel.sluice.dev", "v1alpha1", "agents")
            .is_some());
        for plural in ["networkpolicies", "addressgroups", "appliedtogroups"] {
            assert!(registry
                .by_resource("policy.sluice.dev", "v1alpha1", plural)
                .is_some());
        }
        for plural in ["virtualmachines", "virtualmachineruntimeinfos"] {
            assert!(registry
                .by_resource("vm.sluice.dev", "v1alpha1", plural)
                .is_some());
        }
    }

    #[test]
    fn paths_lead_to_their_values() {
        let object = json!({"spec": {"servers": [{"endpoint": "a"}, {"endpoint": "b"}]}});
        assert_eq!(value_at(&object, "spec.servers[1].endpoint"), &json!("b"));
        assert_eq!(value_at(&object, "spec.servers[7].endpoint"), &Value::Null);
        assert_eq!(value_at(&object, "spec.missing"), &Value::Null);
        assert_eq!(value_at(&object, ""), &object);
    }
}
