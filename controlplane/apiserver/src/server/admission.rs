//! Shares of a pool (open watches, requests in flight) per role and per identity.
//!
//! A global limit alone lets one principal take every slot: one VM's token opening watches
//! until nodes and gateways get 429 and stop hearing revocations. So, as Kubernetes' API
//! Priority and Fairness reserves seats per priority level, each role has a reservation no other
//! role can use, the rest of the pool is shared first come, and one identity never holds more
//! than its role's per-identity cap. Reservations plus the shared remainder equal the pool, so
//! the global limit still holds.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

use sluice_apimachinery::{StatusDetails, StatusError, StatusReason};

use crate::auth::{Identity, Role};

/// Which pool a share is of: a metric label and the subject of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetKind {
    Watches,
    Requests,
    /// Authenticated connections (a connection counts for the first identity it carries).
    Connections,
}

impl BudgetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKind::Watches => "watches",
            BudgetKind::Requests => "requests_in_flight",
            BudgetKind::Connections => "connections",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            BudgetKind::Watches => "open watches",
            BudgetKind::Requests => "requests in flight",
            BudgetKind::Connections => "open connections",
        }
    }

    /// A watch slot frees when some watch ends (minutes); a request slot within a second; a
    /// connection when the client closes one of its own (or the idle timeout does).
    fn retry_after_seconds(self) -> u32 {
        match self {
            BudgetKind::Watches | BudgetKind::Connections => 10,
            BudgetKind::Requests => 1,
        }
    }
}

/// One role's part of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleShare {
    /// Slots only this role may use.
    pub reserved: usize,
    /// Most slots one identity of this role holds at once (reserved and shared together).
    pub per_identity: usize,
}

/// A pool's size and its roles' shares, indexed as [`Role::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLimits {
    pub total: usize,
    pub shares: [RoleShare; 4],
}

impl PoolLimits {
    pub fn share(&self, role: Role) -> RoleShare {
        self.shares[role_index(role)]
    }

    pub fn share_mut(&mut self, role: Role) -> &mut RoleShare {
        &mut self.shares[role_index(role)]
    }

    /// The same pool at `total`, each reservation scaled to keep its part of the pool (so a
    /// smaller pool keeps the default proportions instead of failing [`Self::check`]).
    pub fn resized(&self, total: usize) -> PoolLimits {
        let scale = |reserved: usize| {
            let scaled = reserved as u128 * total as u128 / self.total.max(1) as u128;
            usize::try_from(scaled).unwrap_or(usize::MAX)
        };
        PoolLimits {
            total,
            shares: self.shares.map(|share| RoleShare {
                reserved: scale(share.reserved),
                per_identity: share.per_identity,
            }),
        }
    }

    /// What is left after the reservations: any role may use it.
    pub fn shared(&self) -> usize {
        self.total.saturating_sub(self.reserved())
    }

    fn reserved(&self) -> usize {
        self.shares.iter().map(|share| share.reserved).sum()
    }

    /// Why these limits cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.reserved() > self.total {
            return Err(format!(
                "the roles' reservations ({}) add up to more than the total ({})",
                self.reserved(),
                self.total
            ));
        }
        match Role::ALL
            .into_iter()
            .find(|role| self.share(*role).per_identity == 0)
        {
            Some(role) => Err(format!("the per-identity cap of role {role} is 0")),
            None => Ok(()),
        }
    }
}

/// `role`'s position in [`Role::ALL`]: the index of its entry in every per-role table (the
/// shares here, the write budgets) without a search.
pub(super) fn role_index(role: Role) -> usize {
    match role {
        Role::Admin => 0,
        Role::Gateway => 1,
        Role::Node => 2,
        Role::VmAgent => 3,
    }
}

/// Which share was used up; answered 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Exhausted {
    #[error("too many {}: {user} already holds {cap}, the most one {role} identity may hold", .kind.noun())]
    Identity {
        kind: BudgetKind,
        role: Role,
        /// The identity's user name: a checked DNS name, never free client text.
        user: String,
        cap: usize,
    },
    #[error("too many {}: the {reserved} reserved for role {role} and the {shared} shared by all roles are in use", .kind.noun())]
    Role {
        kind: BudgetKind,
        role: Role,
        reserved: usize,
        shared: usize,
    },
}

