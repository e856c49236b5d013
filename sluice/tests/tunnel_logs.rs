//! What the tunnel's logs and error messages tell whom: an external client never learns an
//! agent's backend address, and the node logs an agent leaving it.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::{client_args, metric, start_agent, start_node, wait_for_idle_tunnels, Secrets};
use test_support::{on_both_drivers, tunnel_client, wait_until};

on_both_drivers!(
    a_client_never_learns_the_agents_backend_address,
    the_node_logs_an_agent_leaving_once_per_interval_however_it_flaps,
);

fn a_client_never_learns_the_agents_backend_address(driver: &str) {
    let secrets = Secrets::on(driver);
    // A port nothing listens on: bound, then released.
    let backend = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let node = start_node(&secrets, "20s", 1024 * 1024, None);
    let agent = start_agent(&secrets, 7, &node, backend, 4, None);
    wait_for_idle_tunnels(&node, 1.0);

    let failed = tunnel_client("unary", &client_args(&node, &secrets, 7));
    assert_eq!(failed["code"], "UNAVAILABLE", "{failed}");
    let details = failed["details"].as_str().unwrap();
    let port = backend.port().to_string();
    assert!(
        !details.contains(&port) && !details.contains("127.0.0.1"),
        "the client was told the backend's address: {details}"
    );
    assert!(details.contains("backend"), "and why it failed: {details}");
    // The operator of the agent still gets the detail.
    assert!(
        wait_until(Duration::from_secs(10), || agent
            .stderr()
            .contains(&backend.to_string())),
        "the agent's log names its backend; agent stderr:\n{}",
        agent.stderr()
    );
}

/// The node's disconnect lines about agent 7.
fn disconnect_lines(node: &test_support::SluiceProcess) -> Vec<String> {
    node.stderr()
        .lines()
        .filter(|line| {
            line.contains("agent disconnected from this node") && line.contains("agent=7")
        })
        .map(str::to_string)
        .collect()
}

fn the_node_logs_an_agent_leaving_once_per_interval_however_it_flaps(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let node = start_node(&secrets, "20s", 1024 * 1024, None);

    let agent = start_agent(&secrets, 7, &node, backend, 4, None);
    wait_for_idle_tunnels(&node, 1.0);
    agent.signal(libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !disconnect_lines(&node)
            .is_empty()),
        "the node logged the agent leaving; node stderr:\n{}",
        node.stderr()
    );
    let first = disconnect_lines(&node);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains("connection_id="), "{}", first[0]);
    assert!(
        first[0].contains("reason=\"closed\"") || first[0].contains("reason=\"reset\""),
        "the agent went away, the node neither drained nor revoked it: {}",
        first[0]
    );
    let first_logged = Instant::now();
    drop(agent);

    // The agent flaps: each life connects, then is killed.
    const FLAPS: usize = 3;
    for _ in 0..FLAPS {
        let agent = start_agent(&secrets, 7, &node, backend, 4, None);
        wait_for_idle_tunnels(&node, 1.0);
        agent.signal(libc::SIGKILL);
        assert!(
            wait_until(Duration::from_secs(10), || metric(
                &node,
                "sluice_tunnel_idle_tunnels"
            ) == Some(0.0)),
            "the node let the killed agent's tunnels go"
        );
        drop(agent);
    }
    // One line per agent per interval (10 s): however slow the machine made the flaps, the
    // node wrote no more lines than the intervals they spanned.
    let intervals = first_logged.elapsed().as_secs() / 10;
    let lines = disconnect_lines(&node);
    assert!(
        lines.len() as u64 <= 1 + intervals + 1,
        "{} disconnects in {intervals} whole intervals gave {} lines: {lines:?}",
        FLAPS + 1,
        lines.len()
    );
    if intervals == 0 {
        assert_eq!(
            lines.len(),
            1,
            "the flaps within the interval were held back: {lines:?}"
        );
    }
}
