//! What one identity may add to the store: a token bucket of writes and one of bytes per
//! identity, and the same per role for all its identities together, so a greedy vm-agent (or a
//! thousand of them) is held to its role's share while the admin, nodes and gateways keep
//! their own (issue 32, finding 7: one vm-agent grew the store at 35-40 MiB/s).
//!
//! Buckets only hold state while they are below full: an identity whose buckets refilled is
//! the same as one never seen, so the map is pruned of them whenever it reaches its bound.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::{Store, StoreUsage};

use super::admission::role_index;
use crate::auth::{Identity, Role};

/// Identities whose buckets are tracked at once; past it, full buckets are pruned, and an
/// identity that still finds no room is held to its role's buckets only.
const MAX_TRACKED_IDENTITIES: usize = 65_536;

/// A token bucket's refill rate and size; a cost above `burst` needs a full bucket and
/// empties it, so no single write is refused for ever.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

impl Rate {
    pub const fn new(per_second: f64, burst: f64) -> Self {
        Self { per_second, burst }
    }
}

/// One role's write budget: per identity, and for all identities of the role together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoleBudget {
    /// Creates, updates, patches and deletes per second of one identity.
    pub writes: Rate,
    /// Bytes of stored objects (as JSON) per second of one identity.
    pub bytes: Rate,
    /// Writes per second of all the role's identities together.
    pub role_writes: Rate,
    /// Bytes per second of all the role's identities together.
    pub role_bytes: Rate,
}

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * KIB;

/// Every role's budget, indexed as [`Role::ALL`]; docs/CONFIG.md gives the reasons.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteBudgets {
    pub roles: [RoleBudget; 4],
}

impl Default for WriteBudgets {
    fn default() -> Self {
        let budget = |writes, bytes, role_writes, role_bytes| RoleBudget {
            writes,
            bytes,
            role_writes,
            role_bytes,
        };
        Self {
            roles: [
                // admin: kubectl apply of a few thousand objects at once.
                budget(
                    Rate::new(100.0, 2000.0),
                    Rate::new(8.0 * MIB, 64.0 * MIB),
                    Rate::new(200.0, 4000.0),
                    Rate::new(16.0 * MIB, 128.0 * MIB),
                ),
                // gateway: status of each upstream cluster when its health changes.
                budget(
                    Rate::new(20.0, 500.0),
                    Rate::new(256.0 * KIB, 4.0 * MIB),
                    Rate::new(200.0, 4000.0),
                    Rate::new(4.0 * MIB, 32.0 * MIB),
                ),
                // node: its entry in each held Agent's status when tunnels come and go.
                budget(
                    Rate::new(20.0, 500.0),
                    Rate::new(256.0 * KIB, 4.0 * MIB),
                    Rate::new(200.0, 4000.0),
                    Rate::new(4.0 * MIB, 32.0 * MIB),
                ),
                // vm-agent: a runtime-info report of a few KiB every 30 s by default (1 s at
                // the shortest --report-interval) and one on each change.
                budget(
                    Rate::new(2.0, 20.0),
                    Rate::new(16.0 * KIB, 512.0 * KIB),
                    Rate::new(200.0, 2000.0),
                    Rate::new(2.0 * MIB, 16.0 * MIB),
                ),
            ],
        }
    }
}

impl WriteBudgets {
    pub fn role(&self, role: Role) -> &RoleBudget {
        &self.roles[role_index(role)]
    }

    pub fn role_mut(&mut self, role: Role) -> &mut RoleBudget {
        &mut self.roles[role_index(role)]
    }

    /// Why these budgets cannot work (role, field and reason), if they cannot.
    pub fn check(&self) -> Result<(), String> {
        for role in Role::ALL {
            let budget = self.role(role);
            for (field, rate) in [
                ("writes", budget.writes),
                ("bytes", budget.bytes),
                ("role writes", budget.role_writes),
                ("role bytes", budget.role_bytes),
            ] {
                let finite = rate.per_second.is_finite() && rate.burst.is_finite();
                if !finite || rate.per_second <= 0.0 || rate.burst < 1.0 {
                    return Err(format!(
                        "write budget of {role}, {field}: the rate must be above 0 and the \
                         burst at least 1 (got {}/s, burst {})",
                        rate.per_second, rate.burst
                    ));
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: rate.burst,
            at: now,
        }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.at = now;
    }

    /// How long until `cost` (capped at the burst) is there; zero when it is now.
    fn wait(&self, rate: Rate, cost: f64) -> Duration {
        let missing = cost.min(rate.burst) - self.tokens;
        if missing <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(missing / rate.per_second)
    }

    fn take(&mut self, rate: Rate, cost: f64) {
        self.tokens = (self.tokens - cost.min(rate.burst)).max(0.0);
    }
}

/// A write's pair of buckets (writes, bytes).
type Pair = [Bucket; 2];

/// Which budget a refused write met (a metric label and the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The identity's own budget.
    Identity,
    /// The budget all identities of its role share.
    Role,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Identity => "identity_budget",
            Scope::Role => "role_budget",
        }
    }
}

