//! Flow control per dispatch policy: Exempt, MaxRequestsInflight, TokenBucket. It never queues:
//! a request over the limit is rejected at once with 429 and `Retry-After: 1`.
//!
//! State is per core (one [`CoreFlowControl`] per data-plane thread, `Rc`/`Cell`, not `Send`),
//! so admission is a few loads and stores on memory no other core touches. A global limit is
//! **split across the cores**: core `i` of `n` gets `max / n` in-flight slots plus one of the
//! remainder, `burst / n` tokens plus one of the remainder, and exactly `qps / n` refill (kept
//! as an integer rate in units of `1 / (n * 10^9)` token per nanosecond, so no rounding
//! accumulates). The sum over the cores is exactly the configured limit, so the gateway never
//! admits more than configured; the price is that a core can reject while another still has
//! room (with SO_REUSEPORT spreading connections evenly this evens out; a limit smaller than the
//! core count leaves some cores with zero, which we accept and document rather than share one
//! contended counter between cores).
//!
//! Long-running requests are not counted by `MaxRequestsInflight` (as in kube-apiserver), but
//! every request that is not under an `Exempt` schema counts against its user's long-running
//! budget on this core (`connectionPool.maxLongRunningPerUser`, see `fair_share.rs`), and every
//! upgrade against the cluster's (`maxUpgradeConnections`, [`CoreFlowControl::admit_upgrade`]);
//! the permit carries those slots and the request's priority level (its schema's name).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::fair_share::{
    LongRunningLimits, LongRunningSlot, LongRunningUsers, UpgradeSlot, UpgradeSlots,
};
use crate::identity::UserInfo;
use crate::status::GatewayError;

/// A compiled flow-control schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowControlSchema {
    pub name: Box<str>,
    pub limit: FlowLimit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowLimit {
    Exempt,
    /// Concurrent non-long-running requests (watches, exec, logs... are not counted, as in
    /// kube-apiserver's max-in-flight filter).
    MaxRequestsInflight {
        max: u32,
    },
    TokenBucket {
        qps: u32,
        burst: u32,
    },
}

/// Which share of a global limit this core holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreShare {
    pub core_index: u32,
    pub core_count: u32,
}

impl CoreShare {
    pub const SINGLE: CoreShare = CoreShare {
        core_index: 0,
        core_count: 1,
    };

    fn count(self) -> u32 {
        self.core_count.max(1)
    }

    /// This core's part of `total` when it is split as evenly as integers allow.
    pub fn split(self, total: u32) -> u32 {
        let count = self.count();
        total / count + u32::from(self.core_index % count < total % count)
    }
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Per-core state of one schema.
#[derive(Debug)]
enum Limiter {
    Exempt,
    Inflight {
        max: u32,
        /// Shared with the permits of admitted requests, which release their slot on drop.
        in_flight: Rc<Cell<u32>>,
    },
    Bucket {
        /// Capacity and level in units of `1 / (core_count * 10^9)` token.
        capacity: u128,
        level: Cell<u128>,
        /// Units added per nanosecond (= the global qps; see the module comment).
        refill_per_nano: u128,
        unit_per_token: u128,
        last_refill: Cell<Option<Instant>>,
    },
}

/// The flow-control state of one core for one config snapshot's schemas (indexed like them).
#[derive(Debug)]
pub struct CoreFlowControl {
    schemas: Box<[(Arc<str>, Limiter)]>,
    long_running: LongRunningUsers,
    upgrades: UpgradeSlots,
}

/// Proof a request was admitted; dropping it frees its in-flight slot (if it took one) and its
/// user's long-running slot (if it is long-running).
#[derive(Debug)]
#[must_use = "dropping the permit releases the in-flight slot at once"]
pub struct FlowPermit {
    slot: Option<Rc<Cell<u32>>>,
    long_running: Option<LongRunningSlot>,
    upgrade: Option<UpgradeSlot>,
    level: Option<Arc<str>>,
}

impl FlowPermit {
    /// The priority level: the name of the schema that admitted the request (`None`: none).
    pub fn level(&self) -> Option<&Arc<str>> {
        self.level.as_ref()
    }

