//! Authentication and impersonation checks that need the apiserver: TokenReview for bearer
//! tokens and SubjectAccessReview for client-sent Impersonate-* headers, asked with the
//! gateway's own identity (see `review.rs`) and cached per core (no lock on the request path;
//! each core asks at most once per TTL).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use sluice_gateway::cluster::spec::Authentication;
use sluice_gateway::identity::{ImpersonationCheck, UserInfo};

use sluice_gateway::status::GatewayError;

use crate::error::{ApiCallFailure, ProxyError};
use crate::review::{
    access_allowed, access_review, review, token_review, token_verdict, Reviewer, TokenVerdict,
    ACCESS_REVIEW_PATH, TOKEN_REVIEW_PATH,
};
use crate::review_key::{access_question, KeyView, ReviewKey};
use crate::state::Generation;

/// Entries each segment of a core's cache may hold (see [`ReviewCache`]).
const CACHE_LIMIT: usize = 10_000;
/// Source addresses a core tracks rejected tokens for; past it, the full allowances go first.
const FAILURE_SOURCES_LIMIT: usize = 10_000;
/// Bearer tokens longer than this are refused without asking the apiserver.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Reviews in flight by what they ask: the event wakes the requests waiting for the answer.
type PendingReviews = HashMap<ReviewKey, Rc<event_listener::Event>>;

/// Whether a cached answer is one worth keeping under pressure: a user, an allowed check.
pub trait Verdict {
    fn is_good(&self) -> bool;
}

impl Verdict for TokenVerdict {
    fn is_good(&self) -> bool {
        matches!(self, TokenVerdict::User(_))
    }
}

impl Verdict for bool {
    fn is_good(&self) -> bool {
        *self
    }
}

/// Review answers with their expiry, bounded in size and segmented: good answers (users,
/// allowed checks) and bad ones (rejected tokens: anyone can make those up) have their own
/// room, so a flood of made-up tokens only ever evicts other rejections.
#[derive(Debug)]
struct ReviewCache<V> {
    good: HashMap<ReviewKey, (V, Instant)>,
    bad: HashMap<ReviewKey, (V, Instant)>,
    limit: usize,
}

impl<V: Verdict> Default for ReviewCache<V> {
    fn default() -> Self {
        Self::with_limit(CACHE_LIMIT)
    }
}

impl<V: Verdict> ReviewCache<V> {
    fn with_limit(limit: usize) -> Self {
        Self {
            good: HashMap::new(),
            bad: HashMap::new(),
            limit: limit.max(1),
        }
    }

    /// The answer for `key` unless it expired by `now`.
    fn get(&self, key: &dyn KeyView, now: Instant) -> Option<&V> {
        self.good
            .get(key)
            .or_else(|| self.bad.get(key))
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value)
    }

    /// Keeps `value` until `now + ttl` in its segment. At the segment's limit, expired entries
    /// go first; then a good answer evicts the good entry closest to expiry, and a bad answer
    /// empties the bad segment (cheap, and only rejections are lost).
    fn insert(&mut self, key: ReviewKey, value: V, ttl: Duration, now: Instant) {
        let good = value.is_good();
        // One key lives in one segment: a token whose verdict changed moves.
        if good {
            self.bad.remove(&key);
        } else {
            self.good.remove(&key);
        }
        let segment = if good { &mut self.good } else { &mut self.bad };
        if segment.len() >= self.limit && !segment.contains_key(&key) {
            segment.retain(|_, (_, expires)| *expires > now);
            if segment.len() >= self.limit {
                if good {
                    let soonest = segment
                        .iter()
                        .min_by_key(|(_, (_, expires))| *expires)
                        .map(|(key, _)| key.clone());
                    if let Some(soonest) = soonest {
                        segment.remove(&soonest);
                    }
                } else {
                    segment.clear();
                }
            }
        }
        segment.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.good.len() + self.bad.len()
    }
}

/// Per source address, how many more rejected tokens it may have reviewed (a token bucket:
/// `burst` at most, refilled at `per_minute`).
#[derive(Debug, Default)]
pub struct FailureLimiter {
    sources: HashMap<IpAddr, (f64, Instant)>,
}

impl FailureLimiter {
    /// The allowance of `source` at `now`.
    fn level(&self, source: IpAddr, (burst, per_minute): (u32, u32), now: Instant) -> f64 {
        let burst = f64::from(burst);
        self.sources.get(&source).map_or(burst, |(level, updated)| {
            let refill = now.saturating_duration_since(*updated).as_secs_f64()
                * f64::from(per_minute)
                / 60.0;
            (level + refill).min(burst)
        })
    }