/// A write over its budget: 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("write budget of {role} exceeded ({})", scope.as_str())]
pub struct OverBudget {
    pub role: Role,
    pub scope: Scope,
    pub retry_after: Duration,
}

impl OverBudget {
    /// The 429 `Status`: who is over which budget and when to retry (a whole second at least).
    pub fn status(&self, user: &str) -> StatusError {
        let seconds = self.retry_after.as_secs_f64().ceil().clamp(1.0, 3600.0) as u32;
        let whose = match self.scope {
            Scope::Identity => format!("{user:?} has used its write budget"),
            Scope::Role => format!(
                "the {} role has used the write budget all its identities share",
                self.role
            ),
        };
        StatusError::too_many_requests(
            format!("too many writes: {whose}; retry after {seconds}s"),
            seconds,
        )
    }
}

struct State {
    identities: HashMap<Identity, Pair>,
    roles: [Pair; 4],
}

/// The write budgets of one API server.
pub struct WriteBudget {
    budgets: WriteBudgets,
    /// [`MAX_TRACKED_IDENTITIES`]; smaller in tests.
    max_tracked: usize,
    state: Mutex<State>,
}

impl WriteBudget {
    pub fn new(budgets: WriteBudgets) -> Self {
        let now = Instant::now();
        let roles = Role::ALL.map(|role| {
            let budget = budgets.role(role);
            [
                Bucket::full(budget.role_writes, now),
                Bucket::full(budget.role_bytes, now),
            ]
        });
        Self {
            budgets,
            max_tracked: MAX_TRACKED_IDENTITIES,
            state: Mutex::new(State {
                identities: HashMap::new(),
                roles,
            }),
        }
    }

    /// Takes one write of `bytes` from `identity`'s and its role's budgets, or none of either
    /// when one is short.
    pub fn admit(&self, identity: &Identity, bytes: usize, now: Instant) -> Result<(), OverBudget> {
        let budget = *self.budgets.role(identity.role);
        let own = [budget.writes, budget.bytes];
        let shared = [budget.role_writes, budget.role_bytes];
        let costs = [1.0, bytes as f64];
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State { identities, roles } = &mut *state;
        let role = &mut roles[role_index(identity.role)];
        refill(role, shared, now);
        let wait = |pair: &Pair, rates: [Rate; 2]| {
            (0..2)
                .map(|i| pair[i].wait(rates[i], costs[i]))
                .max()
                .unwrap_or_default()
        };
        let max_tracked = self.max_tracked;
        let mut mine = tracked(identities, identity, &self.budgets, max_tracked, now);
        if let Some(pair) = mine.as_deref() {
            let retry_after = wait(pair, own);
            if !retry_after.is_zero() {
                let scope = Scope::Identity;
                return Err(OverBudget {
                    role: identity.role,
                    scope,
                    retry_after,
                });
            }
        }
        let retry_after = wait(&*role, shared);
        if !retry_after.is_zero() {
            let scope = Scope::Role;
            return Err(OverBudget {
                role: identity.role,
                scope,
                retry_after,
            });
        }
        for i in 0..2 {
            role[i].take(shared[i], costs[i]);
            if let Some(pair) = mine.as_mut() {
                pair[i].take(own[i], costs[i]);
            }
        }
        Ok(())
    }
}

fn refill(pair: &mut Pair, rates: [Rate; 2], now: Instant) {
    for (bucket, rate) in pair.iter_mut().zip(rates) {
        bucket.refill(rate, now);
    }
}

