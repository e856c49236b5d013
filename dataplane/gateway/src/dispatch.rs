//! DispatchPolicies compiled into a matcher: policies in order (the first match wins), a policy's
//! rules ORed, a rule's fields ANDed, with the per-field rules of KubeGateway's design
//! (seed 003):
//!
//! | field           | resource req. | non-resource req. | `-` negation | `*` | empty list            |
//! |-----------------|---------------|-------------------|--------------|-----|-----------------------|
//! | verbs           | required      | required          | yes          | yes | matches nothing       |
//! | apiGroups       | required      | ignored           | yes          | yes | matches nothing       |
//! | resources       | required      | ignored           | yes          | yes | matches nothing       |
//! | resourceNames   | optional      | ignored           | yes          | yes | matches every request |
//! | users           | optional      | optional          | yes          | yes | all, unless serviceAccounts is set |
//! | serviceAccounts | optional      | optional          | no           | no  | all, unless users is set |
//! | userGroups      | optional      | optional          | yes          | yes | matches every user    |
//! | nonResourceURLs | ignored       | required          | no           | yes, and `/p/*` prefix | matches nothing |
//!
//! A list containing `*` matches everything. A list of only `-x` entries matches anything except
//! those values (the seed: `["-pods", "-deployments"]` is "neither pods nor deployments"; upstream
//! KubeGateway's code ORs the negations instead, which matches everything, and we follow the
//! seed). In a mixed list the negated entries are ignored (the seed's example:
//! `["-pods", "deployments"]` matches deployments only). For userGroups a negated list matches
//! users in none of the listed groups.
//!
//! A resourceNames list with names in it (positive or negated) matches only requests that carry
//! a name, as Kubernetes RBAC's `resourceNames` does: a get/update/patch/delete of one object, or
//! a list/watch narrowed to one object by `fieldSelector=metadata.name=...`. A collection request
//! (list, watch, deletecollection, create) carries no name and never matches such a rule, so
//! `resourceNames: ['-admin-cm']` fences `admin-cm` off instead of handing out every object,
//! `admin-cm` included, through a LIST, WATCH or DELETECOLLECTION. Only an empty list or `*`
//! matches collection requests.
//!
//! A cluster without policies routes everything to all its servers without flow control. A
//! cluster with policies and a request none matches: [`DispatchMatcher::dispatch`] returns
//! `None` and the proxy answers 403 (`GatewayError::NoDispatchPolicy`).
//!
//! Matching allocates nothing: sets are boxed slices searched linearly (rules list a handful of
//! values; a hash set would cost more than it saves at that size) and `res/sub` patterns are
//! split at compile time so the request's resource and subresource are never joined.

use crate::cluster::spec::{DispatchPolicy, DispatchPolicyRule, Strategy, UpstreamServer};
use crate::identity::UserInfo;
use crate::request_info::{RequestInfo, Verb};

/// All policies of one cluster, ready to match.
#[derive(Debug, Clone)]
pub struct DispatchMatcher {
    policies: Box<[CompiledPolicy]>,
}

/// The outcome of a match: where to send the request and which limit applies.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// `name` from the config, else `policy-<index>`; `default` for the implicit policy.
    pub name: Box<str>,
    /// Indices into the cluster's `servers`, disabled ones left out.
    pub servers: Box<[usize]>,
    pub strategy: Strategy,
    /// Index into the cluster's flow-control schemas; `None` means no limit.
    pub flow_control_schema: Option<usize>,
    /// `None`: the implicit catch-all policy of a cluster without policies.
    rules: Option<Box<[CompiledRule]>>,
}

