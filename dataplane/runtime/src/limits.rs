//! What the runtime enforces for every listener before a handler sees a connection: a cap on
//! connections per source IP and a retirement age, and the reasons a listener closes a
//! connection on a limit (counted in `sluice_connections_closed_total{listener, reason}`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a listener closed a connection on one of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// TLS handshake or HTTP/2 preface not finished within `handshake_timeout`.
    HandshakeTimeout,
    /// No complete first request head within `header_timeout`.
    HeaderTimeout,
    /// No request in flight for `idle_timeout`.
    Idle,
    /// A keepalive PING went unanswered for `keepalive_timeout`.
    KeepaliveTimeout,
    /// Asked to go away at `max_connection_age`.
    MaxAge,
    /// Refused at accept: the source IP already held `max_connections_per_ip`.
    PerIpLimit,
}

impl CloseReason {
    pub const ALL: [CloseReason; 6] = [
        CloseReason::HandshakeTimeout,
        CloseReason::HeaderTimeout,
        CloseReason::Idle,
        CloseReason::KeepaliveTimeout,
        CloseReason::MaxAge,
        CloseReason::PerIpLimit,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::Idle => "idle",
            CloseReason::KeepaliveTimeout => "keepalive_timeout",
            CloseReason::MaxAge => "max_age",
            CloseReason::PerIpLimit => "per_ip_limit",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Open connections per source IP on one listener, shared by its workers. Touched once at
/// accept and once at close (never per request); entries exist only for IPs with open
/// connections, so the map is bounded by the connections themselves.
#[derive(Debug, Default)]
pub(crate) struct PeerCounts {
    open: Mutex<HashMap<IpAddr, u32>>,
}

impl PeerCounts {
    /// Takes a slot for `ip` unless it already holds `cap` connections.
    pub(crate) fn enter(self: &Arc<Self>, ip: IpAddr, cap: u32) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= cap {
            if *count == 0 {
                open.remove(&ip);
            }
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One connection's place in its IP's count; released when the connection closes.
#[derive(Debug)]
pub(crate) struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The age at which one connection is retired: `max_age` spread by up to a tenth either way
/// (`spread` in 0..=1000 picks the point), so connections opened together do not all go away,
/// and reconnect, together.
pub(crate) fn retirement_age(max_age: Duration, spread: u32) -> Duration {
    let tenth = max_age / 10;
    let offset = tenth.mul_f64(f64::from(spread.min(1000)) / 500.0);
    (max_age - tenth) + offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_gets_its_cap_and_slots_come_back_when_connections_close() {
        let counts = Arc::new(PeerCounts::default());
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let first = counts.enter(ip, 2).expect("first");
        let second = counts.enter(ip, 2).expect("second");
        assert!(
            counts.enter(ip, 2).is_none(),
            "a third connection is over the cap"
        );
        assert!(
            counts.enter(other, 2).is_some(),
            "other IPs are not affected"
        );
        drop(first);
        let third = counts.enter(ip, 2).expect("a slot came back");
        drop((second, third));
        assert_eq!(counts.tracked(), 0, "closed IPs leave no entry behind");
        assert!(counts.enter(ip, 0).is_none());
        assert_eq!(counts.tracked(), 0, "a refused IP leaves no entry behind");
    }

    #[test]
    fn retirement_spreads_a_tenth_either_way() {
        let age = Duration::from_secs(1000);
        assert_eq!(retirement_age(age, 0), Duration::from_secs(900));
        assert_eq!(retirement_age(age, 500), Duration::from_secs(1000));
        assert_eq!(retirement_age(age, 1000), Duration::from_secs(1100));
        assert_eq!(retirement_age(age, 5000), Duration::from_secs(1100));
    }

    #[test]
    fn every_reason_has_its_own_slot_and_label() {
        for (index, reason) in CloseReason::ALL.iter().enumerate() {
            assert_eq!(reason.index(), index);
        }
        let labels: std::collections::HashSet<_> =
            CloseReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), CloseReason::ALL.len());
    }
}
