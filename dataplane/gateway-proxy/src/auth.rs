//! Authentication and impersonation checks that need the apiserver: TokenReview for bearer
//! tokens and SubjectAccessReview for client-sent Impersonate-* headers, asked with the
//! gateway's own identity (see `review.rs`) and cached per core (no lock on the request path;
//! each core asks at most once per TTL).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use sluice_gateway::cluster::spec::Authentication;
use sluice_gateway::identity::{ImpersonationCheck, UserInfo};

use crate::error::ApiCallFailure;
use crate::pool::CorePool;
use crate::review::{
    access_allowed, access_review, review, token_review, token_verdict, TokenVerdict,
    ACCESS_REVIEW_PATH, TOKEN_REVIEW_PATH,
};
use crate::state::Generation;

/// Entries a core's cache may hold; past it, expired entries go, then everything.
const CACHE_LIMIT: usize = 10_000;
/// Bearer tokens longer than this are refused without asking the apiserver.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// (cluster, what was asked) -> the answer.
type ReviewKey = (u64, String);

/// Review answers with their expiry, bounded in size.
#[derive(Debug)]
struct ReviewCache<V> {
    entries: HashMap<ReviewKey, (V, Instant)>,
    limit: usize,
}

impl<V> Default for ReviewCache<V> {
    fn default() -> Self {
        Self::with_limit(CACHE_LIMIT)
    }
}

impl<V> ReviewCache<V> {
    fn with_limit(limit: usize) -> Self {
        Self {
            entries: HashMap::new(),
            limit,
        }
    }

