//! Which apiserver takes a request: round robin over the servers of the matched dispatch policy
//! that are enabled and healthy, with one cursor per (cluster, policy) on each core. Plain
//! functions over the compiled servers and their health flags.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_gateway::cluster::CompiledServer;

use crate::state::ServerHealth;

/// Whether server `index` may take requests now: it exists, is not disabled and is healthy.
pub fn is_usable(servers: &[CompiledServer], health: &[Arc<ServerHealth>], index: usize) -> bool {
    servers.get(index).is_some_and(|server| !server.disabled)
        && health.get(index).is_some_and(|health| health.is_healthy())
}

/// The first usable server of a cluster that the gateway dials itself (reviews ask it; an
/// agent server's apiserver is reached only through the tunnel, as the user).
pub fn first_usable(servers: &[CompiledServer], health: &[Arc<ServerHealth>]) -> Option<usize> {
    (0..servers.len())
        .find(|&index| servers[index].agent.is_none() && is_usable(servers, health, index))
}

/// When no server of a policy is usable: its first enabled agent server, if it has one. The
/// request then waits for that agent as tunnel calls do (up to `tunnel.max_wait`) and ends with
/// a 503 naming the agent, rather than failing at once while the agent reconnects.
pub fn waiting_agent(candidates: &[usize], servers: &[CompiledServer]) -> Option<usize> {
    candidates.iter().copied().find(|&index| {
        servers
            .get(index)
            .is_some_and(|server| server.agent.is_some() && !server.disabled)
    })
}

/// This core's round-robin cursors, by cluster then policy (nested so that a lookup borrows the
/// names instead of building an owned key per request).
#[derive(Debug, Default)]
pub struct RoundRobin {
    cursors: HashMap<Box<str>, HashMap<Box<str>, usize>>,
}

impl RoundRobin {
    /// The next usable server among `candidates` (a policy's servers) for (cluster, policy);
    /// `None` when none is usable, without moving the cursor.
    pub fn next(
        &mut self,
        (cluster, policy): (&str, &str),
        candidates: &[usize],
        servers: &[CompiledServer],
        health: &[Arc<ServerHealth>],
    ) -> Option<usize> {
        // Two passes over the candidates instead of collecting the usable ones: no allocation
        // per request.
        let usable = || {
            candidates
                .iter()
                .copied()
                .filter(|&index| is_usable(servers, health, index))
        };
        let count = usable().count();
        if count == 0 {
            return None;
        }
        let cursor = self.advance(cluster, policy);
        // The health checker may have taken a server out between the passes: then the first
        // one still usable (or none).
        usable().nth(cursor % count).or_else(|| usable().next())
    }

