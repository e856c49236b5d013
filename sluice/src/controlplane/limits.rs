//! The `sluice controlplane` flags for the API server's shared resources: connections and
//! their timeouts, and the pools of watches and requests in flight with each role's share.
//! A flag not given keeps [`ServerLimits::default`] (docs/CONFIG.md explains each default).

use std::time::Duration;

use sluice_apiserver::auth::Role;
use sluice_apiserver::server::admission::RoleShare;
use sluice_apiserver::server::ServerLimits;

/// One role's share of a pool: `ROLE=RESERVED/PER_IDENTITY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareArg {
    pub role: Role,
    pub share: RoleShare,
}

fn share(text: &str) -> Result<ShareArg, String> {
    let expected = "expected ROLE=RESERVED/PER_IDENTITY, e.g. vm-agent=2000/16";
    let (role, numbers) = text.split_once('=').ok_or_else(|| expected.to_string())?;
    let role: Role = role
        .parse()
        .map_err(|error: sluice_apiserver::auth::AuthError| error.to_string())?;
    let (reserved, per_identity) = numbers
        .split_once('/')
        .ok_or_else(|| expected.to_string())?;
    let number = |text: &str, what: &str| {
        text.parse::<usize>()
            .map_err(|_| format!("{what} {text:?} is not a whole number ({expected})"))
    };
    Ok(ShareArg {
        role,
        share: RoleShare {
            reserved: number(reserved, "RESERVED")?,
            per_identity: number(per_identity, "PER_IDENTITY")?,
        },
    })
}

/// The flags; see docs/CONFIG.md ("Control plane limits") for the defaults and why.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LimitArgs {
    /// Open connections at once (default 4096).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Of those, connections no request has authenticated on yet (default 1024); past it the
    /// oldest of them is closed for a new one.
    #[arg(long, value_name = "N")]
    pub max_unauthenticated_connections: Option<usize>,
    /// Unauthenticated connections of one source address, IPv4 or IPv6 /64 (default 64).
    #[arg(long, value_name = "N")]
    pub max_unauthenticated_connections_per_address: Option<usize>,
    /// A role's share of the authenticated connections, ROLE=RESERVED/PER_IDENTITY
    /// (repeatable; defaults: admin=64/256, gateway=512/128, node=512/128, vm-agent=1024/32).
    #[arg(long, value_name = "ROLE=RESERVED/PER_IDENTITY", value_parser = share)]
    pub connection_share: Vec<ShareArg>,
    /// Time for the TLS handshake (default 10s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Option<Duration>,
    /// A connection with no authenticated request is closed after this long idle (default 10s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub first_request_timeout: Option<Duration>,
    /// An authenticated connection with nothing in flight is closed after this long (default 120s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Time to answer any request; a watch's events stream after it (default 60s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub request_timeout: Option<Duration>,
    /// HTTP/2 PING interval (default 30s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Option<Duration>,
    /// An unanswered PING closes the connection after this long (default 20s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Option<Duration>,
    /// A watch gets a BOOKMARK for progress alone at most this often (default 60s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub watch_bookmark_interval: Option<Duration>,
    /// Open watches at once, all roles together (default 10000).
    #[arg(long, value_name = "N")]
    pub max_watches: Option<usize>,
    /// A role's share of the watches, ROLE=RESERVED/PER_IDENTITY (repeatable; defaults:
    /// admin=200/1000, gateway=1000/64, node=1000/64, vm-agent=2000/16).
    #[arg(long, value_name = "ROLE=RESERVED/PER_IDENTITY", value_parser = share)]
    pub watch_share: Vec<ShareArg>,
    /// Requests answered at once, all roles together (default 400).
    #[arg(long, value_name = "N")]
    pub max_requests_in_flight: Option<usize>,
    /// A role's share of the requests in flight, ROLE=RESERVED/PER_IDENTITY (repeatable;
    /// defaults: admin=40/100, gateway=60/20, node=60/20, vm-agent=60/8).
    #[arg(long, value_name = "ROLE=RESERVED/PER_IDENTITY", value_parser = share)]
    pub request_share: Vec<ShareArg>,
}

impl LimitArgs {
    /// The server's limits: the defaults with these flags applied, checked together.
    pub fn limits(&self) -> Result<ServerLimits, String> {
        let mut limits = ServerLimits::default();
        let set = |target: &mut usize, value: Option<usize>| {
            if let Some(value) = value {
                *target = value;
            }
        };
        set(&mut limits.max_connections, self.max_connections);
        set(
            &mut limits.max_unauthenticated_connections,
            self.max_unauthenticated_connections,
        );
        set(
            &mut limits.max_unauthenticated_connections_per_address,
            self.max_unauthenticated_connections_per_address,
        );
        // A pool resized keeps the default reservations' proportions; shares given override.
        if let Some(total) = self.max_watches {
            limits.watches = limits.watches.resized(total);
        }
        if let Some(total) = self.max_requests_in_flight {
            limits.requests_in_flight = limits.requests_in_flight.resized(total);
        }
        for (flag, value, target) in [
            (
                "--handshake-timeout",
                self.handshake_timeout,
                &mut limits.handshake_timeout,
            ),
            (
                "--first-request-timeout",
                self.first_request_timeout,
                &mut limits.first_request_timeout,
            ),
            (
                "--idle-timeout",
                self.idle_timeout,
                &mut limits.idle_timeout,
            ),
            (
                "--request-timeout",
                self.request_timeout,
                &mut limits.request_timeout,
            ),
            (
                "--keepalive-interval",
                self.keepalive_interval,
                &mut limits.keepalive_interval,
            ),
            (
                "--keepalive-timeout",
                self.keepalive_timeout,
                &mut limits.keepalive_timeout,
            ),
            (
                "--watch-bookmark-interval",
                self.watch_bookmark_interval,
                &mut limits.bookmark_interval,
            ),
        ] {
            if let Some(value) = value {
                if value.is_zero() {
                    return Err(format!("{flag}: must be more than 0"));
                }
                *target = value;
            }
        }
        self.apply_shares(&mut limits);
        limits.check().map_err(|reason| {
            format!(
                "--max-connections, --max-watches, --max-requests-in-flight and the shares: \
                 {reason}"
            )
        })?;
        Ok(limits)
    }

