//! Status maps with one entry per writer: an Agent's `status.nodes.<node>` and an
//! UpstreamCluster's `status.gateways.<gateway>`. RBAC lets every node (gateway) write the
//! status; this is what keeps each one to its own entry, as Kubernetes' NodeRestriction keeps
//! a kubelet to its own Node and Pods (issue 32, finding 8: a role could rewrite the others').

use serde_json::Value;
use sluice_apimachinery::KindSpec;

use crate::auth::{Identity, Role};

/// The status map a role writes one entry of in a kind, if it has one there.
fn own_map(role: Role, spec: &KindSpec) -> Option<&'static str> {
    match (role, spec.group.as_str(), spec.plural.as_str()) {
        (Role::Node, "tunnel.sluice.dev", "agents") => Some("nodes"),
        (Role::Gateway, "proxy.sluice.dev", "upstreamclusters") => Some("gateways"),
        _ => None,
    }
}

/// The status with the writer's own entry taken out: what the writer may not change.
fn others(status: Option<&Value>, map: &str, own: &str) -> Value {
    let mut status = status.cloned().unwrap_or(Value::Null);
    if let Some(entries) = status.get_mut(map).and_then(Value::as_object_mut) {
        entries.remove(own);
        if entries.is_empty() {
            if let Some(status) = status.as_object_mut() {
                status.remove(map);
            }
        }
    }
    empty_as_null(status)
}

/// `{}` and no status mean the same: nothing.
fn empty_as_null(value: Value) -> Value {
    match value {
        Value::Object(ref fields) if fields.is_empty() => Value::Null,
        other => other,
    }
}

/// The field a node or gateway changed outside its own entry (`status.nodes` for another
/// node's entry or the map itself, `status` for anything else), or `None` when the write
/// keeps to its entry. Other roles are not restricted here.
pub fn foreign_status_change(
    identity: &Identity,
    spec: &KindSpec,
    old: &Value,
    new: &Value,
) -> Option<String> {
    let map = own_map(identity.role, spec)?;
    let own = identity.subject.as_str();
    let before = others(old.get("status"), map, own);
    let after = others(new.get("status"), map, own);
    if before == after {
        return None;
    }
    let map_before = before.get(map);
    let map_after = after.get(map);
    let rest = |status: &Value| {
        let mut rest = status.clone();
        if let Some(fields) = rest.as_object_mut() {
            fields.remove(map);
        }
        empty_as_null(rest)
    };
    if map_before != map_after && rest(&before) == rest(&after) {
        Some(format!("status.{map}"))
    } else {
        Some("status".to_string())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kinds::{agent, upstream_cluster, virtual_machine};

    fn node(name: &str) -> Identity {
        Identity::new(Role::Node, name).unwrap()
    }

    fn with_nodes(nodes: Value) -> Value {
        json!({"metadata": {"name": "agent-7"}, "status": {"nodes": nodes}})
    }

    #[test]
    fn a_node_may_add_change_and_remove_its_own_entry() {
        let old = with_nodes(json!({"node-2": {"connected": true}}));
        let added =
            with_nodes(json!({"node-1": {"connected": true}, "node-2": {"connected": true}}));
        assert_eq!(
            foreign_status_change(&node("node-1"), &agent(), &old, &added),
            None
        );
        assert_eq!(
            foreign_status_change(&node("node-1"), &agent(), &added, &old),
            None
        );
        let first = json!({"metadata": {"name": "agent-7"}});
        let own = with_nodes(json!({"node-1": {"connected": true}}));
        assert_eq!(
            foreign_status_change(&node("node-1"), &agent(), &first, &own),
            None
        );
    }

    #[test]
    fn a_node_may_not_touch_another_nodes_entry_or_the_rest_of_the_status() {
        let old = with_nodes(json!({"node-2": {"connected": true}}));
        let forged = with_nodes(json!({"node-2": {"connected": false}}));
        let removed = with_nodes(json!({}));
        for new in [&forged, &removed] {
            assert_eq!(
                foreign_status_change(&node("node-1"), &agent(), &old, new),
                Some("status.nodes".into())
            );
        }
        let mut other = old.clone();
        other["status"]["phase"] = json!("Gone");
        assert_eq!(
            foreign_status_change(&node("node-1"), &agent(), &old, &other),
            Some("status".into())
        );
    }

    #[test]
    fn gateways_keep_to_their_entry_and_other_kinds_and_roles_are_not_restricted() {
        let gateway = Identity::new(Role::Gateway, "gw-1").unwrap();
        let old = json!({"status": {"gateways": {"gw-2": {"servers": []}}}});
        let mut mine = old.clone();
        mine["status"]["gateways"]["gw-1"] = json!({"servers": [{"healthy": true}]});
        let mut theirs = old.clone();
        theirs["status"]["gateways"]["gw-2"] = json!({"servers": [{"healthy": false}]});
        let spec = upstream_cluster();
        assert_eq!(foreign_status_change(&gateway, &spec, &old, &mine), None);
        assert_eq!(
            foreign_status_change(&gateway, &spec, &old, &theirs),
            Some("status.gateways".into())
        );
        let admin = Identity::new(Role::Admin, "admin").unwrap();
        assert_eq!(foreign_status_change(&admin, &spec, &old, &theirs), None);
        assert_eq!(
            foreign_status_change(&node("node-1"), &virtual_machine(), &old, &theirs),
            None
        );
    }
}