    /// Whether the request holds a long-running slot of its user.
    pub fn holds_long_running_slot(&self) -> bool {
        self.long_running.is_some()
    }
}

impl Drop for FlowPermit {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.set(slot.get().saturating_sub(1));
        }
    }
}

impl CoreFlowControl {
    /// State for `schemas` on the core described by `share`, with the cluster's long-running
    /// budgets. In-flight counters of schemas that keep their name and kind, and the
    /// long-running counts, are carried over from `previous` (a config reload), so requests
    /// admitted before the reload still count and still release their slot.
    pub fn new(
        schemas: &[FlowControlSchema],
        limits: LongRunningLimits,
        share: CoreShare,
        previous: Option<&CoreFlowControl>,
    ) -> Self {
        let carried = |name: &str| {
            previous.and_then(|previous| {
                previous
                    .schemas
                    .iter()
                    .find_map(|(old, limiter)| match limiter {
                        Limiter::Inflight { in_flight, .. } if **old == *name => {
                            Some(in_flight.clone())
                        }
                        _ => None,
                    })
            })
        };
        let schemas = schemas
            .iter()
            .map(|schema| {
                let limiter = match schema.limit {
                    FlowLimit::Exempt => Limiter::Exempt,
                    FlowLimit::MaxRequestsInflight { max } => Limiter::Inflight {
                        max: share.split(max),
                        in_flight: carried(&schema.name).unwrap_or_default(),
                    },
                    FlowLimit::TokenBucket { qps, burst } => {
                        let unit_per_token = u128::from(share.count()) * NANOS_PER_SECOND;
                        let capacity = u128::from(share.split(burst)) * unit_per_token;
                        Limiter::Bucket {
                            capacity,
                            level: Cell::new(capacity),
                            refill_per_nano: u128::from(qps),
                            unit_per_token,
                            last_refill: Cell::new(None),
                        }
                    }
                };
                (Arc::from(&*schema.name), limiter)
            })
            .collect();
        let long_running = match previous {
            Some(previous) => LongRunningUsers::with_limit(&previous.long_running, limits.per_user),
            None => LongRunningUsers::new(limits.per_user),
        };
        let upgrades =
            UpgradeSlots::new(limits.upgrades, previous.map(|previous| &previous.upgrades));
        Self {
            schemas,
            long_running,
            upgrades,
        }
    }

    /// Admits or rejects a request of `user` under schema `schema` (an index from the dispatch
    /// policy; `None` = no schema limit). `now` is injectable for tests; the proxy passes
    /// `Instant::now()`.
    pub fn admit(
        &self,
        schema: Option<usize>,
        long_running: bool,
        user: &Rc<UserInfo>,
        now: Instant,
    ) -> Result<FlowPermit, GatewayError> {
        let found = schema.and_then(|index| self.schemas.get(index));
        let level = found.map(|(name, _)| name.clone());
        if let Some((_, Limiter::Exempt)) = found {
            return Ok(FlowPermit {
                slot: None,
                long_running: None,
                upgrade: None,
                level,
            });
        }
        let slot = match found {
            Some((name, limiter)) => Self::admit_schema(name, limiter, long_running, now)?,
            None => None,
        };
        let long_running = if long_running {
            let taken =
                self.long_running
                    .acquire(user)
                    .map_err(|refusal| GatewayError::FairShare {
                        level: level.clone(),
                        refusal,
                    })?;
            Some(taken)
        } else {
            None
        };
        Ok(FlowPermit {
            slot,
            long_running,
            upgrade: None,
            level,
        })
    }

    /// Counts an admitted request that is an upgrade (exec, attach, port-forward: a connection
    /// of its own to an apiserver) against the cluster's upgrades on this core, whatever its
    /// schema; its permit holds the slot for as long as the upgrade lives.
    pub fn admit_upgrade(&self, permit: &mut FlowPermit) -> Result<(), GatewayError> {
        let slot = self
            .upgrades
            .acquire()
            .map_err(|refusal| GatewayError::FairShare {
                level: permit.level.clone(),
                refusal,
            })?;
        permit.upgrade = Some(slot);
        Ok(())
    }