impl Exhausted {
    pub fn kind(&self) -> BudgetKind {
        match self {
            Exhausted::Identity { kind, .. } | Exhausted::Role { kind, .. } => *kind,
        }
    }

    /// The budget a metric names: `identity` or `role`.
    pub fn budget(&self) -> &'static str {
        match self {
            Exhausted::Identity { .. } => "identity",
            Exhausted::Role { .. } => "role",
        }
    }

    /// A wait frees a slot, so the client may retry.
    pub fn retryable(&self) -> bool {
        true
    }

    pub fn status(&self) -> StatusError {
        StatusError {
            details: Some(Box::new(StatusDetails {
                retry_after_seconds: Some(self.kind().retry_after_seconds()),
                ..StatusDetails::default()
            })),
            ..StatusError::new(StatusReason::TooManyRequests, self.to_string())
        }
    }
}

/// The slots in use, per role and per identity.
#[derive(Debug, Default)]
struct Usage {
    per_role: [usize; 4],
    /// Keyed by a keyed hash of the identity: an identity's first slot allocates nothing after
    /// the map has grown to the number of identities in use.
    per_identity: HashMap<(Role, u64), usize>,
}

/// One pool's bookkeeping.
#[derive(Debug)]
pub struct Pool {
    kind: BudgetKind,
    limits: PoolLimits,
    hasher: std::hash::RandomState,
    usage: Mutex<Usage>,
}

impl Pool {
    pub fn new(kind: BudgetKind, limits: PoolLimits) -> Arc<Self> {
        Arc::new(Self {
            kind,
            limits,
            hasher: std::hash::RandomState::new(),
            usage: Mutex::default(),
        })
    }

    pub fn limits(&self) -> &PoolLimits {
        &self.limits
    }

    /// A slot for `identity`, held until the returned guard drops.
    pub fn acquire(self: &Arc<Self>, identity: &Identity) -> Result<Slot, Exhausted> {
        let role = identity.role;
        let key = (role, self.hasher.hash_one(&identity.subject));
        let share = self.limits.share(role);
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let held = usage.per_identity.get(&key).copied().unwrap_or(0);
        if held >= share.per_identity {
            return Err(Exhausted::Identity {
                kind: self.kind,
                role,
                user: identity.user_name(),
                cap: share.per_identity,
            });
        }
        let within_reservation = usage.per_role[role_index(role)] < share.reserved;
        if !within_reservation && self.borrowed(&usage) >= self.limits.shared() {
            return Err(Exhausted::Role {
                kind: self.kind,
                role,
                reserved: share.reserved,
                shared: self.limits.shared(),
            });
        }
        usage.per_role[role_index(role)] += 1;
        *usage.per_identity.entry(key).or_insert(0) += 1;
        Ok(Slot {
            pool: self.clone(),
            key,
        })
    }

    /// Slots the roles use beyond their reservations: the shared part in use.
    fn borrowed(&self, usage: &Usage) -> usize {
        Role::ALL
            .into_iter()
            .map(|role| {
                usage.per_role[role_index(role)].saturating_sub(self.limits.share(role).reserved)
            })
            .sum()
    }

    /// Slots in use by `role` now.
    pub fn in_use(&self, role: Role) -> usize {
        self.usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .per_role[role_index(role)]
    }

    fn release(&self, key: (Role, u64)) {
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let index = role_index(key.0);
        usage.per_role[index] = usage.per_role[index].saturating_sub(1);
        if let Some(held) = usage.per_identity.get_mut(&key) {
            *held -= 1;
            if *held == 0 {
                usage.per_identity.remove(&key);
            }
        }
    }
}