    /// `None` when `source` may have one more unknown token reviewed; otherwise the seconds
    /// until it may.
    pub fn check(&self, source: IpAddr, limits: (u32, u32), now: Instant) -> Option<u32> {
        let level = self.level(source, limits, now);
        if level >= 1.0 {
            return None;
        }
        let per_second = f64::from(limits.1.max(1)) / 60.0;
        Some(((1.0 - level) / per_second).ceil().max(1.0) as u32)
    }

    /// One rejected token of `source`.
    pub fn record_failure(&mut self, source: IpAddr, limits: (u32, u32), now: Instant) {
        let level = self.level(source, limits, now);
        if self.sources.len() >= FAILURE_SOURCES_LIMIT && !self.sources.contains_key(&source) {
            // Forget the sources whose allowance is full again; then, if need be, everyone.
            let burst = f64::from(limits.0);
            self.sources.retain(|_, (level, updated)| {
                let refill = now.saturating_duration_since(*updated).as_secs_f64()
                    * f64::from(limits.1)
                    / 60.0;
                *level + refill < burst
            });
            if self.sources.len() >= FAILURE_SOURCES_LIMIT {
                self.sources.clear();
            }
        }
        self.sources.insert(source, ((level - 1.0).max(0.0), now));
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
    pending: RefCell<PendingReviews>,
    /// TokenReviews in flight on this core.
    reviewing: Rc<Cell<u32>>,
    /// Rejected tokens per source address.
    failures: RefCell<FailureLimiter>,
}

/// Counts a TokenReview in flight for as long as it lives.
struct ReviewSlot(Rc<Cell<u32>>);

impl Drop for ReviewSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Wakes the requests waiting on a review, however it ends.
struct PendingReview<'a> {
    pending: &'a RefCell<PendingReviews>,
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
    /// cluster's tokens mean nothing to another. A miss is refused with 429 instead of
    /// reviewed when `source` had too many tokens rejected lately, or when this core already
    /// has the cluster's maximum of reviews in flight.
    pub async fn user_for_token(
        &self,
        reviewer: &dyn Reviewer,
        generation: &Generation,
        (cluster, source): (usize, IpAddr),
        token: &str,
        (metrics, worker): (&crate::metrics::GatewayMetrics, usize),
    ) -> Result<Option<Rc<UserInfo>>, ProxyError> {
        let (hits, misses) = (&metrics.auth_cache_hits, &metrics.auth_cache_misses);
        let compiled = &generation.snapshot.clusters()[cluster];
        let settings = &compiled.authentication;
        let limits = (
            settings.failed_token_review_burst,
            settings.failed_token_reviews_per_minute,
        );
        // Borrowed for the lookups; copied only when this request asks the apiserver itself.
        let asked = (cluster_key(generation, cluster), token);
        let _review = loop {
            if let Some(verdict) = self.tokens.borrow().get(&asked, Instant::now()) {
                hits.inc(worker);
                return Ok(verdict.user());
            }
            let waiting = self
                .pending
                .borrow()
                .get(&asked as &dyn KeyView)
                .map(|event| event.listen());
            match waiting {
                // Another request of this core is asking: wait, then read the cache again
                // (if that review failed, this request asks itself).
                Some(listener) => listener.await,
                None => {
                    if let Some(retry_after) =
                        self.failures.borrow().check(source, limits, Instant::now())
                    {
                        return Err(
                            GatewayError::AuthenticationFailuresLimited { retry_after }.into()
                        );
                    }
                    if self.reviewing.get() >= settings.max_concurrent_token_reviews.max(1) {
                        return Err(GatewayError::TokenReviewsBusy {
                            cluster: compiled.name.to_string(),
                        }
                        .into());
                    }
                    let key = (asked.0, token.to_string());
                    self.pending
                        .borrow_mut()
                        .insert(key.clone(), Rc::new(event_listener::Event::new()));
                    break PendingReview {
                        pending: &self.pending,
                        key,
                    };
                }
            }
        };
        self.reviewing.set(self.reviewing.get() + 1);
        let _slot = ReviewSlot(self.reviewing.clone());
        misses.inc(worker);
        // Boxed, as the access review below: a review is a whole upstream call (kilobytes of
        // state), made on a cache miss only, and every request's future would carry it.
        let answer = Box::pin(review(
            reviewer,
            generation,
            cluster,
            TOKEN_REVIEW_PATH,
            token_review(token),
            settings.review_timeout,
        ))
        .await
        .map_err(|cause| ProxyError::AuthUnavailable {
            cluster: compiled.name.clone(),
            cause,
        })?;
        let verdict = token_verdict(&answer);
        let ttl = verdict_ttl(&verdict, settings);
        if !verdict.is_good() {
            self.failures
                .borrow_mut()
                .record_failure(source, limits, Instant::now());
        }
        let user = verdict.user();
        let key = (asked.0, token.to_string());
        self.tokens
            .borrow_mut()
            .insert(key, verdict, ttl, Instant::now());
        Ok(user)
    }