    /// One schema's verdict: the in-flight slot taken, if any.
    fn admit_schema(
        name: &Arc<str>,
        limiter: &Limiter,
        long_running: bool,
        now: Instant,
    ) -> Result<Option<Rc<Cell<u32>>>, GatewayError> {
        let admitted = match limiter {
            Limiter::Exempt => return Ok(None),
            Limiter::Inflight { .. } if long_running => return Ok(None),
            Limiter::Inflight { max, in_flight } => {
                if in_flight.get() < *max {
                    in_flight.set(in_flight.get() + 1);
                    return Ok(Some(in_flight.clone()));
                }
                false
            }
            Limiter::Bucket {
                capacity,
                level,
                refill_per_nano,
                unit_per_token,
                last_refill,
            } => {
                let elapsed = last_refill
                    .get()
                    .map_or(0, |last| now.saturating_duration_since(last).as_nanos());
                // Never move the clock backwards, or refill would be counted twice.
                if last_refill.get().is_none_or(|last| now > last) {
                    last_refill.set(Some(now));
                }
                let refilled = level
                    .get()
                    .saturating_add(elapsed.saturating_mul(*refill_per_nano))
                    .min(*capacity);
                if refilled >= *unit_per_token {
                    level.set(refilled - unit_per_token);
                    true
                } else {
                    level.set(refilled);
                    false
                }
            }
        };
        if admitted {
            Ok(None)
        } else {
            Err(GatewayError::TooManyRequests {
                schema: name.clone(),
            })
        }
    }

    /// Long-running requests `user` has open on this core.
    pub fn long_running_of(&self, user: &str) -> u32 {
        self.long_running.open(user)
    }

