//! The control plane's small RBAC: a fixed table of what each role may do, and the refusal
//! message kube-apiserver gives, so kubectl users read a familiar line.

use std::fmt;

use super::identity::{Identity, Role};

/// The API verbs (as Kubernetes names them in RBAC rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub const ALL: [Verb; 8] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    fn reads(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }

    fn writes_in_place(self) -> bool {
        matches!(self, Verb::Update | Verb::Patch)
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a request wants to do, as the API path and method say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    pub verb: Verb,
    pub group: &'a str,
    /// The plural resource name (`upstreamclusters`).
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// An allowed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Allowed for the objects whose span includes this VM only: the server filters what it
    /// reads, and answers 403 for a named object outside the span.
    AllowWithinSpan {
        vm: String,
    },
    /// Allowed on the object of this name only: the server filters lists and watches to it and
    /// answers 403 for any other object (a create's body must carry this name).
    AllowOwn {
        name: String,
    },
}

/// A refused request; answered 403 `Forbidden` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denied {
    pub message: String,
}

const UPSTREAM_CLUSTERS: (&str, &str) = ("proxy.sluice.dev", "upstreamclusters");
const AGENTS: (&str, &str) = ("tunnel.sluice.dev", "agents");
const POLICY_GROUP: &str = "policy.sluice.dev";
const POLICY_RESOURCES: [&str; 3] = ["networkpolicies", "addressgroups", "appliedtogroups"];
const VM_GROUP: &str = "vm.sluice.dev";
const VIRTUAL_MACHINES: &str = "virtualmachines";
const RUNTIME_INFOS: &str = "virtualmachineruntimeinfos";

/// Decides whether `identity` may make `request`.
pub fn authorize(identity: &Identity, request: &Request<'_>) -> Result<Decision, Denied> {
    let target = (request.group, request.resource);
    let allowed = match identity.role {
        Role::Admin => Some(Decision::Allow),
        Role::Gateway => reads_or_writes_status(request, target == UPSTREAM_CLUSTERS),
        Role::Node => reads_or_writes_status(request, target == AGENTS),
        Role::VmAgent => vm_agent(&identity.subject, request),
    };
    allowed.ok_or_else(|| denied(identity, request))
}

/// A VM agent (subject = its VM's name): the policies of its span; its own VirtualMachine,
/// read only (the VMManager alone writes its status); its own runtime info, read and written
/// but never listed, watched or deleted.
fn vm_agent(vm: &str, request: &Request<'_>) -> Option<Decision> {
    if request.subresource.is_some() {
        return None;
    }
    let own_name = request.name.is_none_or(|name| name == vm);
    let own = || Decision::AllowOwn {
        name: vm.to_string(),
    };
    match (request.group, request.resource) {
        (POLICY_GROUP, resource) if POLICY_RESOURCES.contains(&resource) => request
            .verb
            .reads()
            .then(|| Decision::AllowWithinSpan { vm: vm.to_string() }),
        (VM_GROUP, VIRTUAL_MACHINES) => (request.verb.reads() && own_name).then(own),
        (VM_GROUP, RUNTIME_INFOS) => {
            let verb = matches!(
                request.verb,
                Verb::Get | Verb::Create | Verb::Update | Verb::Patch
            );
            // A create names its object in the body, which the server checks against `name`.
            let named = request.name.is_some() || request.verb == Verb::Create;
            (verb && named && own_name).then(own)
        }
        _ => None,
    }
}

/// The gateway and node rule: read the kind, and update or patch only its `status`.
fn reads_or_writes_status(request: &Request<'_>, own_kind: bool) -> Option<Decision> {
    let allowed = own_kind
        && match request.subresource {
            None => request.verb.reads(),
            Some("status") => request.verb.writes_in_place() || request.verb == Verb::Get,
            Some(_) => false,
        };
    allowed.then_some(Decision::Allow)
}

/// kube-apiserver's wording, e.g. `upstreamclusters.proxy.sluice.dev "a" is forbidden: User
/// "sluice:gateway:gw-1" cannot delete resource "upstreamclusters" in API group
/// "proxy.sluice.dev" at the cluster scope`.
fn denied(identity: &Identity, request: &Request<'_>) -> Denied {
    // The core group's resources are named bare (`events "e1"`), as kube does.
    let qualified = match request.group {
        "" => request.resource.to_string(),
        group => format!("{}.{group}", request.resource),
    };
    let object = match request.name {
        Some(name) => format!("{qualified} {name:?}"),
        None => qualified,
    };
    let resource = match request.subresource {
        Some(sub) => format!("{}/{sub}", request.resource),
        None => request.resource.to_string(),
    };
    let scope = match request.namespace {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_string(),
    };
    Denied {
        message: format!(
            "{object} is forbidden: User {:?} cannot {} resource {resource:?} in API group {:?} {scope}",
            identity.user_name(),
            request.verb,
            request.group
        ),
    }
}

#[cfg(test)]
#[path = "rbac_tests.rs"]
mod tests;
