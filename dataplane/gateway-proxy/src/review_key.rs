//! The key of a core's review caches, and its borrowed view: a cache hit looks the key up from
//! the request's own `&str` (the bearer token) without copying it.

use std::fmt::Write as _;

use sluice_gateway::identity::{ImpersonationCheck, UserInfo};

/// The verb every impersonation SubjectAccessReview asks about.
pub const IMPERSONATE_VERB: &str = "impersonate";

/// (cluster, what was asked) -> the answer.
pub type ReviewKey = (u64, String);

/// A review key as its parts, so that a lookup borrows what was asked (`(u64, &str)`) instead
/// of copying it into a `ReviewKey` per request (maps look `&dyn KeyView` up through `Borrow`).
pub trait KeyView {
    fn parts(&self) -> (u64, &str);
}

impl KeyView for ReviewKey {
    fn parts(&self) -> (u64, &str) {
        (self.0, &self.1)
    }
}

impl KeyView for (u64, &str) {
    fn parts(&self) -> (u64, &str) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn KeyView + 'a> for ReviewKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

// Hashes exactly as `ReviewKey`'s own `Hash` does (`(u64, &str)` and `(u64, String)` feed the
// hasher the same), as `Borrow` requires.
impl std::hash::Hash for dyn KeyView + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyView + '_ {}

/// Everything a SubjectAccessReview for `check` carries (see `review::access_review`), as one
/// unambiguous string: the asking user's name, uid, groups and extra, and the verb and target.
/// An answer depends on all of it (an authorizer or webhook may decide on uid or extra), so two
/// users differing in any part never share a cached answer. Each part is length-prefixed and
/// each list counted, so no choice of values (a `\0` or `,` inside a name) makes two different
/// reviews encode alike.
pub fn access_question(user: &UserInfo, check: &ImpersonationCheck) -> String {
    fn part(key: &mut String, value: &str) {
        let _ = write!(key, "{}:{value}", value.len());
    }
    let mut key = String::with_capacity(128);
    part(&mut key, &user.name);
    part(&mut key, &user.uid);
    let _ = write!(key, "g{}", user.groups.len());
    for group in &user.groups {
        part(&mut key, group);
    }
    let _ = write!(key, "e{}", user.extra.len());
    for (name, values) in &user.extra {
        part(&mut key, name);
        let _ = write!(key, "v{}", values.len());
        for value in values {
            part(&mut key, value);
        }
    }
    for value in [
        IMPERSONATE_VERB,
        check.api_group,
        check.resource,
        &check.subresource,
        &check.namespace,
        &check.name,
    ] {
        part(&mut key, value);
    }
    key
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_borrowed_view_finds_its_owned_key() {
        let mut map: HashMap<ReviewKey, u8> = HashMap::new();
        map.insert((7, "token".to_string()), 1);
        assert_eq!(map.get(&(7_u64, "token") as &dyn KeyView), Some(&1));
        assert_eq!(map.get(&(8_u64, "token") as &dyn KeyView), None);
        assert_eq!(map.get(&(7_u64, "other") as &dyn KeyView), None);
    }

    fn target(name: &str) -> ImpersonationCheck {
        ImpersonationCheck {
            api_group: "",
            resource: "users",
            subresource: String::new(),
            namespace: String::new(),
            name: name.into(),
        }
    }

    #[test]
    fn an_access_question_depends_on_every_part_of_the_review() {
        let alice = UserInfo::new("alice", &["devs"]);
        let base = access_question(&alice, &target("bob"));
        assert_eq!(base, access_question(&alice.clone(), &target("bob")));
        let differs = |user: &UserInfo, check: &ImpersonationCheck| {
            assert_ne!(base, access_question(user, check), "{user:?} {check:?}");
        };
        differs(
            &UserInfo {
                uid: "u-2".into(),
                ..alice.clone()
            },
            &target("bob"),
        );
        let mut extra = alice.clone();
        extra.extra.insert("scopes".into(), vec!["admin".into()]);
        differs(&extra, &target("bob"));
        differs(&UserInfo::new("alice", &["devs", "admins"]), &target("bob"));
        differs(&UserInfo::new("alicf", &["devs"]), &target("bob"));
        differs(&alice, &target("carol"));
        differs(
            &alice,
            &ImpersonationCheck {
                resource: "groups",
                ..target("bob")
            },
        );
        differs(
            &alice,
            &ImpersonationCheck {
                namespace: "ns".into(),
                ..target("bob")
            },
        );
        differs(
            &alice,
            &ImpersonationCheck {
                subresource: "s".into(),
                ..target("bob")
            },
        );
    }

    #[test]
    fn no_choice_of_values_makes_two_questions_alike() {
        // Moving text between neighbouring parts, or between a group and an extra, changes the
        // key: the parts are length-prefixed and the lists counted.
        let one = UserInfo::new("a\u{0}b", &["c"]);
        let two = UserInfo::new("a", &["b\u{0}c"]);
        assert_ne!(
            access_question(&one, &target("x")),
            access_question(&two, &target("x"))
        );
        let grouped = UserInfo::new("a", &["k", "v"]);
        let mut extra = UserInfo::new("a", &[]);
        extra.extra.insert("k".into(), vec!["v".into()]);
        assert_ne!(
            access_question(&grouped, &target("x")),
            access_question(&extra, &target("x"))
        );
        let empty_uid = UserInfo::new("ab", &[]);
        let uid = UserInfo {
            uid: "b".into(),
            ..UserInfo::new("a", &[])
        };
        assert_ne!(
            access_question(&empty_uid, &target("x")),
            access_question(&uid, &target("x"))
        );
    }
}