/// One slot of a pool, given back however its holder ends (a panicking task included).
#[derive(Debug)]
pub struct Slot {
    pool: Arc<Pool>,
    key: (Role, u64),
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.release(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> PoolLimits {
        let share = |reserved, per_identity| RoleShare {
            reserved,
            per_identity,
        };
        // admin, gateway, node, vm-agent; 10 shared.
        PoolLimits {
            total: 20,
            shares: [share(1, 5), share(3, 4), share(3, 4), share(3, 4)],
        }
    }

    fn vm(name: &str) -> Identity {
        Identity::new(Role::VmAgent, name).unwrap()
    }

    #[test]
    fn role_index_is_the_position_in_role_all() {
        for (index, role) in Role::ALL.into_iter().enumerate() {
            assert_eq!(role_index(role), index, "{role}");
        }
    }

    #[test]
    fn one_identity_stops_at_its_cap_and_gets_its_slot_back() {
        let pool = Pool::new(BudgetKind::Watches, limits());
        let mut slots: Vec<Slot> = (0..4).map(|_| pool.acquire(&vm("vm-1")).unwrap()).collect();
        let refused = pool.acquire(&vm("vm-1")).unwrap_err();
        assert_eq!(refused.budget(), "identity");
        let status = refused.status();
        assert_eq!((status.code, status.retryable()), (429, true));
        assert!(
            status.message.contains("sluice:vm-agent:vm-1"),
            "{status:?}"
        );
        assert!(status.message.contains("open watches"), "{status:?}");
        assert_eq!(
            status.details.unwrap().retry_after_seconds,
            Some(BudgetKind::Watches.retry_after_seconds())
        );
        // Another VM is not affected by vm-1's cap.
        assert!(pool.acquire(&vm("vm-2")).is_ok());
        slots.pop();
        assert!(pool.acquire(&vm("vm-1")).is_ok());
    }

    #[test]
    fn a_role_never_takes_another_roles_reservation() {
        let pool = Pool::new(BudgetKind::Requests, limits());
        let mut held = Vec::new();
        // VM agents take their 3 reserved and all 10 shared, four per VM.
        for index in 0.. {
            match pool.acquire(&vm(&format!("vm-{}", index / 4))) {
                Ok(slot) => held.push(slot),
                Err(refused) => {
                    assert_eq!(refused.budget(), "role", "{refused}");
                    break;
                }
            }
        }
        assert_eq!(held.len(), 13);
        assert_eq!(pool.in_use(Role::VmAgent), 13);
        for role in [Role::Admin, Role::Gateway, Role::Node] {
            let reserved = limits().share(role).reserved;
            for index in 0..reserved {
                let identity = Identity::new(role, &format!("{role}-{index}")).unwrap();
                held.push(pool.acquire(&identity).expect("its reservation is free"));
            }
            let one_more = Identity::new(role, "one-more").unwrap();
            assert!(pool.acquire(&one_more).is_err(), "{role}: shared is gone");
        }
        assert_eq!(held.len(), 20, "reservations plus shared is the pool");
        // A VM slot returned to the shared part serves whichever role asks next.
        held.truncate(12);
        assert!(pool
            .acquire(&Identity::new(Role::Node, "n-9").unwrap())
            .is_ok());
    }

    #[test]
    fn released_identities_leave_no_entry_behind() {
        let pool = Pool::new(BudgetKind::Watches, limits());
        for index in 0..100 {
            drop(pool.acquire(&vm(&format!("vm-{index}"))).unwrap());
        }
        let usage = pool.usage.lock().unwrap();
        assert!(usage.per_identity.is_empty());
        assert_eq!(usage.per_role, [0; 4]);
    }

    #[test]
    fn a_resized_pool_keeps_its_proportions() {
        let small = limits().resized(10);
        assert_eq!(small.share(Role::Gateway).reserved, 1);
        assert_eq!(small.share(Role::Gateway).per_identity, 4);
        assert!(small.check().is_ok());
        assert_eq!(limits().resized(40).shared(), 20);
    }

    #[test]
    fn impossible_limits_are_named() {
        let mut too_big = limits();
        too_big.total = 5;
        assert!(too_big.check().unwrap_err().contains("reservations"));
        let mut zero = limits();
        zero.share_mut(Role::Node).per_identity = 0;
        assert!(zero.check().unwrap_err().contains("node"));
        assert!(limits().check().is_ok());
    }
}