/// The identity's buckets, refilled to `now`; `None` when the map is at its bound even after
/// dropping the buckets that are full again.
fn tracked<'a>(
    identities: &'a mut HashMap<Identity, Pair>,
    identity: &Identity,
    budgets: &WriteBudgets,
    max_tracked: usize,
    now: Instant,
) -> Option<&'a mut Pair> {
    let own = |role| {
        let budget: &RoleBudget = budgets.role(role);
        [budget.writes, budget.bytes]
    };
    let rates = own(identity.role);
    if !identities.contains_key(identity) {
        if identities.len() >= max_tracked {
            // Each entry refills at its own role's rates: a full pair is as good as none.
            identities.retain(|other, pair| {
                let rates = own(other.role);
                refill(pair, rates, now);
                pair.iter()
                    .zip(rates)
                    .any(|(bucket, rate)| bucket.tokens < rate.burst)
            });
        }
        if identities.len() >= max_tracked {
            return None;
        }
        let pair = [Bucket::full(rates[0], now), Bucket::full(rates[1], now)];
        identities.insert(identity.clone(), pair);
    }
    let pair = identities.get_mut(identity)?;
    refill(pair, rates, now);
    Some(pair)
}

/// Percent of the store's quota only the admin, nodes and gateways may fill: past the rest,
/// vm-agents' writes are refused, so VMs together cannot take the room the roles that keep
/// the system running need for their status (a store that counts its size only: embedded).
pub const SYSTEM_RESERVE_PERCENT: u64 = 10;

/// 507 when a vm-agent's write of `bytes` would reach into the reserve of a store `usage`.
pub fn reserve_refusal(role: Role, usage: Option<StoreUsage>, bytes: usize) -> Option<StatusError> {
    let usage = usage.filter(|_| role == Role::VmAgent)?;
    let reserve = usage.quota_bytes / 100 * SYSTEM_RESERVE_PERCENT;
    let allowed = usage.quota_bytes - reserve;
    if usage.used_bytes.saturating_add(bytes as u64) <= allowed {
        return None;
    }
    Some(StatusError::new(
        StatusReason::StorageQuotaExceeded,
        format!(
            "the store is nearly full: {} of its {}-byte quota are used and the last \
             {SYSTEM_RESERVE_PERCENT}% ({reserve} bytes) is kept for the admin, nodes and \
             gateways; an admin must delete objects (compaction then frees them) or raise \
             --store-quota-bytes",
            usage.used_bytes, usage.quota_bytes
        ),
    ))
}

/// Labels of a refused write: the caller's role (a fixed enum) and why.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub role: &'static str,
    /// `identity_budget`, `role_budget`, `storage_quota`, `storage_reserve` or `object_size`.
    pub reason: &'static str,
}

/// The store's size or quota, read from the store when scraped (no I/O: see
/// [`Store::usage`]); a store that does not count (etcd) has neither gauge's sample.
#[derive(Clone)]
pub struct StoreGauge {
    store: std::sync::Arc<dyn Store>,
    quota: bool,
}

impl std::fmt::Debug for StoreGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreGauge")
            .field("quota", &self.quota)
            .finish()
    }
}

impl EncodeMetric for StoreGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        match self.store.usage() {
            Some(usage) => {
                let bytes = if self.quota {
                    usage.quota_bytes
                } else {
                    usage.used_bytes
                };
                encoder.encode_gauge(&(i64::try_from(bytes).unwrap_or(i64::MAX)))
            }
            None => Ok(()),
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.store.usage().is_none()
    }
}

/// The write side's metrics.
#[derive(Debug, Clone, Default)]
pub struct WriteMetrics {
    pub refused: Family<RefusalLabels, Counter>,
}

impl WriteMetrics {
    /// Registers `sluice_controlplane_write_refusals`, `_store_bytes` and `_store_quota_bytes`.
    pub fn register(
        registry: &mut prometheus_client::registry::Registry,
        store: std::sync::Arc<dyn Store>,
    ) -> Self {
        let metrics = Self::default();
        let prefixed = registry.sub_registry_with_prefix("sluice_controlplane");
        prefixed.register(
            "write_refusals",
            "Writes refused before the store, by role and reason (identity_budget, \
             role_budget: 429; storage_quota, storage_reserve: 507; object_size: 413)",
            metrics.refused.clone(),
        );
        let size = StoreGauge {
            store: store.clone(),
            quota: false,
        };
        prefixed.register(
            "store_bytes",
            "Bytes the store holds: objects and the history kept until compaction",
            size,
        );
        let quota = StoreGauge { store, quota: true };
        prefixed.register(
            "store_quota_bytes",
            "The store's quota: past it creates and updates get 507",
            quota,
        );
        metrics
    }

    pub fn refused(&self, role: Role, reason: &'static str) {
        self.refused
            .get_or_create(&RefusalLabels {
                role: role.as_str(),
                reason,
            })
            .inc();
    }
}

#[cfg(test)]
#[path = "write_budget_tests.rs"]
mod tests;