impl DispatchMatcher {
    /// Compiles validated policies. `schema_index` resolves a flow-control schema name. Invalid
    /// input that validation would have refused still compiles, into entries that never match.
    pub fn compile(
        policies: &[DispatchPolicy],
        servers: &[UpstreamServer],
        schema_index: impl Fn(&str) -> Option<usize>,
    ) -> Self {
        let enabled = |index: &usize| servers.get(*index).is_some_and(|server| !server.disabled);
        if policies.is_empty() {
            return Self {
                policies: Box::new([CompiledPolicy {
                    name: "default".into(),
                    servers: (0..servers.len()).filter(enabled).collect(),
                    strategy: Strategy::RoundRobin,
                    flow_control_schema: None,
                    rules: None,
                }]),
            };
        }
        let policies = policies
            .iter()
            .enumerate()
            .map(|(index, policy)| {
                let subset: Box<[usize]> = if policy.upstream_subset.is_empty() {
                    (0..servers.len()).filter(enabled).collect()
                } else {
                    (0..servers.len())
                        .filter(|server| {
                            let name = servers[*server].name();
                            policy.upstream_subset.contains(&name)
                        })
                        .filter(enabled)
                        .collect()
                };
                CompiledPolicy {
                    name: policy
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("policy-{index}"))
                        .into(),
                    servers: subset,
                    strategy: policy.strategy,
                    flow_control_schema: if policy.flow_control_schema_name.is_empty() {
                        None
                    } else {
                        schema_index(&policy.flow_control_schema_name)
                    },
                    rules: Some(policy.rules.iter().map(CompiledRule::compile).collect()),
                }
            })
            .collect();
        Self { policies }
    }

    /// The first policy matching the request of `user`, or `None`.
    pub fn dispatch(&self, info: &RequestInfo<'_>, user: &UserInfo) -> Option<&CompiledPolicy> {
        self.policies.iter().find(|policy| match &policy.rules {
            None => true,
            Some(rules) => rules.iter().any(|rule| rule.matches(info, user)),
        })
    }

    pub fn policies(&self) -> &[CompiledPolicy] {
        &self.policies
    }
}

#[derive(Debug, Clone)]
struct CompiledRule {
    verbs: u16,
    api_groups: NameSet,
    resources: ResourceSet,
    resource_names: NameSet,
    users: NameSet,
    /// Full user names (`system:serviceaccount:<namespace>:<name>`).
    service_accounts: Box<[Box<str>]>,
    user_groups: NameSet,
    non_resource_urls: UrlSet,
}

impl CompiledRule {
    fn compile(rule: &DispatchPolicyRule) -> Self {
        let no_subjects = rule.users.is_empty() && rule.service_accounts.is_empty();
        Self {
            verbs: compile_verbs(&rule.verbs),
            api_groups: NameSet::compile(&rule.api_groups, NameSet::Nothing),
            resources: ResourceSet::compile(&rule.resources),
            resource_names: NameSet::compile(&rule.resource_names, NameSet::Any),
            users: if no_subjects {
                NameSet::Any
            } else {
                NameSet::compile(&rule.users, NameSet::Nothing)
            },
            service_accounts: rule
                .service_accounts
                .iter()
                .filter(|account| !account.namespace.is_empty() && !account.name.is_empty())
                .map(|account| {
                    format!(
                        "system:serviceaccount:{}:{}",
                        account.namespace, account.name
                    )
                    .into()
                })
                .collect(),
            user_groups: NameSet::compile(&rule.user_groups, NameSet::Any),
            non_resource_urls: UrlSet::compile(&rule.non_resource_urls),
        }
    }

    fn matches(&self, info: &RequestInfo<'_>, user: &UserInfo) -> bool {
        if self.verbs & info.verb.bit() == 0 {
            return false;
        }
        let subject = self.users.matches(&user.name)
            || self
                .service_accounts
                .iter()
                .any(|account| **account == *user.name);
        if !subject || !self.user_groups.matches_any_group(&user.groups) {
            return false;
        }
        if info.is_resource_request {
            self.api_groups.matches(info.api_group)
                && self.resources.matches(info.resource, info.subresource)
                && self.resource_names.matches_name(&info.name)
        } else {
            self.non_resource_urls.matches(info.path)
        }
    }
}

fn compile_verbs(verbs: &[String]) -> u16 {
    let all = Verb::ALL.iter().fold(0, |bits, verb| bits | verb.bit());
    let bits = |names: &mut dyn Iterator<Item = &str>| {
        names
            .filter_map(Verb::from_name)
            .fold(0, |bits, verb| bits | verb.bit())
    };
    if verbs.iter().any(|verb| verb == "*") {
        return all;
    }
    let (negated, positive) = split_negations(verbs);
    if !positive.is_empty() {
        bits(&mut positive.iter().copied())
    } else if !negated.is_empty() {
        all & !bits(&mut negated.iter().copied())
    } else {
        0
    }
}

/// (negated entries without their `-`, positive entries).
fn split_negations(entries: &[String]) -> (Vec<&str>, Vec<&str>) {
    let mut negated = Vec::new();
    let mut positive = Vec::new();
    for entry in entries {
        match entry.strip_prefix('-') {
            Some(value) => negated.push(value),
            None => positive.push(entry.as_str()),
        }
    }
    (negated, positive)
}

#[derive(Debug, Clone)]
enum NameSet {
    Any,
    Nothing,
    OneOf(Box<[Box<str>]>),
    NoneOf(Box<[Box<str>]>),
}

