#![allow(clippy::unwrap_used)]
use std::sync::Arc;
use std::time::Duration;

use sluice_locator::memory::MemoryCluster;
use sluice_locator::AgentLocator;

use super::super::test_node::{node, run};
use super::*;
use crate::error::ErrorKind;

/// A client that never resets its call.
struct Patient;

impl ClientReset for Patient {
    async fn reset(&mut self) {
        std::future::pending::<()>().await
    }
}

struct Reset;

impl ClientReset for Reset {
    async fn reset(&mut self) {}
}

fn parts() -> http::request::Parts {
    http::Request::new(()).into_parts().0
}

#[test]
fn an_arrival_elsewhere_wakes_a_waiting_call_before_the_poll() {
    let cluster = MemoryCluster::new();
    let locator: Arc<dyn AgentLocator> = cluster.locator("n", "10.0.0.1:1");
    let node = node(Some(locator));
    let remote = RemoteRouting::new(&node).unwrap();
    let parts = parts();
    let router = Router {
        node: &node,
        remote: Some(&remote),
        agent: 5,
        deadline: None,
        arrived: Instant::now(),
        parts: &parts,
        worker: 0,
        taken: std::cell::Cell::new(crate::metrics::CallRoute::None),
        carry: Carry::Relay,
        relay_goes_on: std::cell::Cell::new(false),
        admitted: std::cell::Cell::new(false),
    };
    let other = cluster.locator("b", "10.0.0.2:2");
    let started = Instant::now();
    // The test node's max_wait (1 s) ends before the locator poll (2 s): only the arrival
    // can make the call look up the agent again.
    let mut state = RouteState::new(5, None, node.max_wait(), true, started);
    let mut client = Patient;
    let error = run(async {
        let arrive = async {
            monoio::time::sleep(Duration::from_millis(50)).await;
            other.register(5);
            std::future::pending::<()>().await
        };
        monoio::select! {
            routed = router.route(&mut state, RouteStep::Look { retried: false }, Instant::now(), &mut client) => routed,
            _ = arrive => unreachable!(),
        }
    })
    .err()
    .unwrap();
    // The arrival led to a race with node b, which failed (this node cannot sign node
    // tokens), so the call was routed again and waited out its max_wait.
    assert_eq!(node.metrics.routes("remote"), 1);
    assert_eq!(node.metrics.routes("retried"), 1);
    assert_eq!(error.kind(), ErrorKind::NoTunnel);
    assert!(started.elapsed() >= node.max_wait());
}

#[test]
fn a_client_reset_ends_the_wait_at_once() {
    let node = node(None);
    let parts = parts();
    let router = Router {
        node: &node,
        remote: None,
        agent: 5,
        deadline: None,
        arrived: Instant::now(),
        parts: &parts,
        worker: 0,
        taken: std::cell::Cell::new(crate::metrics::CallRoute::None),
        carry: Carry::Relay,
        relay_goes_on: std::cell::Cell::new(false),
        admitted: std::cell::Cell::new(false),
    };
    let mut state = RouteState::new(5, None, node.max_wait(), false, Instant::now());
    let step = state.start();
    let error = run(router.route(&mut state, step, Instant::now(), &mut Reset))
        .err()
        .unwrap();
    assert_eq!(error.kind(), ErrorKind::ClientGone);
}
