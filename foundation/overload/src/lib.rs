//! Overload protection, as Envoy's overload manager does it.
//!
//! A monitor thread samples the process's resources (resident memory against a memory limit,
//! open file descriptors against `RLIMIT_NOFILE`) a few times a second, runs them through a
//! state machine with one threshold per action and a recovery margin (so the state does not flap
//! at the edge), and publishes the active actions in one atomic. Accept loops and request
//! handlers read that atomic with one relaxed load: no lock, no allocation per request.
//!
//! The state is process-wide on purpose: memory and descriptors are the process's, so every
//! role in it (gateway, tunnel, control plane) must see the same verdict.

mod machine;
mod metrics;
mod monitor;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub use machine::{Machine, Transition};
pub use metrics::OverloadCollector;
pub use monitor::{cgroup_memory_limit, resolve_memory_limit, sample, spawn_monitor, Sample};

/// What the process does under pressure, mildest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Data and API listeners accept no new connections (they wait in the kernel's backlog);
    /// connections already accepted go on.
    StopAccepting,
    /// New requests are answered "unavailable, retry later"; requests already admitted run to
    /// completion, watches and streams included.
    ShedNewRequests,
}

impl Action {
    pub const ALL: [Action; 2] = [Action::StopAccepting, Action::ShedNewRequests];

    pub fn label(self) -> &'static str {
        match self {
            Action::StopAccepting => "stop_accepting",
            Action::ShedNewRequests => "shed_new_requests",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    fn bit(self) -> u8 {
        1 << self.index()
    }
}

/// The role whose request was shed (the `role` label: a fixed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Gateway,
    Tunnel,
    Apiserver,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Gateway, Role::Tunnel, Role::Apiserver];

    pub fn label(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Tunnel => "tunnel",
            Role::Apiserver => "apiserver",
        }
    }
}

/// Seconds a shed client is told to wait (`Retry-After`): about one recovery of the monitor,
/// short enough that a client-go retry lands once pressure has fallen.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// Bit `Action::index` set while that action is active.
static ACTIVE: AtomicU8 = AtomicU8::new(0);
static SHED: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
/// [action][to]: to 0 = inactive, 1 = active.
static TRANSITIONS: [[AtomicU64; 2]; 2] = [
    [AtomicU64::new(0), AtomicU64::new(0)],
    [AtomicU64::new(0), AtomicU64::new(0)],
];

/// Whether `action` is active now (one relaxed load).
#[inline]
pub fn is_active(action: Action) -> bool {
    ACTIVE.load(Ordering::Relaxed) & action.bit() != 0
}

/// Whether listeners should leave new connections in the backlog now.
#[inline]
pub fn stop_accepting() -> bool {
    is_active(Action::StopAccepting)
}

/// Whether new requests should be refused now.
#[inline]
pub fn shedding() -> bool {
    is_active(Action::ShedNewRequests)
}

/// Counts one request `role` refused because the process is overloaded.
#[inline]
pub fn count_shed(role: Role) {
    SHED[role as usize].fetch_add(1, Ordering::Relaxed);
}

pub fn shed_total(role: Role) -> u64 {
    SHED[role as usize].load(Ordering::Relaxed)
}

pub fn transitions_total(action: Action, to_active: bool) -> u64 {
    TRANSITIONS[action.index()][usize::from(to_active)].load(Ordering::Relaxed)
}

/// Publishes a transition the machine decided.
fn publish(transition: Transition) {
    let bit = transition.action.bit();
    if transition.active {
        ACTIVE.fetch_or(bit, Ordering::Relaxed);
    } else {
        ACTIVE.fetch_and(!bit, Ordering::Relaxed);
    }
    TRANSITIONS[transition.action.index()][usize::from(transition.active)]
        .fetch_add(1, Ordering::Relaxed);
}
