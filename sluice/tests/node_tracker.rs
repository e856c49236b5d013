//! The node publishes the agents it holds through the tracker into a real redis-server: one
//! write per agent, not per tunnel. The tunnel (data plane) and the tracker (control plane) meet
//! only here, where the binary wires them, so this test lives with the binary and borrows the
//! tunnel crate's in-process node harness.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "../../dataplane/tunnel/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{agent_tokens, block_on, descriptor, start_node_with, token_of};
use http::Request;
use sluice_grpc::transport::{connect, H2Settings};
use sluice_runtime::Driver;
use sluice_tracker::{RedisTarget, TrackerMetrics, TrackerOptions};
use sluice_tunnel::protocol::CONNECT_PATH;
use test_support::{wait_until, RedisServer};

const AGENTS: i64 = 1000;
const TUNNELS_PER_AGENT: usize = 5;

/// Both ends of 1,000 connections live in this process: make sure it may hold the descriptors.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < 8192 {
            limit.rlim_cur = limit.rlim_max.min(8192);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[test]
fn a_thousand_agents_with_five_tunnels_each_cost_one_write_per_agent_on_io_uring() {
    a_thousand_agents_with_five_tunnels_each_cost_one_write_per_agent(Driver::IoUring);
}

#[test]
fn a_thousand_agents_with_five_tunnels_each_cost_one_write_per_agent_on_legacy() {
    a_thousand_agents_with_five_tunnels_each_cost_one_write_per_agent(Driver::Legacy);
}

/// One HSET for the agent's node entry and one for its connection record: 2 per agent, however
/// many tunnels it opens.
fn a_thousand_agents_with_five_tunnels_each_cost_one_write_per_agent(driver: Driver) {
    raise_descriptor_limit();
    let redis = RedisServer::start().unwrap();
    let tracker = sluice_tracker::spawn(
        RedisTarget::Single {
            url: redis.url(),
            ca_file: None,
        },
        TrackerOptions {
            node_name: "node-a".into(),
            private_address: "127.0.0.1:8155".into(),
            key_prefix: "bound".into(),
            ttl: Duration::from_secs(300),
            refresh: Duration::from_secs(240),
            gc_interval: Duration::from_secs(600),
            unregister_delay: Duration::from_millis(500),
            max_connections_per_agent: 64,
        },
        TrackerMetrics::unregistered(),
    )
    .unwrap();
    let agents: Vec<i64> = (1..=AGENTS).collect();
    let node = start_node_with(
        driver,
        agent_tokens(&agents),
        Some(std::sync::Arc::new(tracker.clone())),
    );
    let address = node.agent;

    // The fake agents live on their own thread until the test is done with them.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let agents_done = done.clone();
    let agents_thread = std::thread::spawn(move || {
        block_on(async move {
            let mut held = Vec::new();
            let mut connections = Vec::new();
            for agent in 1..=AGENTS {
                let connection = connect(address, None, &H2Settings::default())
                    .await
                    .unwrap();
                for _ in 0..TUNNELS_PER_AGENT {
                    let mut ready = connection.ready().await.unwrap();
                    let request = Request::post(format!("http://node{CONNECT_PATH}"))
                        .header("content-type", "application/grpc")
                        .header("authorization", format!("Bearer {}", token_of(agent)))
                        .header("sluice-agent-connection-id", agent.to_string())
                        .body(())
                        .unwrap();
                    let (response, mut send) = ready.send_request(request, false).unwrap();
                    send.send_data(descriptor(), false).unwrap();
                    held.push((response, send));
                }
                connections.push(connection);
            }
            while !agents_done.load(std::sync::atomic::Ordering::SeqCst) {
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    });
    assert!(
        wait_until(Duration::from_secs(30), || node
            .shared
            .registry
            .idle_count()
            == AGENTS as usize * TUNNELS_PER_AGENT),
        "all tunnels parked: {}",
        node.shared.registry.idle_count()
    );
    assert!(
        wait_until(Duration::from_secs(30), || redis.command_calls("hset")
            >= 2 * AGENTS as u64),
        "{} HSETs",
        redis.command_calls("hset")
    );
    // A check that no more writes come cannot wait for an event: every tunnel is parked and
    // every agent written, so any further HSET would be a write per tunnel, queued behind
    // these; 500 ms is many times what the tracker takes to drain its queue.
    std::thread::sleep(Duration::from_millis(500));
    let writes = redis.command_calls("hset");
    assert_eq!(
        writes,
        2 * AGENTS as u64,
        "{} tunnels, {writes} HSETs",
        AGENTS as usize * TUNNELS_PER_AGENT
    );
    assert!(block_on(tracker.lookup(500))
        .unwrap()
        .iter()
        .any(|entry| entry.node == "node-a"));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    agents_thread.join().unwrap();
}