    /// Moves the (cluster, policy) cursor on and returns it; the names are copied only the
    /// first time the pair is seen.
    fn advance(&mut self, cluster: &str, policy: &str) -> usize {
        let known = self
            .cursors
            .get_mut(cluster)
            .and_then(|policies| policies.get_mut(policy));
        if let Some(cursor) = known {
            *cursor = cursor.wrapping_add(1);
            return *cursor;
        }
        self.cursors
            .entry(Box::from(cluster))
            .or_default()
            .insert(Box::from(policy), 1);
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(count: usize) -> Vec<CompiledServer> {
        (0..count)
            .map(|index| {
                let endpoint = format!("https://10.0.0.{index}:6443");
                CompiledServer {
                    uri: endpoint.parse().unwrap(),
                    endpoint: endpoint.into(),
                    tls: true,
                    host: format!("10.0.0.{index}").into(),
                    port: 6443,
                    disabled: false,
                    agent: None,
                }
            })
            .collect()
    }

    fn health(flags: &[bool]) -> Vec<Arc<ServerHealth>> {
        flags
            .iter()
            .map(|&healthy| Arc::new(ServerHealth::new(healthy)))
            .collect()
    }

    fn picks(
        round_robin: &mut RoundRobin,
        policy: &str,
        candidates: &[usize],
        servers: &[CompiledServer],
        health: &[Arc<ServerHealth>],
        count: usize,
    ) -> Vec<Option<usize>> {
        (0..count)
            .map(|_| round_robin.next(("c", policy), candidates, servers, health))
            .collect()
    }

    #[test]
    fn round_robin_takes_every_healthy_server_in_turn() {
        let servers = servers(3);
        let health = health(&[true, true, true]);
        let mut round_robin = RoundRobin::default();
        let got = picks(&mut round_robin, "p", &[0, 1, 2], &servers, &health, 6);
        assert_eq!(
            got,
            [1, 2, 0, 1, 2, 0].map(Some),
            "each server once per round"
        );
    }

    #[test]
    fn unhealthy_and_disabled_servers_are_skipped() {
        let mut servers = servers(4);
        servers[3].disabled = true;
        let health = health(&[true, false, true, true]);
        let mut round_robin = RoundRobin::default();
        let got = picks(&mut round_robin, "p", &[0, 1, 2, 3], &servers, &health, 4);
        assert_eq!(got, [2, 0, 2, 0].map(Some));
    }

    #[test]
    fn a_server_back_in_rotation_is_picked_again() {
        let servers = servers(2);
        let health = health(&[true, false]);
        let mut round_robin = RoundRobin::default();
        assert_eq!(
            picks(&mut round_robin, "p", &[0, 1], &servers, &health, 2),
            [Some(0), Some(0)]
        );
        health[1].set(true);
        let got = picks(&mut round_robin, "p", &[0, 1], &servers, &health, 2);
        assert!(got.contains(&Some(1)), "{got:?}");
    }

    #[test]
    fn all_down_picks_nothing() {
        let mut servers = servers(3);
        servers[2].disabled = true;
        let health = health(&[false, false, true]);
        let mut round_robin = RoundRobin::default();
        assert_eq!(
            round_robin.next(("c", "p"), &[0, 1, 2], &servers, &health),
            None
        );
        assert_eq!(first_usable(&servers, &health), None);
        // Indices the generation does not have (a policy naming a removed server) never match.
        assert_eq!(round_robin.next(("c", "p"), &[7], &servers, &health), None);
    }

    #[test]
    fn only_the_policys_subset_is_used_and_each_policy_has_its_own_cursor() {
        let servers = servers(4);
        let health = health(&[true; 4]);
        let mut round_robin = RoundRobin::default();
        let reads = picks(&mut round_robin, "reads", &[2, 3], &servers, &health, 4);
        assert_eq!(reads, [3, 2, 3, 2].map(Some));
        let writes = picks(&mut round_robin, "writes", &[0, 1], &servers, &health, 2);
        assert_eq!(writes, [1, 0].map(Some), "a fresh cursor");
    }

    #[test]
    fn reviews_ask_the_first_usable_server() {
        let mut servers = servers(3);
        servers[0].disabled = true;
        let health = health(&[true, false, true]);
        assert_eq!(first_usable(&servers, &health), Some(2));
    }

    #[test]
    fn reviews_never_ask_an_agent_server() {
        let mut servers = servers(2);
        servers[0].agent = Some(42);
        assert_eq!(first_usable(&servers, &health(&[true, true])), Some(1));
        assert_eq!(first_usable(&servers[..1], &health(&[true])), None);
    }

    #[test]
    fn with_no_usable_server_a_policy_waits_for_its_first_enabled_agent_server() {
        let mut servers = servers(4);
        servers[1].agent = Some(7);
        servers[1].disabled = true;
        servers[3].agent = Some(8);
        assert_eq!(waiting_agent(&[0, 1, 2, 3], &servers), Some(3));
        assert_eq!(
            waiting_agent(&[0, 1, 2], &servers),
            None,
            "direct servers do not wait"
        );
    }
}
