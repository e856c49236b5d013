//! The simulator's stand-ins for TokenReview and SubjectAccessReview: the users its tokens
//! authenticate as, and the permissions its access reviews grant.

use std::collections::BTreeMap;

use serde_json::Value;

use super::text;

/// A user the TokenReview endpoint returns for a registered token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl TokenUser {
    pub fn new(username: &str, groups: &[&str]) -> Self {
        Self {
            username: username.to_string(),
            groups: groups.iter().map(|group| group.to_string()).collect(),
            ..Self::default()
        }
    }
}

/// A permission the SubjectAccessReview endpoint grants; `*` matches anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectAccessRule {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub name: String,
    /// When set, only a reviewed user with this uid is allowed.
    pub uid: Option<String>,
    /// When set, only a reviewed user whose extra holds this (key, value) is allowed.
    pub extra: Option<(String, String)>,
}

impl SubjectAccessRule {
    /// Only for a reviewed user with this uid.
    pub fn for_uid(mut self, uid: &str) -> Self {
        self.uid = Some(uid.to_string());
        self
    }

    /// Only for a reviewed user whose extra `key` holds `value`.
    pub fn for_extra(mut self, key: &str, value: &str) -> Self {
        self.extra = Some((key.to_string(), value.to_string()));
        self
    }

    /// `user` may impersonate `name` of `resource` (`users`, `groups`, `serviceaccounts`,
    /// `uids`, `userextras`), in the API group Kubernetes uses for it.
    pub fn impersonate(user: &str, resource: &str, name: &str) -> Self {
        let group = match resource {
            "uids" | "userextras" => "authentication.k8s.io",
            _ => "",
        };
        Self {
            user: user.to_string(),
            verb: "impersonate".into(),
            group: group.into(),
            resource: resource.to_string(),
            name: name.to_string(),
            uid: None,
            extra: None,
        }
    }

    pub(super) fn allows(&self, spec: &Value, attributes: &Value) -> bool {
        let field = |name: &str| attributes[name].as_str().unwrap_or("");
        let matches = |rule: &str, value: &str| rule == "*" || rule == value;
        let uid = self
            .uid
            .as_ref()
            .is_none_or(|uid| spec["uid"].as_str() == Some(uid));
        let extra = self.extra.as_ref().is_none_or(|(key, value)| {
            spec["extra"][key]
                .as_array()
                .is_some_and(|values| values.iter().any(|held| held == value))
        });
        uid && extra
            && matches(&self.user, text(&spec["user"]))
            && matches(&self.verb, field("verb"))
            && matches(&self.group, field("group"))
            && matches(&self.resource, field("resource"))
            && matches(&self.name, field("name"))
    }
}
