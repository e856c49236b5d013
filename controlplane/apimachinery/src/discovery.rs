//! Legacy discovery documents (`/api`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`).
//!
//! client-go (kubectl v1.32) first asks `/api` and `/apis` with
//! `Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,
//! application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json`
//! and decides by the *response* Content-Type (`discovery_client.go`, `downloadAPIs` /
//! `downloadLegacy`): anything that is not the v2/v2beta1 aggregated type is decoded as the
//! legacy `APIVersions`/`APIGroupList`, after which it fetches every `/apis/<group>/<version>`.
//! So the server answers these documents with `Content-Type: application/json` whatever the
//! Accept says ([`DISCOVERY_CONTENT_TYPE`]).

use std::cmp::Ordering;

use serde_json::{json, Value};

use crate::kind::{KindSpec, Registry};

/// The Content-Type to answer every discovery document with (also for aggregated Accepts).
pub const DISCOVERY_CONTENT_TYPE: &str = "application/json";

/// `/api`: the core group's versions (kinds registered with group `""`). client-go's REST
/// mapper adds kind `List` to every group version it discovers, so serving core `v1` is what
/// lets kubectl apply a `kind: List` (what `kubectl get -o yaml` of several objects prints).
pub fn api_versions(registry: &Registry) -> Value {
    let mut versions = registry.groups().remove("").unwrap_or_default();
    versions.sort_by(|a, b| compare_kube_versions(a, b));
    json!({"kind": "APIVersions", "versions": versions, "serverAddressByClientCIDRs": []})
}

/// `/version` (`version.Info`): kubectl `create`/`version` ask for it first (a 404 is
/// tolerated by `create`, but `kubectl version` prints an error).
pub fn version_info(major: &str, minor: &str, git_version: &str, platform: &str) -> Value {
    json!({
        "major": major, "minor": minor, "gitVersion": git_version, "gitCommit": "",
        "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": platform,
    })
}