    /// Caches `user` for `token` as a TokenReview answer would (tests drive cache hits).
    #[cfg(test)]
    pub fn remember_token(
        &self,
        generation: &Generation,
        cluster: usize,
        token: &str,
        user: UserInfo,
    ) {
        let key = (cluster_key(generation, cluster), token.to_string());
        let verdict = TokenVerdict::User(Rc::new(user));
        let ttl = Duration::from_secs(3600);
        self.tokens
            .borrow_mut()
            .insert(key, verdict, ttl, Instant::now());
    }

    /// Whether `user` may impersonate what `check` names (SubjectAccessReview, cached).
    pub async fn may_impersonate(
        &self,
        reviewer: &dyn Reviewer,
        generation: &Generation,
        cluster: usize,
        user: &UserInfo,
        check: &ImpersonationCheck,
    ) -> Result<bool, ApiCallFailure> {
        let key = (
            cluster_key(generation, cluster),
            access_question(user, check),
        );
        if let Some(allowed) = self.access.borrow().get(&key, Instant::now()) {
            return Ok(*allowed);
        }
        let settings = &generation.snapshot.clusters()[cluster].authentication;
        let answer = Box::pin(review(
            reviewer,
            generation,
            cluster,
            ACCESS_REVIEW_PATH,
            access_review(user, check),
            settings.review_timeout,
        ))
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
        let user = TokenVerdict::User(UserInfo::new("bob", &[]).into());
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
        cache.insert(key("a", "short"), true, Duration::from_secs(1), start);
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
    fn at_its_limit_with_nothing_expired_a_user_evicts_the_one_closest_to_expiry() {
        let now = Instant::now();
        let mut cache = ReviewCache::with_limit(3);
        for (token, seconds) in [("1", 60), ("2", 30), ("3", 90)] {
            cache.insert(key("a", token), true, Duration::from_secs(seconds), now);
        }
        cache.insert(key("a", "4"), true, Duration::from_secs(60), now);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get(&key("a", "4"), now), Some(&true));
        assert_eq!(cache.get(&key("a", "2"), now), None, "closest to expiry");
        assert_eq!(cache.get(&key("a", "1"), now), Some(&true));
    }

    #[test]
    fn at_its_limit_rejections_start_over_among_themselves() {
        let now = Instant::now();
        let mut cache = ReviewCache::with_limit(3);
        cache.insert(key("a", "good"), true, Duration::from_secs(60), now);
        for token in ["1", "2", "3", "4"] {
            cache.insert(key("a", token), false, Duration::from_secs(60), now);
        }
        assert_eq!(cache.get(&key("a", "4"), now), Some(&false));
        assert_eq!(cache.get(&key("a", "1"), now), None);
        assert_eq!(cache.get(&key("a", "good"), now), Some(&true));
        // A token whose verdict changes lives in one segment only.
        cache.insert(key("a", "4"), true, Duration::from_secs(60), now);
        assert_eq!(cache.get(&key("a", "4"), now), Some(&true));
        assert_eq!(cache.bad.len(), 0);
    }

    #[test]
    fn a_source_with_too_many_rejected_tokens_waits_for_its_allowance() {
        let start = Instant::now();
        let source: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let limits = (3, 60); // three at once, one more per second
        let mut limiter = FailureLimiter::default();
        for _ in 0..3 {
            assert_eq!(limiter.check(source, limits, start), None);
            limiter.record_failure(source, limits, start);
        }
        assert_eq!(limiter.check(source, limits, start), Some(1));
        assert_eq!(limiter.check(other, limits, start), None, "per source");
        let later = start + Duration::from_millis(1_100);
        assert_eq!(limiter.check(source, limits, later), None, "refilled");
        limiter.record_failure(source, limits, later);
        assert!(limiter.check(source, limits, later).is_some());
    }

    #[test]
    fn the_failure_limiter_is_bounded() {
        let now = Instant::now();
        let mut limiter = FailureLimiter::default();
        for index in 0..FAILURE_SOURCES_LIMIT as u32 + 10 {
            limiter.record_failure(IpAddr::from(index.to_be_bytes()), (10, 60), now);
            assert!(limiter.sources.len() <= FAILURE_SOURCES_LIMIT);
        }
    }

    #[test]
    fn a_flood_of_rejected_tokens_never_evicts_a_users_verdict() {
        let now = Instant::now();
        let mut cache = ReviewCache::with_limit(4);
        let alice = TokenVerdict::User(UserInfo::new("alice", &[]).into());
        cache.insert(
            key("a", "good"),
            alice.clone(),
            Duration::from_secs(600),
            now,
        );
        for index in 0..100 {
            cache.insert(
                key("a", &format!("random-{index}")),
                TokenVerdict::Rejected,
                Duration::from_secs(10),
                now,
            );
        }
        assert_eq!(cache.get(&key("a", "good"), now), Some(&alice));
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
}