impl NameSet {
    fn compile(entries: &[String], if_empty: NameSet) -> Self {
        if entries.iter().any(|entry| entry == "*") {
            return NameSet::Any;
        }
        let (negated, positive) = split_negations(entries);
        let boxed = |values: Vec<&str>| values.into_iter().map(Box::from).collect();
        if !positive.is_empty() {
            NameSet::OneOf(boxed(positive))
        } else if !negated.is_empty() {
            NameSet::NoneOf(boxed(negated))
        } else {
            if_empty
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            NameSet::Any => true,
            NameSet::Nothing => false,
            NameSet::OneOf(values) => values.iter().any(|entry| **entry == *value),
            NameSet::NoneOf(values) => !values.iter().any(|entry| **entry == *value),
        }
    }

    /// [`Self::matches`] for a request's object name, empty for a collection request: a list of
    /// names (positive or negated) never matches a request that names no object.
    fn matches_name(&self, name: &str) -> bool {
        match self {
            NameSet::OneOf(_) | NameSet::NoneOf(_) if name.is_empty() => false,
            _ => self.matches(name),
        }
    }

    fn matches_any_group(&self, groups: &[String]) -> bool {
        match self {
            NameSet::Any => true,
            NameSet::Nothing => false,
            NameSet::OneOf(_) => groups.iter().any(|group| self.matches(group)),
            NameSet::NoneOf(_) => groups.iter().all(|group| self.matches(group)),
        }
    }
}

#[derive(Debug, Clone)]
struct ResourcePattern {
    /// `*` for the `*/subresource` form.
    resource: Box<str>,
    /// Empty when the pattern names no subresource.
    subresource: Box<str>,
}

impl ResourcePattern {
    fn parse(entry: &str) -> Self {
        let (resource, subresource) = entry.split_once('/').unwrap_or((entry, ""));
        Self {
            resource: resource.into(),
            subresource: subresource.into(),
        }
    }

    fn matches(&self, resource: &str, subresource: &str) -> bool {
        if *self.resource == *"*" {
            // Only `*/sub` gets here (a bare `*` makes the whole set Any); `res/*` is refused
            // by validation and, as here, matches nothing.
            !subresource.is_empty() && *self.subresource == *subresource
        } else {
            *self.resource == *resource && *self.subresource == *subresource
        }
    }
}

#[derive(Debug, Clone)]
enum ResourceSet {
    Any,
    Nothing,
    OneOf(Box<[ResourcePattern]>),
    NoneOf(Box<[ResourcePattern]>),
}

impl ResourceSet {
    fn compile(entries: &[String]) -> Self {
        if entries.iter().any(|entry| entry == "*") {
            return ResourceSet::Any;
        }
        let (negated, positive) = split_negations(entries);
        let parse = |values: Vec<&str>| values.into_iter().map(ResourcePattern::parse).collect();
        if !positive.is_empty() {
            ResourceSet::OneOf(parse(positive))
        } else if !negated.is_empty() {
            ResourceSet::NoneOf(parse(negated))
        } else {
            ResourceSet::Nothing
        }
    }

    fn matches(&self, resource: &str, subresource: &str) -> bool {
        match self {
            ResourceSet::Any => true,
            ResourceSet::Nothing => false,
            ResourceSet::OneOf(patterns) => patterns
                .iter()
                .any(|pattern| pattern.matches(resource, subresource)),
            ResourceSet::NoneOf(patterns) => !patterns
                .iter()
                .any(|pattern| pattern.matches(resource, subresource)),
        }
    }
}

#[derive(Debug, Clone)]
enum UrlPattern {
    Exact(Box<str>),
    /// From `prefix*`.
    Prefix(Box<str>),
}

#[derive(Debug, Clone)]
enum UrlSet {
    Any,
    /// Empty: matches nothing.
    OneOf(Box<[UrlPattern]>),
}

impl UrlSet {
    fn compile(entries: &[String]) -> Self {
        if entries.iter().any(|entry| entry == "*") {
            return UrlSet::Any;
        }
        UrlSet::OneOf(
            entries
                .iter()
                // Negation is not supported for URLs (validation refuses it; upstream ignores it).
                .filter(|entry| !entry.starts_with('-'))
                .map(|entry| match entry.strip_suffix('*') {
                    Some(prefix) => UrlPattern::Prefix(prefix.into()),
                    None => UrlPattern::Exact(entry.as_str().into()),
                })
                .collect(),
        )
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            UrlSet::Any => true,
            UrlSet::OneOf(patterns) => patterns.iter().any(|pattern| match pattern {
                UrlPattern::Exact(exact) => **exact == *path,
                UrlPattern::Prefix(prefix) => path.starts_with(&**prefix),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
