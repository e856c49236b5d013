//! When a failed etcd request is tried again, and how long each try may take: pure logic,
//! apart from the I/O in [`super::Shared::run`].
//!
//! A request has one deadline (the store's request timeout). Within it, each attempt gets a
//! short limit ([`FIRST_ATTEMPT`], doubled after each attempt that ran out), so a member that
//! died without closing its connections costs about a second, not the whole deadline. An
//! attempt that fails for a reason another member may not share (the connection, a timeout,
//! no leader) is tried again on the next member; the first pass over the members goes
//! without pause, later ones back off, so an election is waited out rather than hammered.

use std::time::{Duration, Instant};

/// The first attempt's limit: far above a healthy member's answer time (milliseconds), small
/// next to the request's deadline.
pub(crate) const FIRST_ATTEMPT: Duration = Duration::from_secs(1);
/// The pause after a full pass over the members failed, doubling up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Whether `error` may not recur on another member or a moment later: decided on the error's
/// type and gRPC code, never its message. Every such failure leaves a write's outcome unknown
/// (the request may have reached etcd before the connection or the wait broke).
pub(crate) fn transient(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => transient_code(status.code() as i32),
        _ => false,
    }
}

/// gRPC status codes (google.rpc.Code, fixed by the gRPC specification) that etcd and the
/// transport use for a member that cannot answer now: etcd's "no leader", "leader changed"
/// and "request timed out" (Unavailable), a stream broken with its connection (Cancelled,
/// Unknown), an expired deadline, an aborted stream. Refusals (a compacted or future revision,
/// a too large request, NOSPACE, permissions) have other codes and are final.
fn transient_code(code: i32) -> bool {
    const CANCELLED: i32 = 1;
    const UNKNOWN: i32 = 2;
    const DEADLINE_EXCEEDED: i32 = 4;
    const ABORTED: i32 = 10;
    const UNAVAILABLE: i32 = 14;
    matches!(
        code,
        CANCELLED | UNKNOWN | DEADLINE_EXCEEDED | ABORTED | UNAVAILABLE
    )
}

/// One request's attempts: how long the next may take and whether another fits the deadline.
#[derive(Debug)]
pub(crate) struct Attempts {
    deadline: Instant,
    /// The next attempt's limit, before the deadline cuts it.
    limit: Duration,
    /// Attempts that failed so far.
    failed: u32,
    /// Members to try before pausing.
    members: u32,
}

impl Attempts {
    /// Attempts of a request started at `now` with `timeout` in all, over `members` members.
    pub(crate) fn new(now: Instant, timeout: Duration, members: usize) -> Self {
        Attempts {
            deadline: now + timeout,
            limit: FIRST_ATTEMPT.min(timeout),
            failed: 0,
            members: u32::try_from(members.max(1)).unwrap_or(u32::MAX),
        }
    }

    /// How long the attempt starting at `now` may take; `None` once the deadline has passed.
    pub(crate) fn limit(&self, now: Instant) -> Option<Duration> {
        let left = self.deadline.checked_duration_since(now)?;
        (!left.is_zero()).then(|| self.limit.min(left))
    }

    /// Records a failed attempt (`timed_out`: it ran out of its limit) and returns the pause
    /// before the next, or `None` when no attempt fits before the deadline any more.
    pub(crate) fn failed(&mut self, now: Instant, timed_out: bool) -> Option<Duration> {
        self.failed += 1;
        if timed_out {
            // The member may just be slow (a large range, a busy disk): give the next more.
            self.limit = self.limit.saturating_mul(2);
        }
        let pause = match self.failed.checked_sub(self.members) {
            None => Duration::ZERO,
            Some(passes) => FIRST_PAUSE
                .saturating_mul(1u32 << passes.min(4))
                .min(MAX_PAUSE),
        };
        let left = self.deadline.checked_duration_since(now)?;
        (pause < left).then_some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_leader_failures_are_transient_refusals_are_not() {
        // Cancelled, Unknown, DeadlineExceeded, Aborted, Unavailable.
        for code in [1, 2, 4, 10, 14] {
            assert!(transient_code(code), "{code}");
        }
        // OK, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted (NOSPACE),
        // FailedPrecondition, OutOfRange (compacted, future revision), Unauthenticated.
        for code in [0, 3, 5, 7, 8, 9, 11, 16] {
            assert!(!transient_code(code), "{code}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(transient(&etcd_client::Error::IoError(io)));
        assert!(!transient(&etcd_client::Error::InvalidArgs("x".into())));
        assert!(!transient(&etcd_client::Error::WatchError("x".into())));
    }

    #[test]
    fn the_first_pass_over_the_members_goes_without_pause_then_backs_off() {
        let start = Instant::now();
        let mut attempts = Attempts::new(start, Duration::from_secs(10), 3);
        assert_eq!(attempts.limit(start), Some(FIRST_ATTEMPT));
        let pauses: Vec<_> = (0..7)
            .map(|_| attempts.failed(start, false).unwrap().as_millis())
            .collect();
        assert_eq!(pauses, [0, 0, 50, 100, 200, 400, 500]);
        assert_eq!(attempts.limit(start), Some(FIRST_ATTEMPT));
    }

    #[test]
    fn a_timed_out_attempt_doubles_the_next_limit_within_the_deadline() {
        let start = Instant::now();
        let mut attempts = Attempts::new(start, Duration::from_secs(5), 3);
        attempts.failed(start, true).unwrap();
        assert_eq!(attempts.limit(start), Some(Duration::from_secs(2)));
        attempts.failed(start, true).unwrap();
        assert_eq!(attempts.limit(start), Some(Duration::from_secs(4)));
        let late = start + Duration::from_millis(4500);
        assert_eq!(attempts.limit(late), Some(Duration::from_millis(500)));
        attempts.failed(late, true).unwrap();
        assert_eq!(attempts.limit(late), Some(Duration::from_millis(500)));
    }

    #[test]
    fn no_attempt_after_the_deadline_and_none_shorter_than_the_request() {
        let start = Instant::now();
        let mut attempts = Attempts::new(start, Duration::from_millis(300), 1);
        assert_eq!(attempts.limit(start), Some(Duration::from_millis(300)));
        let end = start + Duration::from_millis(300);
        assert_eq!(attempts.limit(end), None);
        assert_eq!(attempts.failed(end, false), None);
        // A pause that would end past the deadline is no retry either.
        let near = start + Duration::from_millis(280);
        assert_eq!(attempts.failed(near, false), None);
    }
}