    /// Requests holding an in-flight slot of `schema` on this core (for metrics).
    pub fn in_flight(&self, schema: usize) -> u32 {
        match self.schemas.get(schema) {
            Some((_, Limiter::Inflight { in_flight, .. })) => in_flight.get(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn control(limit: FlowLimit, share: CoreShare) -> CoreFlowControl {
        CoreFlowControl::new(
            &[FlowControlSchema {
                name: "limit".into(),
                limit,
            }],
            LIMITS,
            share,
            None,
        )
    }

    const LIMITS: LongRunningLimits = LongRunningLimits {
        per_user: 100,
        upgrades: 100,
    };

    thread_local! {
        static USER: Rc<UserInfo> = Rc::new(UserInfo::new("alice", &[]));
    }

    fn alice() -> Rc<UserInfo> {
        USER.with(Rc::clone)
    }

    #[test]
    fn token_bucket_qps_10_burst_5_admits_expected_counts_over_a_timeline() {
        let control = control(
            FlowLimit::TokenBucket { qps: 10, burst: 5 },
            CoreShare::SINGLE,
        );
        let start = Instant::now();
        let at = |millis: u64| start + Duration::from_millis(millis);
        let admitted = |now: Instant, attempts: u32| {
            (0..attempts)
                .filter(|_| control.admit(Some(0), false, &alice(), now).is_ok())
                .count()
        };
        // a burst of 20 at t=0: exactly the burst passes
        assert_eq!(admitted(at(0), 20), 5);
        // 100 ms later one token has been refilled
        assert_eq!(admitted(at(100), 20), 1);
        assert_eq!(admitted(at(150), 20), 0);
        // a second later the bucket is full again, not fuller
        assert_eq!(admitted(at(5_000), 20), 5);
        // steady 50 requests/s for one second after that: 10 pass
        let steady = (1..=50)
            .filter(|step| {
                control
                    .admit(Some(0), false, &alice(), at(5_000 + step * 20))
                    .is_ok()
            })
            .count();
        assert_eq!(steady, 10);
    }

    #[test]
    fn token_bucket_rejection_is_429_with_retry_after() {
        let control = control(
            FlowLimit::TokenBucket { qps: 1, burst: 1 },
            CoreShare::SINGLE,
        );
        let now = Instant::now();
        assert!(control.admit(Some(0), false, &alice(), now).is_ok());
        let error = control.admit(Some(0), false, &alice(), now).unwrap_err();
        assert_eq!(error.http_status(), 429);
        assert_eq!(error.retry_after_seconds(), Some(1));
        assert_eq!(
            error,
            GatewayError::TooManyRequests {
                schema: "limit".into()
            }
        );
    }

    #[test]
    fn token_bucket_ignores_a_clock_that_goes_backwards() {
        let control = control(
            FlowLimit::TokenBucket { qps: 10, burst: 1 },
            CoreShare::SINGLE,
        );
        let now = Instant::now() + Duration::from_secs(10);
        assert!(control.admit(Some(0), false, &alice(), now).is_ok());
        assert!(control
            .admit(Some(0), false, &alice(), now - Duration::from_secs(5))
            .is_err());
        assert!(control.admit(Some(0), false, &alice(), now).is_err());
        assert!(control
            .admit(Some(0), false, &alice(), now + Duration::from_millis(100))
            .is_ok());
    }

    #[test]
    fn max_inflight_2_rejects_the_third_and_ignores_watches() {
        let control = control(FlowLimit::MaxRequestsInflight { max: 2 }, CoreShare::SINGLE);
        let now = Instant::now();
        let watch = control.admit(Some(0), true, &alice(), now).unwrap();
        let first = control.admit(Some(0), false, &alice(), now).unwrap();
        let _second = control.admit(Some(0), false, &alice(), now).unwrap();
        let _another_watch = control.admit(Some(0), true, &alice(), now).unwrap();
        assert_eq!(control.in_flight(0), 2);
        let third = control.admit(Some(0), false, &alice(), now).unwrap_err();
        assert_eq!(third.http_status(), 429);
        drop(watch);
        assert!(control.admit(Some(0), false, &alice(), now).is_err());
        drop(first);
        assert_eq!(control.in_flight(0), 1);
        let _third = control.admit(Some(0), false, &alice(), now).unwrap();
        assert_eq!(control.in_flight(0), 2);
    }

    #[test]
    fn exempt_and_no_schema_admit_everything() {
        let control = control(FlowLimit::Exempt, CoreShare::SINGLE);
        let now = Instant::now();
        for _ in 0..1000 {
            assert!(control.admit(Some(0), false, &alice(), now).is_ok());
            assert!(control.admit(None, false, &alice(), now).is_ok());
        }
    }

    #[test]
    fn limits_split_across_cores_sum_to_the_global_limit() {
        let now = Instant::now();
        for cores in 1..=5u32 {
            let shares = (0..cores).map(|core_index| CoreShare {
                core_index,
                core_count: cores,
            });
            let mut held = Vec::new();
            let mut bucket_admitted = 0;
            let mut bucket_refilled = 0;
            for share in shares {
                let inflight = control(FlowLimit::MaxRequestsInflight { max: 7 }, share);
                let mut on_core = Vec::new();
                while let Ok(permit) = inflight.admit(Some(0), false, &alice(), now) {
                    on_core.push(permit);
                }
                held.push((inflight, on_core));
                let bucket = control(FlowLimit::TokenBucket { qps: 10, burst: 5 }, share);
                bucket_admitted += (0..20)
                    .filter(|_| bucket.admit(Some(0), false, &alice(), now).is_ok())
                    .count();
                let later = now + Duration::from_secs(1);
                bucket_refilled += (0..20)
                    .filter(|_| bucket.admit(Some(0), false, &alice(), later).is_ok())
                    .count();
            }
            let total: usize = held.iter().map(|(_, permits)| permits.len()).sum();
            assert_eq!(total, 7, "inflight over {cores} cores");
            assert_eq!(bucket_admitted, 5, "burst over {cores} cores");
            // one second refills qps tokens, capped per core by its burst share
            assert!(
                (5..=10).contains(&bucket_refilled),
                "refill over {cores} cores: {bucket_refilled}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn core_shares_always_sum_to_the_total(total in 0u32..100_000, cores in 1u32..256) {
            let sum: u64 = (0..cores)
                .map(|core_index| u64::from(CoreShare { core_index, core_count: cores }.split(total)))
                .sum();
            proptest::prop_assert_eq!(sum, u64::from(total));
        }
    }

    #[test]
    fn reload_keeps_in_flight_counts_of_the_same_schema() {
        let before = control(FlowLimit::MaxRequestsInflight { max: 2 }, CoreShare::SINGLE);
        let now = Instant::now();
        let permit = before.admit(Some(0), false, &alice(), now).unwrap();
        let after = CoreFlowControl::new(
            &[FlowControlSchema {
                name: "limit".into(),
                limit: FlowLimit::MaxRequestsInflight { max: 1 },
            }],
            LIMITS,
            CoreShare::SINGLE,
            Some(&before),
        );
        assert!(after.admit(Some(0), false, &alice(), now).is_err());
        drop(permit);
        assert!(after.admit(Some(0), false, &alice(), now).is_ok());
    }

    #[test]
    fn a_user_past_its_long_running_budget_gets_429_naming_the_level() {
        let control = CoreFlowControl::new(
            &[
                FlowControlSchema {
                    name: "workloads".into(),
                    limit: FlowLimit::MaxRequestsInflight { max: 10 },
                },
                FlowControlSchema {
                    name: "system".into(),
                    limit: FlowLimit::Exempt,
                },
            ],
            LongRunningLimits {
                per_user: 2,
                upgrades: 1,
            },
            CoreShare::SINGLE,
            None,
        );
        let now = Instant::now();
        let greedy = Rc::new(UserInfo::new("greedy", &[]));
        let watches: Vec<_> = (0..2)
            .map(|_| control.admit(Some(0), true, &greedy, now).unwrap())
            .collect();
        assert!(watches.iter().all(FlowPermit::holds_long_running_slot));
        let refused = control.admit(None, true, &greedy, now).unwrap_err();
        assert_eq!(refused.http_status(), 429);
        assert_eq!(refused.retry_after_seconds(), Some(1));
        let refused = control.admit(Some(0), true, &greedy, now).unwrap_err();
        assert_eq!(
            refused,
            GatewayError::FairShare {
                level: Some("workloads".into()),
                refusal: crate::fair_share::FairShareRefusal::UserLongRunning,
            }
        );
        // Short requests, other users, and exempt schemas are not held back by it.
        let get = control.admit(Some(0), false, &greedy, now).unwrap();
        assert_eq!(get.level().map(|level| &**level), Some("workloads"));
        assert!(control.admit(Some(0), true, &alice(), now).is_ok());
        let exempt = control.admit(Some(1), true, &greedy, now).unwrap();
        assert!(!exempt.holds_long_running_slot());
        assert_eq!(control.long_running_of("greedy"), 2);
        drop(watches);
        assert_eq!(control.long_running_of("greedy"), 0);
        assert!(control.admit(Some(0), true, &greedy, now).is_ok());

        // Upgrades: one per core for the whole cluster here, exempt schemas included.
        let mut exec = control.admit(Some(1), true, &alice(), now).unwrap();
        control.admit_upgrade(&mut exec).unwrap();
        let mut another = control.admit(Some(1), true, &greedy, now).unwrap();
        let refused = control.admit_upgrade(&mut another).unwrap_err();
        assert_eq!(
            refused,
            GatewayError::FairShare {
                level: Some("system".into()),
                refusal: crate::fair_share::FairShareRefusal::ClusterUpgrades,
            }
        );
        drop(exec);
        assert!(control.admit_upgrade(&mut another).is_ok());
    }

    #[test]
    fn unknown_schema_index_is_not_limited() {
        let control = control(FlowLimit::MaxRequestsInflight { max: 0 }, CoreShare::SINGLE);
        assert!(control
            .admit(Some(7), false, &alice(), Instant::now())
            .is_ok());
        assert!(control
            .admit(Some(0), false, &alice(), Instant::now())
            .is_err());
    }
}
