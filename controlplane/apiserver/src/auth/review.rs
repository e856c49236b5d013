//! `authorization.k8s.io/v1` self reviews, answered from the same RBAC table that decides
//! requests ([`super::authorize`]), so `kubectl auth can-i` says what the server would do:
//! a SelfSubjectAccessReview asks about one verb on one resource (or one non-resource path),
//! a SelfSubjectRulesReview (`kubectl auth can-i --list`) lists every grant of the caller.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sluice_apimachinery::Registry;

use super::identity::{Identity, Role};
use super::rbac::{authorize, Decision, Request, Verb};

pub const GROUP: &str = "authorization.k8s.io";
pub const VERSION: &str = "v1";
pub const ACCESS_REVIEWS: &str = "selfsubjectaccessreviews";
pub const RULES_REVIEWS: &str = "selfsubjectrulesreviews";

/// Paths served without authentication, and those every authenticated caller may read.
const HEALTH_PATHS: [&str; 4] = ["/healthz", "/livez", "/readyz", "/metrics"];
const DISCOVERY_PATHS: [&str; 7] = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/version",
    "/openapi",
    "/openapi/*",
];

/// A review body that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not a {0}: {1}")]
    Malformed(&'static str, String),
    #[error("spec.resourceAttributes or spec.nonResourceAttributes is required")]
    NoAttributes,
}

/// The answer to a SelfSubjectAccessReview: the request echoed with its `status`.
pub fn access_review(identity: &Identity, review: &Value) -> Result<Value, ReviewError> {
    let malformed = |why: &str| ReviewError::Malformed("SelfSubjectAccessReview", why.into());
    if !review.is_object() {
        return Err(malformed("not a JSON object"));
    }
    let spec = review.get("spec").ok_or_else(|| malformed("no spec"))?;
    let (allowed, reason) = if let Some(attributes) = spec.get("resourceAttributes") {
        resource_allowed(identity, attributes)
    } else if let Some(attributes) = spec.get("nonResourceAttributes") {
        non_resource_allowed(identity, attributes)
    } else {
        return Err(ReviewError::NoAttributes);
    };
    let mut answer = review.clone();
    answer["apiVersion"] = json!(format!("{GROUP}/{VERSION}"));
    answer["kind"] = json!("SelfSubjectAccessReview");
    answer["status"] = json!({"allowed": allowed});
    if !reason.is_empty() {
        answer["status"]["reason"] = json!(reason);
    }
    Ok(answer)
}

fn text<'a>(attributes: &'a Value, field: &str) -> &'a str {
    attributes.get(field).and_then(Value::as_str).unwrap_or("")
}

fn parse_verb(verb: &str) -> Option<Verb> {
    Verb::ALL.into_iter().find(|known| known.as_str() == verb)
}

/// Allowed (and why, when only in part) for resource attributes: `*` verbs or resources are
/// the admin's only; a verb the server does not serve is nobody else's either.
fn resource_allowed(identity: &Identity, attributes: &Value) -> (bool, String) {
    if identity.role == Role::Admin {
        return (true, String::new());
    }
    let optional = |field: &str| Some(text(attributes, field)).filter(|given| !given.is_empty());
    let Some(verb) = parse_verb(text(attributes, "verb")) else {
        return (false, String::new());
    };
    let request = Request {
        verb,
        group: text(attributes, "group"),
        resource: text(attributes, "resource"),
        subresource: optional("subresource"),
        namespace: optional("namespace"),
        name: optional("name"),
    };
    match authorize(identity, &request) {
        Ok(Decision::Allow) => (true, String::new()),
        Ok(Decision::AllowOwn { name }) => (true, format!("only the object named {name:?}")),
        Ok(Decision::AllowWithinSpan { vm }) => (
            true,
            format!("only the objects in the span of VirtualMachine {vm:?}"),
        ),
        Err(denied) => (false, denied.message),
    }
}

fn non_resource_allowed(identity: &Identity, attributes: &Value) -> (bool, String) {
    let path = text(attributes, "path");
    let verb = text(attributes, "verb");
    if identity.role == Role::Admin {
        return (true, String::new());
    }
    let reads = matches!(verb, "get" | "head");
    let discovery = path == "/api"
        || path == "/apis"
        || path == "/version"
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/");
    (
        reads && (HEALTH_PATHS.contains(&path) || discovery),
        String::new(),
    )
}

/// The answer to a SelfSubjectRulesReview: every grant of the caller over the served kinds,
/// found by asking [`authorize`] each verb on each resource (and, for grants limited to one
/// object, naming the caller's subject), plus the reviews and the paths everyone may read.
pub fn rules_review(identity: &Identity, registry: &Registry, review: &Value) -> Value {
    let namespace = review
        .pointer("/spec/namespace")
        .and_then(Value::as_str)
        .filter(|namespace| !namespace.is_empty());
    let mut rules = vec![json!({
        "verbs": ["create"], "apiGroups": [GROUP],
        "resources": [ACCESS_REVIEWS, RULES_REVIEWS],
    })];
    let mut non_resource = vec![json!({
        "verbs": ["get"],
        "nonResourceURLs": HEALTH_PATHS.iter().chain(DISCOVERY_PATHS.iter()).collect::<Vec<_>>(),
    })];
    if identity.role == Role::Admin {
        rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        non_resource.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
    } else {
        rules.extend(granted_rules(identity, registry, namespace));
    }
    let mut answer = review.clone();
    if !answer.is_object() {
        answer = json!({});
    }
    answer["apiVersion"] = json!(format!("{GROUP}/{VERSION}"));
    answer["kind"] = json!("SelfSubjectRulesReview");
    answer["status"] = json!({
        "resourceRules": rules, "nonResourceRules": non_resource, "incomplete": false,
    });
    answer
}

/// One rule per (group, resource, object names), its verbs in RBAC's order.
fn granted_rules(identity: &Identity, registry: &Registry, namespace: Option<&str>) -> Vec<Value> {
    let mut grants: BTreeMap<(String, String, Option<String>), Vec<&'static str>> = BTreeMap::new();
    for spec in registry.kinds() {
        let status = spec.status_subresource.then_some(Some("status"));
        for subresource in std::iter::once(None).chain(status) {
            let resource = match subresource {
                Some(sub) => format!("{}/{sub}", spec.plural),
                None => spec.plural.clone(),
            };
            for verb in Verb::ALL {
                let ask = |name: Option<&str>| {
                    let request = Request {
                        verb,
                        group: &spec.group,
                        resource: &spec.plural,
                        subresource,
                        namespace: namespace.filter(|_| spec.namespaced),
                        name,
                    };
                    authorize(identity, &request).ok()
                };
                let only = match ask(None).or_else(|| ask(Some(&identity.subject))) {
                    None => continue,
                    Some(Decision::AllowOwn { name }) => Some(name),
                    Some(_) => None,
                };
                grants
                    .entry((spec.group.clone(), resource.clone(), only))
                    .or_default()
                    .push(verb.as_str());
            }
        }
    }
    grants
        .into_iter()
        .map(|((group, resource, only), verbs)| {
            let mut rule = json!({"verbs": verbs, "apiGroups": [group], "resources": [resource]});
            if let Some(name) = only {
                rule["resourceNames"] = json!([name]);
            }
            rule
        })
        .collect()
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
