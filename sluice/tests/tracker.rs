//! A node with Redis publishes the agents it holds; a graceful stop removes its entries at
//! once, a killed node's entries stay until their TTL.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{metric, start_agent, wait_for_idle_tunnels, Secrets};
use test_support::{on_both_drivers, wait_until, GrpcBackend, RedisServer};

fn node_with_redis(
    secrets: &Secrets,
    redis: &RedisServer,
    prefix: &str,
) -> test_support::SluiceProcess {
    let extra = format!("redis:\n  url: '{}'\n  key_prefix: {prefix}\n  ttl: 30s\n  refresh: 20s\n  unregister_delay: 500ms\n", redis.url());
    let private = format!(
        "  private_jwt: {{secret_file: '{}', issuer: nodes}}\n",
        secrets.jwt_secret.display()
    );
    common::start_node_on(
        secrets,
        "5s",
        1024 * 1024,
        None,
        &secrets.driver,
        &private,
        &extra,
        None,
    )
}

fn field_exists(redis: &RedisServer, prefix: &str) -> bool {
    redis
        .command(&[
            "HEXISTS",
            &format!("{prefix}:tunnel:agent:{{7}}"),
            "test-node",
        ])
        .unwrap()
        .starts_with(":1")
}

// Runs once per monoio driver (the node and its agent share it).
on_both_drivers!(a_graceful_stop_removes_the_nodes_entries_and_a_kill_leaves_them_to_expire);

fn a_graceful_stop_removes_the_nodes_entries_and_a_kill_leaves_them_to_expire(driver: &str) {
    let redis = RedisServer::start().unwrap();
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().unwrap();

    let mut node = node_with_redis(&secrets, &redis, "graceful");
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);
    assert!(
        wait_until(Duration::from_secs(10), || field_exists(&redis, "graceful")),
        "registered in redis"
    );
    assert!(metric(&node, "sluice_tracker_redis_writes_total").unwrap_or(0.0) >= 1.0);
    node.signal(libc::SIGTERM);
    assert_eq!(
        node.wait_exit(Duration::from_secs(10))
            .and_then(|status| status.code()),
        Some(0)
    );
    assert!(
        !field_exists(&redis, "graceful"),
        "a graceful stop removed the entry at once"
    );

    let mut killed = node_with_redis(&secrets, &redis, "killed");
    let _agent = start_agent(&secrets, 7, &killed, backend.address, 20, None);
    wait_for_idle_tunnels(&killed, 2.0);
    assert!(wait_until(Duration::from_secs(10), || field_exists(
        &redis, "killed"
    )));
    killed.signal(libc::SIGKILL);
    let _ = killed.wait_exit(Duration::from_secs(5));
    assert!(
        field_exists(&redis, "killed"),
        "a killed node cannot clean up"
    );
    let ttl: i64 = redis
        .command(&["PTTL", "killed:tunnel:agent:{7}"])
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(
        ttl > 0 && ttl <= 30_000,
        "the entry expires by its TTL: {ttl} ms"
    );
}