    /// The answer for `key` unless it expired by `now`.
    fn get(&self, key: &ReviewKey, now: Instant) -> Option<&V> {
        self.entries
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value)
    }

    /// Keeps `value` until `now + ttl`. At the limit, expired entries go first; if none had
    /// expired, everything goes (a flood of distinct tokens must not grow the cache).
    fn insert(&mut self, key: ReviewKey, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= self.limit {
            self.entries.retain(|_, (_, expires)| *expires > now);
            if self.entries.len() >= self.limit {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// How long a TokenReview verdict is believed: a user for the success TTL, a rejection for the
/// (usually much shorter) failure TTL.
fn verdict_ttl(verdict: &TokenVerdict, settings: &Authentication) -> Duration {
    match verdict {
        TokenVerdict::User(_) => settings.token_review_success_ttl,
        TokenVerdict::Rejected => settings.token_review_failure_ttl,
    }
}

/// One core's review caches.
#[derive(Debug, Default)]
pub struct CoreAuth {
    tokens: RefCell<ReviewCache<TokenVerdict>>,
    access: RefCell<ReviewCache<bool>>,
    /// Reviews in flight: later requests for the same token wait for the first one's answer
    /// instead of sending their own (a burst of new clients must not become a burst of
    /// TokenReviews).
    pending: RefCell<HashMap<ReviewKey, Rc<event_listener::Event>>>,
}

/// Wakes the requests waiting on a review, however it ends.
struct PendingReview<'a> {
    pending: &'a RefCell<HashMap<ReviewKey, Rc<event_listener::Event>>>,
    key: ReviewKey,
}

impl Drop for PendingReview<'_> {
    fn drop(&mut self) {
        if let Some(event) = self.pending.borrow_mut().remove(&self.key) {
            event.notify(usize::MAX);
        }
    }
}

impl CoreAuth {
    /// The user a bearer token stands for (`None`: the apiserver rejected it), asking the
    /// cluster's apiserver with TokenReview on a cache miss. `cluster` keys the cache: one
    /// cluster's tokens mean nothing to another.
    pub async fn user_for_token(
        &self,
        pool: &CorePool,
        generation: &Generation,
        cluster: usize,
        token: &str,
        (metrics, worker): (&crate::metrics::GatewayMetrics, usize),
    ) -> Result<Option<UserInfo>, ApiCallFailure> {
        let (hits, misses) = (&metrics.auth_cache_hits, &metrics.auth_cache_misses);
        let key = (cluster_key(generation, cluster), token.to_string());
        let _review = loop {
            if let Some(verdict) = self.tokens.borrow().get(&key, Instant::now()) {
                hits.inc(worker);
                return Ok(verdict.clone().into_user());
            }
            let waiting = self.pending.borrow().get(&key).map(|event| event.listen());
            match waiting {
                // Another request of this core is asking: wait, then read the cache again
                // (if that review failed, this request asks itself).
                Some(listener) => listener.await,
                None => {
                    self.pending
                        .borrow_mut()
                        .insert(key.clone(), Rc::new(event_listener::Event::new()));
                    break PendingReview {
                        pending: &self.pending,
                        key: key.clone(),
                    };
                }
            }
        };
        misses.inc(worker);
        let settings = &generation.snapshot.clusters()[cluster].authentication;
        let answer = review(
            pool,
            generation,
            cluster,
            TOKEN_REVIEW_PATH,
            token_review(token),
            settings.review_timeout,
        )
        .await?;
        let verdict = token_verdict(&answer);
        let ttl = verdict_ttl(&verdict, settings);
        self.tokens
            .borrow_mut()
            .insert(key, verdict.clone(), ttl, Instant::now());
        Ok(verdict.into_user())
    }

    /// Whether `user` may impersonate what `check` names (SubjectAccessReview, cached).
    pub async fn may_impersonate(
        &self,
        pool: &CorePool,
        generation: &Generation,
        cluster: usize,
        user: &UserInfo,
        check: &ImpersonationCheck,
    ) -> Result<bool, ApiCallFailure> {
        let key = (cluster_key(generation, cluster), access_key(user, check));
        if let Some(allowed) = self.access.borrow().get(&key, Instant::now()) {
            return Ok(*allowed);
        }
        let settings = &generation.snapshot.clusters()[cluster].authentication;
        let answer = review(
            pool,
            generation,
            cluster,
            ACCESS_REVIEW_PATH,
            access_review(user, check),
            settings.review_timeout,
        )
        .await?;
        let allowed = access_allowed(&answer);
        self.access.borrow_mut().insert(
            key,
            allowed,
            settings.subject_access_review_ttl,
            Instant::now(),
        );
        Ok(allowed)
    }
}

/// What a SubjectAccessReview answer depends on: the asking user and its groups, and the target.
fn access_key(user: &UserInfo, check: &ImpersonationCheck) -> String {
    format!(
        "{}\u{0}{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
        user.name,
        user.groups,
        check.api_group,
        check.resource,
        check.subresource,
        check.namespace,
        check.name
    )
}

/// Caches are per cluster name (stable across reloads).
fn cluster_key(generation: &Generation, cluster: usize) -> u64 {
    name_key(&generation.snapshot.clusters()[cluster].name)
}

fn name_key(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cluster: &str, token: &str) -> ReviewKey {
        (name_key(cluster), token.to_string())
    }

    #[test]
    fn a_cached_verdict_is_a_hit_until_it_expires() {
        let start = Instant::now();
        let mut cache = ReviewCache::default();
        cache.insert(
            key("a", "t"),
            TokenVerdict::Rejected,
            Duration::from_secs(5),
            start,
        );
        assert_eq!(
            cache.get(&key("a", "t"), start + Duration::from_secs(4)),
            Some(&TokenVerdict::Rejected)
        );
        assert_eq!(
            cache.get(&key("a", "t"), start + Duration::from_secs(5)),
            None,
            "expired at its deadline"
        );
        assert_eq!(cache.get(&key("a", "other"), start), None);
    }

    #[test]
    fn one_clusters_tokens_mean_nothing_to_another() {
        let now = Instant::now();
        let mut cache = ReviewCache::default();
        cache.insert(key("a", "t"), true, Duration::from_secs(60), now);
        assert_eq!(cache.get(&key("a", "t"), now), Some(&true));
        assert_eq!(cache.get(&key("b", "t"), now), None);
    }

    #[test]
    fn a_user_is_believed_for_the_success_ttl_and_a_rejection_for_the_failure_ttl() {
        let settings = Authentication {
            token_review_success_ttl: Duration::from_secs(600),
            token_review_failure_ttl: Duration::from_secs(10),
            ..Authentication::default()
        };
        let user = TokenVerdict::User(UserInfo::new("bob", &[]));
        assert_eq!(verdict_ttl(&user, &settings), Duration::from_secs(600));
        assert_eq!(
            verdict_ttl(&TokenVerdict::Rejected, &settings),
            Duration::from_secs(10)
        );

        // Both verdicts cached at once: the rejection is gone after 10 s, the user is not.
        let start = Instant::now();
        let mut cache = ReviewCache::default();
        for (token, verdict) in [("good", user.clone()), ("bad", TokenVerdict::Rejected)] {
            let ttl = verdict_ttl(&verdict, &settings);
            cache.insert(key("a", token), verdict, ttl, start);
        }
        let later = start + Duration::from_secs(11);
        assert_eq!(cache.get(&key("a", "good"), later), Some(&user));
        assert_eq!(cache.get(&key("a", "bad"), later), None);
        assert!(cache
            .get(&key("a", "good"), start + Duration::from_secs(600))
            .is_none());
    }

    #[test]
    fn at_its_limit_the_cache_drops_expired_entries_first() {
        let start = Instant::now();
        let mut cache = ReviewCache::with_limit(3);
        cache.insert(key("a", "short"), false, Duration::from_secs(1), start);
        cache.insert(key("a", "long-1"), true, Duration::from_secs(60), start);
        cache.insert(key("a", "long-2"), true, Duration::from_secs(60), start);
        let later = start + Duration::from_secs(2);
        cache.insert(key("a", "new"), true, Duration::from_secs(60), later);
        assert_eq!(cache.len(), 3, "only the expired entry made room");
        for token in ["long-1", "long-2", "new"] {
            assert_eq!(cache.get(&key("a", token), later), Some(&true), "{token}");
        }
    }

    #[test]
    fn at_its_limit_with_nothing_expired_the_cache_starts_over() {
        let now = Instant::now();
        let mut cache = ReviewCache::with_limit(3);
        for token in ["1", "2", "3"] {
            cache.insert(key("a", token), true, Duration::from_secs(60), now);
        }
        cache.insert(key("a", "4"), true, Duration::from_secs(60), now);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get(&key("a", "4"), now), Some(&true));
        assert_eq!(cache.get(&key("a", "1"), now), None);
    }

    #[test]
    fn the_default_cache_is_bounded() {
        let now = Instant::now();
        let mut cache = ReviewCache::default();
        for index in 0..CACHE_LIMIT + 10 {
            cache.insert(
                key("a", &index.to_string()),
                true,
                Duration::from_secs(60),
                now,
            );
            assert!(cache.len() <= CACHE_LIMIT);
        }
    }

    #[test]
    fn access_answers_depend_on_user_groups_and_target() {
        let check = |name: &str| ImpersonationCheck {
            api_group: "",
            resource: "users",
            subresource: String::new(),
            namespace: String::new(),
            name: name.into(),
        };
        let alice = UserInfo::new("alice", &["devs"]);
        let alice_admin = UserInfo::new("alice", &["devs", "admins"]);
        let base = access_key(&alice, &check("bob"));
        assert_eq!(base, access_key(&alice, &check("bob")));
        assert_ne!(base, access_key(&alice_admin, &check("bob")));
        assert_ne!(base, access_key(&alice, &check("carol")));
    }
}
