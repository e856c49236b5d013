//! One etcd client per member, and which member requests go to.
//!
//! etcd-client's own balancer spreads requests over every endpoint and keeps choosing a dead
//! one (etcd-client issue 39), so each member gets a client of its own and the store picks:
//! every request goes to the preferred member until a request there fails for a reason of the
//! member's (see [`super::retry::transient`]); then the next member becomes preferred. A dead
//! member so costs the requests that were on it when it died, not a share of every later one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::{ConnectOptions, KvClient, WatchClient};

use crate::error::StoreError;

/// The largest response accepted: a list without a limit or a watch catching up may carry
/// many values of up to etcd's request size each (kube-apiserver lifts gRPC's 4 MiB too).
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

/// One member's clients.
pub(crate) struct Member {
    pub(crate) endpoint: String,
    pub(crate) kv: KvClient,
    pub(crate) watch: WatchClient,
}

/// The cluster's members and the preferred one.
pub(crate) struct Members {
    members: Vec<Member>,
    preferred: AtomicUsize,
    pub(crate) stats: Arc<EtcdStats>,
}

impl Members {
    /// A client per endpoint; each connects when first used, so a member that is down at
    /// start-up is only skipped.
    pub(crate) async fn connect(
        endpoints: &[String],
        options: &ConnectOptions,
    ) -> Result<Members, StoreError> {
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let client = etcd_client::Client::connect([endpoint], Some(options.clone()))
                .await
                .map_err(StoreError::unavailable)?;
            members.push(Member {
                endpoint: endpoint.clone(),
                kv: client
                    .kv_client()
                    .max_decoding_message_size(MAX_RESPONSE_BYTES),
                watch: client
                    .watch_client()
                    .max_decoding_message_size(MAX_RESPONSE_BYTES),
            });
        }
        if members.is_empty() {
            return Err(StoreError::unavailable("no etcd endpoint is configured"));
        }
        Ok(Members {
            members,
            preferred: AtomicUsize::new(0),
            stats: Arc::new(EtcdStats::default()),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The member the next request goes to, with its index for [`Members::failed`].
    pub(crate) fn pick(&self) -> (usize, &Member) {
        let index = self.preferred.load(Ordering::Acquire) % self.members.len();
        (index, &self.members[index])
    }

    /// A request on member `index` failed for a reason of the member's: prefer the next one,
    /// unless a concurrent request already moved on.
    pub(crate) fn failed(&self, index: usize) {
        let next = next_member(index, self.members.len());
        if next == index {
            return;
        }
        let moved = self
            .preferred
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.stats.failovers.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                from = %self.members[index].endpoint,
                to = %self.members[next].endpoint,
                "etcd: a request failed on a member; failing over to the next"
            );
        }
    }
}

/// The member after `index` of `count`, in a ring.
fn next_member(index: usize, count: usize) -> usize {
    if count == 0 {
        0
    } else {
        (index + 1) % count
    }
}

/// What an etcd request was for, as counted in [`EtcdStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdOp {
    /// A get, a list, a probe of a revision.
    Read,
    /// A create, update, delete or compaction.
    Write,
    /// Opening or resuming a watch.
    Watch,
}

impl EtcdOp {
    /// Every operation, for exporting each counter.
    pub const ALL: [EtcdOp; 3] = [EtcdOp::Read, EtcdOp::Write, EtcdOp::Watch];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            EtcdOp::Read => "read",
            EtcdOp::Write => "write",
            EtcdOp::Watch => "watch",
        }
    }
}

/// Counters of the etcd store's failovers and retries, for the metrics.
#[derive(Debug, Default)]
pub struct EtcdStats {
    failovers: AtomicU64,
    retries: [AtomicU64; 3],
    applied_before: AtomicU64,
}

impl EtcdStats {
    /// How often requests moved from a failing member to the next.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Attempts of `op` made again after a transient failure.
    pub fn retries(&self, op: EtcdOp) -> u64 {
        self.retries[op as usize].load(Ordering::Relaxed)
    }

    /// Writes whose attempt's outcome was unknown and which a later attempt found applied
    /// (reported as done, not repeated).
    pub fn found_applied(&self) -> u64 {
        self.applied_before.load(Ordering::Relaxed)
    }

    pub(crate) fn retried(&self, op: EtcdOp) {
        self.retries[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn applied(&self) {
        self.applied_before.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_form_a_ring() {
        assert_eq!(next_member(0, 3), 1);
        assert_eq!(next_member(2, 3), 0);
        assert_eq!(next_member(0, 1), 0);
        assert_eq!(next_member(0, 0), 0);
    }

    #[test]
    fn a_failure_moves_the_preference_once_whoever_reports_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|error| panic!("{error}"));
        let endpoints: Vec<String> = (1..=3)
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect();
        // Clients connect lazily: no member needs to run.
        let members = runtime
            .block_on(Members::connect(&endpoints, &ConnectOptions::new()))
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(members.pick().0, 0);
        members.failed(0);
        // A second request that failed on member 0 too does not skip member 1.
        members.failed(0);
        assert_eq!(members.pick().0, 1);
        members.failed(1);
        members.failed(2);
        assert_eq!(members.pick().0, 0);
        assert_eq!(members.stats.failovers(), 3);
        members.stats.retried(EtcdOp::Write);
        assert_eq!(members.stats.retries(EtcdOp::Write), 1);
        assert_eq!(members.stats.retries(EtcdOp::Read), 0);
    }
}
