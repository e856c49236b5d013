//! Where objects live in the store: `/registry/<group>/<plural>/[<namespace>/]<name>`, the layout
//! kube-apiserver uses in etcd, so a list of one resource (or of one namespace) is a prefix.

use sluice_apimachinery::KindSpec;

const ROOT: &str = "/registry/";

/// The key of one object.
pub fn object_key(spec: &KindSpec, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{}{namespace}/{name}", resource_prefix(spec)),
        None => format!("{}{name}", resource_prefix(spec)),
    }
}

/// The prefix of every object of a resource, or of one namespace of it.
pub fn list_prefix(spec: &KindSpec, namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("{}{namespace}/", resource_prefix(spec)),
        None => resource_prefix(spec),
    }
}

/// The core group's resources have no group segment (`/registry/events/`), as in kube's etcd.
fn resource_prefix(spec: &KindSpec) -> String {
    if spec.is_core() {
        return format!("{ROOT}{}/", spec.plural);
    }
    format!("{ROOT}{}/{}/", spec.group, spec.plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_key_is_under_its_lists_prefix() {
        let spec = crate::kinds::agent();
        let key = object_key(&spec, None, "agent-7");
        assert_eq!(key, "/registry/tunnel.sluice.dev/agents/agent-7");
        assert!(key.starts_with(&list_prefix(&spec, None)));
        let namespaced = object_key(&spec, Some("ns"), "a");
        assert!(namespaced.starts_with(&list_prefix(&spec, Some("ns"))));
        assert!(!list_prefix(&spec, Some("ns")).starts_with(&list_prefix(&spec, Some("n"))));
        let event = crate::kinds::event();
        assert_eq!(
            object_key(&event, Some("default"), "vm1.1"),
            "/registry/events/default/vm1.1"
        );
    }
}