/// `/apis`: every named group with its versions, preferred first (the core group is `/api`'s),
/// then `extra` (groups served by code rather than by stored kinds).
pub fn api_group_list(registry: &Registry, extra: &[(&str, &str)]) -> Value {
    let mut groups: Vec<Value> = registry
        .groups()
        .into_iter()
        .filter(|(group, _)| !group.is_empty())
        .map(|(group, versions)| api_group_body(&group, versions))
        .collect();
    for (group, version) in extra {
        groups.push(api_group_body(group, vec![version.to_string()]));
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`: one `APIGroup`, or `None` when the group is not served (404).
/// A group served by code is answered by [`api_group_of`].
pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    if group.is_empty() {
        return None;
    }
    let versions = registry.groups().remove(group)?;
    let mut body = api_group_body(group, versions);
    if let Value::Object(map) = &mut body {
        map.insert("kind".into(), json!("APIGroup"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    Some(body)
}

/// The `APIGroup` document of one group and its one version.
pub fn api_group_of(group: &str, version: &str) -> Value {
    let mut body = api_group_body(group, vec![version.to_string()]);
    body["kind"] = json!("APIGroup");
    body["apiVersion"] = json!("v1");
    body
}

fn api_group_body(group: &str, mut versions: Vec<String>) -> Value {
    versions.sort_by(|a, b| compare_kube_versions(a, b));
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = entries.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": entries, "preferredVersion": preferred})
}

/// `/apis/<group>/<version>`: the `APIResourceList`, with a `<plural>/status` entry for kinds
/// with a status subresource; `None` when the group version is not served (404).
pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let kinds = registry.group_version(group, version);
    if kinds.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for spec in kinds {
        resources.push(resource_entry(spec));
        if spec.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", spec.plural),
                "singularName": "",
                "namespaced": spec.namespaced,
                "kind": spec.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = match group {
        "" => version.to_string(),
        _ => format!("{group}/{version}"),
    };
    Some(resource_list(&group_version, resources))
}

/// An `APIResourceList` document of the given entries.
pub fn resource_list(group_version: &str, resources: Vec<Value>) -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

/// A discovery entry of a resource served by code (no stored objects, no short names).
pub fn virtual_resource(name: &str, kind: &str, namespaced: bool, verbs: &[&str]) -> Value {
    json!({
        "name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs,
    })
}

fn resource_entry(spec: &KindSpec) -> Value {
    let mut entry = json!({
        "name": spec.plural,
        "singularName": spec.singular,
        "namespaced": spec.namespaced,
        "kind": spec.kind,
        "verbs": spec.verbs(),
    });
    if !spec.short_names.is_empty() {
        entry["shortNames"] = json!(spec.short_names);
    }
    entry
}

/// Kubernetes version priority (`version.CompareKubeAwareVersionStrings`): GA before beta
/// before alpha, higher numbers first, non-kube strings last in lexical order. Used to pick
/// the preferred version.
pub fn compare_kube_versions(a: &str, b: &str) -> Ordering {
    match (parse_kube_version(a), parse_kube_version(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// (stability rank: 2 GA / 1 beta / 0 alpha, major, minor) so that greater is preferred.
fn parse_kube_version(version: &str) -> Option<(u8, u32, u32)> {
    let rest = version.strip_prefix('v')?;
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major: u32 = rest[..digits_end].parse().ok()?;
    let tail = &rest[digits_end..];
    if tail.is_empty() {
        return Some((2, major, 0));
    }
    let (rank, minor) = if let Some(n) = tail.strip_prefix("beta") {
        (1, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (0, n)
    } else {
        return None;
    };
    Some((rank, major, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::tests::widget;

    #[test]
    fn resource_list_has_the_status_subresource() {
        let registry = Registry::new().with(widget()).expect("registry");
        let list = api_resource_list(&registry, "tests.sluice.dev", "v1").expect("served");
        assert_eq!(list["resources"][0]["name"], "widgets");
        assert_eq!(list["resources"][0]["shortNames"], json!(["wd"]));
        assert_eq!(list["resources"][1]["name"], "widgets/status");
        assert_eq!(
            list["resources"][1]["verbs"],
            json!(["get", "patch", "update"])
        );
        assert!(api_resource_list(&registry, "tests.sluice.dev", "v9").is_none());
    }

    #[test]
    fn the_core_group_is_served_under_api_not_apis() {
        let mut core = widget();
        core.group = String::new();
        core.short_names.clear();
        let registry = Registry::new()
            .with(widget())
            .and_then(|registry| registry.with(core))
            .expect("registry");
        assert_eq!(api_versions(&registry)["versions"], json!(["v1"]));
        let groups = api_group_list(&registry, &[("authorization.k8s.io", "v1")]);
        let names: Vec<&Value> = groups["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .map(|group| &group["name"])
            .collect();
        assert_eq!(
            names,
            [&json!("tests.sluice.dev"), &json!("authorization.k8s.io")]
        );
        assert!(api_group(&registry, "").is_none());
        let list = api_resource_list(&registry, "", "v1").expect("core v1");
        assert_eq!(list["groupVersion"], "v1");
        assert_eq!(list["resources"][0]["name"], "widgets");
        let group = api_group_of("authorization.k8s.io", "v1");
        assert_eq!(
            group["preferredVersion"]["groupVersion"],
            "authorization.k8s.io/v1"
        );
    }

    #[test]
    fn preferred_version_is_the_most_stable() {
        let mut versions = vec!["v1alpha1", "v2beta1", "v1", "v1beta2", "foo", "v2"];
        versions.sort_by(|a, b| compare_kube_versions(a, b));
        assert_eq!(
            versions,
            ["v2", "v1", "v2beta1", "v1beta2", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn group_list_and_group() {
        let registry = Registry::new().with(widget()).expect("registry");
        let list = api_group_list(&registry, &[]);
        assert_eq!(
            list["groups"][0]["preferredVersion"]["groupVersion"],
            "tests.sluice.dev/v1"
        );
        assert_eq!(
            api_group(&registry, "tests.sluice.dev").expect("group")["kind"],
            "APIGroup"
        );
        assert!(api_group(&registry, "nope").is_none());
        assert_eq!(api_versions(&registry)["versions"], json!([]));
        let version = version_info("1", "32", "v1.32.0-sluice", "linux/amd64");
        assert_eq!(version["gitVersion"], "v1.32.0-sluice");
    }
}
