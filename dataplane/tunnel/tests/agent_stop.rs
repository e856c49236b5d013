//! An agent drains like a node: stopped (as on SIGTERM) while calls keep coming, with a large
//! pool of idle tunnels the node keeps sending calls down, it withdraws every idle tunnel
//! (REFUSED_STREAM) and finishes the calls it took before its connection closes, and the node
//! routes each call it had sent down a withdrawn tunnel to the other agent process. No call
//! fails: neither one the agent withdrew a tunnel under (REFUSED_STREAM) nor one it had just
//! answered when it stopped (the reset must not overtake the answer). The calls' bodies follow
//! their headers a moment later, so they go down tunnels before the request is whole (the case
//! `reuse.rs`'s refused-tunnel tests pin down on a fake agent).
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use common::agents::{split_call, start_agent, start_backend, wait_idle};
use common::*;
use sluice_config::PoolConfig;
use sluice_runtime::Driver;

/// Keeps `min_idle` idle tunnels, growing 32 at a time, up to 512.
fn pool(min_idle: usize) -> PoolConfig {
    PoolConfig {
        min_idle,
        max: 512,
        grow_by: 32,
        idle_timeout: Duration::from_secs(60),
    }
}

/// Unary calls from `clients` concurrent callers until `done`; returns each failed call's
/// (status, message).
async fn call_until(
    node: SocketAddr,
    clients: usize,
    done: Rc<Cell<bool>>,
) -> Vec<(String, String)> {
    let callers: Vec<_> = (0..clients)
        .map(|_| {
            let done = done.clone();
            monoio::spawn(async move {
                let mut failed = Vec::new();
                while !done.get() {
                    let outcome = split_call(node, Duration::from_millis(2)).await;
                    if outcome.0 != "0" {
                        failed.push(outcome);
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for caller in callers {
        failed.extend(caller.await);
    }
    failed
}

#[test]
fn an_agent_stopped_with_a_large_idle_pool_under_load_fails_no_call() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        let (backend, backend_address) = start_backend(driver);
        let steady = start_agent(driver, node.agent, backend_address, pool(8));
        wait_idle(&node, 8);
        let done = Rc::new(Cell::new(false));
        let failed = block_on(async {
            let calls = monoio::spawn(call_until(node.external, 64, done.clone()));
            // Each restart stops the agent while calls are being answered on its tunnels and
            // sent down its idle ones.
            for _ in 0..4 {
                let churned = start_agent(driver, node.agent, backend_address, pool(224));
                monoio::time::sleep(Duration::from_millis(400)).await;
                let stopping = std::thread::spawn(move || churned.shutdown());
                while !stopping.is_finished() {
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // Calls go on a little after the agent left: none may reach what is left of it.
            monoio::time::sleep(Duration::from_millis(300)).await;
            done.set(true);
            calls.await
        });
        assert_eq!(
            failed,
            [] as [(String, String); 0],
            "{driver}: calls failed"
        );
        steady.shutdown();
        backend.shutdown();
        still_serves(&node);
    }
}
