//! An agent's pool of idle tunnels: it grows to `min_idle` a batch at a time as its tunnels
//! open, and grows again while calls hold its tunnels, so that `min_idle` stay free for the
//! next calls; calls that come and go while it is not short wake nothing (`IdleMark`).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::agents::{split_call, start_agent, start_backend, wait_idle};
use common::*;
use sluice_config::PoolConfig;
use sluice_runtime::Driver;

const MIN_IDLE: usize = 6;

#[test]
fn an_agent_keeps_min_idle_tunnels_free_while_calls_hold_others() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        let (backend, backend_address) = start_backend(driver);
        // Two at a time: reaching six takes the pool several wake-ups as tunnels turn idle.
        let pool = PoolConfig {
            min_idle: MIN_IDLE,
            max: 64,
            grow_by: 2,
            idle_timeout: Duration::from_secs(60),
        };
        let agent = start_agent(driver, node.agent, backend_address, pool);
        wait_idle(&node, MIN_IDLE);

        let holding = 10;
        let codes = block_on(async {
            let calls: Vec<_> = (0..holding)
                .map(|_| monoio::spawn(split_call(node.external, Duration::from_secs(2))))
                .collect();
            let mut codes = Vec::new();
            for call in calls {
                codes.push(call.await.0);
            }
            codes
        });
        assert!(codes.iter().all(|code| code == "0"), "{driver}: {codes:?}");
        // The pool grew while the calls held ten tunnels, so that six stayed free: back in the
        // registry, those ten and the six make sixteen idle tunnels at least.
        wait_idle(&node, MIN_IDLE + holding);
        agent.shutdown();
        backend.shutdown();
    }
}

/// A tunnel idles out `idle_timeout` after its last call, neither before (its timer, set when
/// it opened, ran out during the call) nor never (the timer is re-armed, not recreated).
#[test]
fn a_tunnel_idles_out_its_timeout_after_its_last_call_not_before() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let idle_timeout = Duration::from_secs(2);
        let node = start_node(driver);
        let (backend, backend_address) = start_backend(driver);
        let pool = PoolConfig {
            min_idle: 2,
            max: 16,
            grow_by: 2,
            idle_timeout,
        };
        let agent = start_agent(driver, node.agent, backend_address, pool);
        wait_idle(&node, 2);
        let holding = 6;
        // Over twice the timeout: every tunnel's first timer, set when it opened (the pool opens
        // more while the calls hold tunnels), runs out while it carries a call.
        let codes = block_on(async {
            let calls: Vec<_> = (0..holding)
                .map(|_| {
                    monoio::spawn(split_call(
                        node.external,
                        idle_timeout + Duration::from_millis(500),
                    ))
                })
                .collect();
            let mut codes = Vec::new();
            for call in calls {
                codes.push(call.await.0);
            }
            codes
        });
        let answered = std::time::Instant::now();
        assert!(codes.iter().all(|code| code == "0"), "{driver}: {codes:?}");
        wait_idle(&node, holding);
        std::thread::sleep(idle_timeout / 2);
        let idle = node.shared.registry.idle_count();
        assert!(
            idle >= holding,
            "{driver}: {idle} idle tunnels {:?} after the calls: expired before their timeout",
            answered.elapsed()
        );
        // Then the ones above min_idle expire (the pool reopens to min_idle at most).
        let deadline = answered + idle_timeout * 4;
        while node.shared.registry.idle_count() > 2 + 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let idle = node.shared.registry.idle_count();
        assert!(
            idle <= 4,
            "{driver}: {idle} idle tunnels {:?} after the calls: none expired",
            answered.elapsed()
        );
        agent.shutdown();
        backend.shutdown();
    }
}