    /// The `--*-share` flags over the (resized) default shares.
    fn apply_shares(&self, limits: &mut ServerLimits) {
        let default_pool = ServerLimits::default().authenticated_connections();
        let mut connections = default_pool.resized(limits.authenticated_connections().total);
        for arg in &self.connection_share {
            *connections.share_mut(arg.role) = arg.share;
        }
        limits.connection_shares = connections.shares;
        for arg in &self.watch_share {
            *limits.watches.share_mut(arg.role) = arg.share;
        }
        for arg in &self.request_share {
            *limits.requests_in_flight.share_mut(arg.role) = arg.share;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CONFIG.md's sizing for N VM agents: `--max-connections` resizes every role's share in
    /// proportion, so 5,000 agents need about 2 x N + 2,048, and N + 3,072 leaves them 4,554.
    #[test]
    fn a_resized_table_gives_vm_agents_about_65_percent_of_its_authenticated_part() {
        let most_for_vm_agents = |max_connections: usize| {
            let args = LimitArgs {
                max_connections: Some(max_connections),
                ..LimitArgs::default()
            };
            let connections = args.limits().unwrap().authenticated_connections();
            connections.share(Role::VmAgent).reserved + connections.shared()
        };
        assert_eq!(most_for_vm_agents(5_000 + 3_072), 4_554);
        assert!(most_for_vm_agents(2 * 5_000 + 2_048) >= 5_000);
    }

    #[test]
    fn shares_parse_and_apply() {
        let args = LimitArgs {
            max_watches: Some(60),
            watch_share: vec![
                share("vm-agent=10/8").unwrap(),
                share("admin=5/20").unwrap(),
                share("gateway=10/10").unwrap(),
                share("node=10/10").unwrap(),
            ],
            first_request_timeout: Some(Duration::from_secs(2)),
            ..LimitArgs::default()
        };
        let limits = args.limits().unwrap();
        assert_eq!(limits.watches.shared(), 25);
        assert_eq!(limits.watches.share(Role::VmAgent).per_identity, 8);
        assert_eq!(limits.first_request_timeout, Duration::from_secs(2));
        let args = LimitArgs {
            connection_share: vec![share("node=100/7").unwrap()],
            ..LimitArgs::default()
        };
        let connections = args.limits().unwrap().authenticated_connections();
        assert_eq!(connections.share(Role::Node).per_identity, 7);
        assert_eq!(connections.total, 4096 - 1024);
        assert_eq!(
            limits.max_connections,
            ServerLimits::default().max_connections
        );
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        assert!(share("root=1/1").unwrap_err().contains("unknown role"));
        assert!(share("node=1")
            .unwrap_err()
            .contains("ROLE=RESERVED/PER_IDENTITY"));
        assert!(share("node=x/1").unwrap_err().contains("RESERVED"));
        let too_small = LimitArgs {
            max_watches: Some(10),
            watch_share: vec![share("node=11/1").unwrap()],
            ..LimitArgs::default()
        };
        assert!(too_small.limits().unwrap_err().contains("reservations"));
        // Smaller pools without shares keep the default proportions.
        let small = LimitArgs {
            max_watches: Some(100),
            max_connections: Some(64),
            max_unauthenticated_connections: Some(16),
            ..LimitArgs::default()
        };
        let limits = small.limits().unwrap();
        assert_eq!(limits.watches.share(Role::VmAgent).reserved, 20);
        assert!(limits.authenticated_connections().check().is_ok());
        let zero = LimitArgs {
            idle_timeout: Some(Duration::ZERO),
            ..LimitArgs::default()
        };
        assert!(zero.limits().unwrap_err().contains("--idle-timeout"));
        let zero = LimitArgs {
            watch_bookmark_interval: Some(Duration::ZERO),
            ..LimitArgs::default()
        };
        let refused = zero.limits().unwrap_err();
        assert!(refused.contains("--watch-bookmark-interval"), "{refused}");
    }

    #[test]
    fn the_bookmark_interval_is_a_minute_unless_set() {
        let limits = LimitArgs::default().limits().unwrap();
        assert_eq!(limits.bookmark_interval, Duration::from_secs(60));
        let args = LimitArgs {
            watch_bookmark_interval: Some(Duration::from_secs(5)),
            ..LimitArgs::default()
        };
        assert_eq!(
            args.limits().unwrap().bookmark_interval,
            Duration::from_secs(5)
        );
    }
}
