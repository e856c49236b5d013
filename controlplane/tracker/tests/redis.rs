//! The tracker against a real redis-server.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use sluice_tracker::{spawn, RedisTarget, TrackerHandle, TrackerMetrics, TrackerOptions};
use test_support::{wait_until, RedisServer};

fn options(node: &str, prefix: &str) -> TrackerOptions {
    TrackerOptions {
        node_name: node.to_string(),
        private_address: format!("{node}.private:8155"),
        key_prefix: prefix.to_string(),
        ttl: Duration::from_secs(300),
        refresh: Duration::from_secs(240),
        gc_interval: Duration::from_secs(600),
        unregister_delay: Duration::from_millis(300),
        max_connections_per_agent: 64,
    }
}

fn tracker(url: String, options: TrackerOptions) -> (TrackerHandle, TrackerMetrics) {
    let metrics = TrackerMetrics::unregistered();
    let handle = spawn(
        RedisTarget::Single { url, ca_file: None },
        options,
        metrics.clone(),
    )
    .unwrap();
    (handle, metrics)
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn registration_is_written_once_per_agent_and_removed_after_the_delay() {
    let redis = RedisServer::start().unwrap();
    let (node, metrics) = tracker(redis.url(), options("node-a", "t1"));
    for _ in 0..5 {
        node.register(7);
    }
    assert!(wait_until(Duration::from_secs(5), || {
        block_on(node.lookup(7))
            .map(|entries| entries.len() == 1)
            .unwrap_or(false)
    }));
    let entries = block_on(node.lookup(7)).unwrap();
    assert_eq!(entries[0].node, "node-a");
    assert_eq!(entries[0].private_address, "node-a.private:8155");
    assert_eq!(
        redis.command_calls("hset"),
        1,
        "one write for five registrations"
    );
    let ttl: i64 = redis
        .command(&["PTTL", "t1:tunnel:agent:{7}"])
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 290_000, "the key carries the TTL: {ttl}");
    assert_eq!(metrics.writes.sum(), 1);

    // Leaving and coming back within the delay writes nothing.
    node.unregister(7);
    node.register(7);
    // A check that nothing happens cannot wait for an event: the bound is the behaviour (the
    // 500 ms unregister delay), with 200 ms of margin for the delayed removal to have run.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(block_on(node.lookup(7)).unwrap().len(), 1);
    assert_eq!(redis.command_calls("hdel"), 0);

    // Leaving for good removes the field after the delay.
    node.unregister(7);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node.lookup(7)
    )
    .unwrap()
    .is_empty()));
    assert_eq!(redis.command_calls("hdel"), 1);
}

#[test]
fn two_nodes_see_each_other_and_arrivals_wake_waiters_at_once() {
    let redis = RedisServer::start().unwrap();
    let (node_a, _) = tracker(redis.url(), options("node-a", "t2"));
    let (node_b, _) = tracker(redis.url(), options("node-b", "t2"));
    // Let node A's subscription settle.
    assert!(wait_until(Duration::from_secs(5), || redis
        .command(&["PUBSUB", "NUMSUB", "t2:tunnel:arrivals"])
        .unwrap()
        .contains(":2")));
    let listener = node_a.arrivals.listen(9);
    let started = Instant::now();
    node_b.register(9);
    block_on(async {
        tokio::time::timeout(Duration::from_secs(2), listener)
            .await
            .expect("arrival heard")
    });
    let waited = started.elapsed();
    // The bound is the behaviour (pub/sub, not a poll); a publish and its delivery take a few
    // milliseconds, 200 ms is the margin.
    assert!(
        waited < Duration::from_millis(200),
        "woken by pub/sub in {waited:?}"
    );
    let entries = block_on(node_a.lookup(9)).unwrap();
    assert_eq!(
        entries
            .iter()
            .map(|entry| entry.node.as_str())
            .collect::<Vec<_>>(),
        vec!["node-b"]
    );
    node_a.register(9);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node_b.lookup(9)
    )
    .unwrap()
    .len()
        == 2));
}

#[test]
fn shutdown_removes_what_the_node_wrote() {
    let redis = RedisServer::start().unwrap();
    let (node, _) = tracker(redis.url(), options("node-a", "t3"));
    for agent in 1..=20 {
        node.register(agent);
    }
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node.lookup(20)
    )
    .unwrap()
    .len()
        == 1));
    assert!(node.shutdown(Duration::from_secs(5)));
    let keys = redis.command(&["KEYS", "t3:*"]).unwrap();
    assert_eq!(keys, "*0\r\n", "no entries left: {keys}");
}

#[test]
fn a_withdrawn_node_leaves_redis_writes_nothing_more_and_still_answers_lookups() {
    let redis = RedisServer::start().unwrap();
    let (draining, metrics) = tracker(redis.url(), options("node-a", "t9"));
    let (peer, _) = tracker(redis.url(), options("node-b", "t9"));
    draining.register(4);
    peer.register(4);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        peer.lookup(4)
    )
    .unwrap()
    .len()
        == 2));
    assert!(draining.withdraw(Duration::from_secs(5)));
    assert_eq!(metrics.withdrawn.sum(), 1);
    let entries = block_on(peer.lookup(4)).unwrap();
    assert_eq!(
        entries
            .iter()
            .map(|entry| entry.node.as_str())
            .collect::<Vec<_>>(),
        vec!["node-b"],
        "the peer no longer sees the draining node"
    );
    // A tunnel that still arrives on the draining node is not advertised; the draining node's
    // own lookups (for calls it still routes) keep working.
    let writes = redis.command_calls("hset");
    draining.register(5);
    assert_eq!(block_on(draining.lookup(4)).unwrap().len(), 1);
    assert!(block_on(draining.lookup(5)).unwrap().is_empty());
    assert_eq!(redis.command_calls("hset"), writes);
    assert!(draining.shutdown(Duration::from_secs(5)));
}

#[test]
fn garbage_collection_removes_expired_fields_of_dead_nodes_only() {
    let redis = RedisServer::start().unwrap();
    let mut options = options("node-a", "t4");
    options.gc_interval = Duration::from_millis(300);
    let (node, _) = tracker(redis.url(), options);
    node.register(5);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node.lookup(5)
    )
    .unwrap()
    .len()
        == 1));
    // A node killed long ago left an expired field behind.
    redis
        .command(&["HSET", "t4:tunnel:agent:{5}", "node-dead", "1000|dead:8155"])
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        redis
            .command(&["HEXISTS", "t4:tunnel:agent:{5}", "node-dead"])
            .unwrap()
            == ":0\r\n"
    }));
    assert_eq!(
        block_on(node.lookup(5)).unwrap().len(),
        1,
        "the live field stays"
    );
}

#[test]
fn unix_socket_acl_user_and_key_prefix_work() {
    let redis = RedisServer::start().unwrap();
    redis
        .command(&[
            "ACL", "SETUSER", "sluice", "on", ">s3cret", "~p5:*", "&*", "+@all",
        ])
        .unwrap();
    let url = format!(
        "redis+unix://{}?user=sluice&pass=s3cret",
        redis.socket.display()
    );
    let (node, _) = tracker(url, options("node-a", "p5"));
    node.register(3);
    assert!(wait_until(Duration::from_secs(5), || {
        block_on(node.lookup(3))
            .map(|entries| entries.len() == 1)
            .unwrap_or(false)
    }));
    assert!(redis
        .command(&["EXISTS", "p5:tunnel:agent:{3}"])
        .unwrap()
        .contains(":1"));

    // A wrong password is an error, not a panic.
    let (bad, metrics) = tracker(
        format!("redis://sluice:wrong@{}", redis.address),
        options("node-b", "p5"),
    );
    assert!(block_on(bad.lookup(3)).is_err());
    assert!(metrics.errors.sum() >= 1);
}

#[test]
fn concurrent_lookups_of_one_agent_share_redis_calls() {
    let redis = RedisServer::start().unwrap();
    let (node, _) = tracker(redis.url(), options("node-a", "t6"));
    node.register(11);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node.lookup(11)
    )
    .unwrap()
    .len()
        == 1));
    let before = redis.command_calls("hgetall");
    let answers = block_on(async {
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let node = node.clone();
                tokio::spawn(async move { node.lookup(11).await })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap().unwrap());
        }
        answers
    });
    assert!(answers
        .iter()
        .all(|entries| entries.len() == 1 && entries[0].node == "node-a"));
    let calls = redis.command_calls("hgetall") - before;
    assert!(calls < 25, "50 lookups took {calls} HGETALLs");
}

#[test]
fn after_a_redis_restart_the_tracker_registers_again() {
    let mut redis = RedisServer::start().unwrap();
    // Over the unix socket: a restart on the same TCP port could find the port taken.
    let (node, metrics) = tracker(redis.unix_url(), options("node-a", "t7"));
    node.register(21);
    node.register(22);
    assert!(wait_until(Duration::from_secs(5), || block_on(
        node.lookup(22)
    )
    .unwrap()
    .len()
        == 1));
    // Redis dies and comes back empty (no persistence).
    redis.stop();
    assert!(
        block_on(node.lookup(21)).is_err(),
        "lookups fail while redis is away, without panicking"
    );
    // Not a synchronisation: the scenario is an outage of half a second.
    std::thread::sleep(Duration::from_millis(500));
    redis.restart().unwrap();
    let back = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || {
            block_on(node.lookup(21))
                .map(|entries| entries.len() == 1)
                .unwrap_or(false)
                && block_on(node.lookup(22))
                    .map(|entries| entries.len() == 1)
                    .unwrap_or(false)
        }),
        "re-registered after the restart"
    );
    // The bound is the behaviour (the tracker reconnects and re-registers by itself, not at its
    // next 4-minute refresh); its reconnect backoff is well under it.
    assert!(
        back.elapsed() < Duration::from_secs(5),
        "within 5 s: {:?}",
        back.elapsed()
    );
    assert!(metrics.errors.sum() >= 1);
}

#[test]
fn the_tracker_works_on_a_redis_cluster() {
    let cluster = test_support::RedisCluster::start().expect("a 3-master redis cluster");
    let metrics = TrackerMetrics::unregistered();
    let node = spawn(
        RedisTarget::Cluster {
            urls: cluster.urls(),
        },
        options("node-a", "c1"),
        metrics.clone(),
    )
    .unwrap();
    let other = spawn(
        RedisTarget::Cluster {
            urls: cluster.urls(),
        },
        options("node-b", "c1"),
        TrackerMetrics::unregistered(),
    )
    .unwrap();
    for agent in 1..=30 {
        node.register(agent);
    }
    let listed = wait_until(Duration::from_secs(10), || {
        (1..=30).all(|agent| {
            block_on(other.lookup(agent))
                .map(|entries| entries.len() == 1)
                .unwrap_or(false)
        })
    });
    let error = block_on(other.lookup(1)).err();
    assert!(
        listed,
        "every agent listed across the cluster's slots; errors: {} {error:?}",
        metrics.errors.sum()
    );
    // ListConnectedAgents across the slots: the agents' hashes lie in different slots, which
    // one pipeline may not mix on a cluster.
    for agent in 1..=30 {
        node.connection_up(record(agent, 1, "node-a"));
    }
    let pages = || -> Result<Vec<i64>, String> {
        let mut agents = Vec::new();
        let mut after = None;
        loop {
            let page = block_on(other.list_connections(after.clone(), 7))
                .map_err(|error| error.to_string())?;
            agents.extend(page.iter().map(|record| record.agent));
            if page.len() < 7 {
                return Ok(agents);
            }
            after = page.last().map(sluice_tracker::ConnectionRecord::key);
        }
    };
    let all = wait_until(Duration::from_secs(10), || {
        pages().is_ok_and(|agents| agents == (1..=30).collect::<Vec<_>>())
    });
    assert!(all, "every connection listed in pages: {:?}", pages());
    assert!(node.shutdown(Duration::from_secs(5)));
    assert!(block_on(other.lookup(5)).unwrap().is_empty());
}

fn record(agent: i64, connection_id: i64, node: &str) -> sluice_tracker::ConnectionRecord {
    sluice_tracker::ConnectionRecord {
        agent,
        connection_id,
        version: "v1".into(),
        node: node.into(),
        since_unix_ms: 1,
    }
}

/// Two nodes' records of three agents, listed page by page: every page at most the asked size,
/// in (agent, node, connection id) order, every record once. And one agent's records from one
/// node stop at `max_connections_per_agent`, whatever the node sends: the rest never reach
/// Redis and are counted.
#[test]
fn listings_come_in_bounded_pages_and_an_agents_records_are_bounded() {
    let redis = RedisServer::start().unwrap();
    let mut bounded = options("node-a", "pages");
    bounded.max_connections_per_agent = 5;
    let (a, a_metrics) = tracker(redis.url(), bounded);
    let (b, _) = tracker(redis.url(), options("node-b", "pages"));
    for connection in 0..50 {
        a.connection_up(record(7, connection, "node-a"));
    }
    for (agent, connection) in [(3, 1), (7, 2), (7, 100), (9, 4)] {
        b.connection_up(record(agent, connection, "node-b"));
    }
    a.connection_up(record(9, 1, "node-a"));
    let hash = |agent: i64| format!("pages:tunnel:conns:{{{agent}}}");
    let hlen = |agent: i64| -> u64 {
        redis
            .command(&["HLEN", &hash(agent)])
            .unwrap()
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap()
    };
    assert!(wait_until(Duration::from_secs(5), || hlen(9) == 2));
    assert_eq!(hlen(7), 5 + 2, "agent 7: five from node-a, two from node-b");
    assert_eq!(a_metrics.records_refused.sum(), 45);

    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = block_on(a.list_connections(after.clone(), 3)).unwrap();
        assert!(page.len() <= 3);
        listed.extend(
            page.iter()
                .map(|r| (r.agent, r.node.clone(), r.connection_id)),
        );
        if page.len() < 3 {
            break;
        }
        after = page.last().map(sluice_tracker::ConnectionRecord::key);
    }
    let mut expected = vec![(3, "node-b".to_string(), 1)];
    expected.extend((0..5).map(|c| (7, "node-a".to_string(), c)));
    expected.extend([(7, "node-b".to_string(), 2), (7, "node-b".to_string(), 100)]);
    expected.extend([(9, "node-a".to_string(), 1), (9, "node-b".to_string(), 4)]);
    assert_eq!(listed, expected);
}

/// Pages larger than one read batch (16 agents' hashes per round trip): 45 agents of two
/// records each, pages of 21 that end inside an agent, every record listed once and in order;
/// an agent in the index without a record is skipped and dropped from it.
#[test]
fn pages_spanning_several_read_batches_list_every_record_once() {
    let redis = RedisServer::start().unwrap();
    let (node, _) = tracker(redis.url(), options("node-a", "batches"));
    let mut expected = Vec::new();
    for agent in 1..=45 {
        node.register(agent);
        for connection in [2, 1] {
            node.connection_up(record(agent, connection, "node-a"));
            expected.push((agent, connection));
        }
    }
    expected.sort_unstable();
    let hlen = |agent: i64| -> u64 {
        redis
            .command(&["HLEN", &format!("batches:tunnel:conns:{{{agent}}}")])
            .unwrap()
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap()
    };
    assert!(wait_until(Duration::from_secs(5), || hlen(45) == 2));
    redis
        .command(&["SADD", "batches:tunnel:agents", "30000"])
        .unwrap();
    let index_reads = || -> u64 {
        let stats = redis.command(&["INFO", "commandstats"]).unwrap();
        stats
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_smembers:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let reads_before = index_reads();
    let mut listed = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = block_on(node.list_connections(after.clone(), 21)).unwrap();
        pages += 1;
        assert!(page.len() <= 21);
        listed.extend(page.iter().map(|r| (r.agent, r.connection_id)));
        if page.len() < 21 {
            break;
        }
        after = page.last().map(sluice_tracker::ConnectionRecord::key);
    }
    assert_eq!(listed, expected);
    assert_eq!(
        index_reads() - reads_before,
        1,
        "the listing's {pages} pages read the whole index once, at its first page"
    );
    let member = redis
        .command(&["SISMEMBER", "batches:tunnel:agents", "30000"])
        .unwrap();
    assert_eq!(
        member.trim(),
        ":0",
        "an agent without records leaves the index"
    );
}

/// A node taking thousands of agents back at once (a restart: they all dial again) writes them
/// in batches, not a round trip or two each, and every one of them is in Redis; then its
/// drain removes them the same way.
#[test]
fn a_burst_of_arrivals_is_written_in_batches_and_every_agent_lands() {
    const AGENTS: i64 = 3_000;
    let redis = RedisServer::start().unwrap();
    let (node, metrics) = tracker(redis.url(), options("node-a", "burst"));
    for agent in 1..=AGENTS {
        node.register(agent);
        node.connection_up(record(agent, 1, "node-a"));
    }
    let index = || -> i64 {
        redis
            .command(&["SCARD", "burst:tunnel:agents"])
            .unwrap()
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap()
    };
    assert!(wait_until(Duration::from_secs(20), || index() == AGENTS));
    for agent in [1, AGENTS / 2, AGENTS] {
        assert_eq!(
            block_on(node.lookup(agent)).unwrap().len(),
            1,
            "agent {agent}"
        );
    }
    let writes = metrics.writes.sum();
    // One at a time this is 3,000 registrations and 6,000 record writes.
    assert!(
        writes < (AGENTS / 10) as u64,
        "{writes} write round trips for {AGENTS} arrivals"
    );
    assert_eq!(redis.command_calls("hset"), 2 * AGENTS as u64);

    let before = metrics.writes.sum();
    node.withdraw(Duration::from_secs(20));
    let removals = metrics.writes.sum() - before;
    assert!(
        removals < 20,
        "{removals} round trips to remove {AGENTS} agents"
    );
    assert_eq!(block_on(node.lookup(AGENTS)).unwrap().len(), 0);
}

/// A full listing of `SLUICE_LISTING_AGENTS` (100,000) agents of one connection each, in pages
/// of 500, timed twice: the figure docs/PERFORMANCE.md prints ("Issue 36: a listing reads the
/// agents index once").
#[test]
#[ignore = "a measurement: SLUICE_LISTING_AGENTS=100000 taskset -c 1 cargo test --release -p sluice-tracker --test redis full_listing_time -- --ignored --nocapture"]
fn full_listing_time() {
    const PAGE: usize = 500;
    let agents: i64 = std::env::var("SLUICE_LISTING_AGENTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(100_000);
    let redis = RedisServer::start().unwrap();
    let (node, _) = tracker(redis.url(), options("node-a", "timed"));
    for agent in 1..=agents {
        node.register(agent);
        node.connection_up(record(agent, 1, "node-a"));
    }
    let indexed = || -> i64 {
        let reply = redis.command(&["SCARD", "timed:tunnel:agents"]).unwrap();
        reply.trim_start_matches(':').trim().parse().unwrap()
    };
    assert!(wait_until(Duration::from_secs(120), || indexed() == agents));
    for round in 1..=2 {
        let started = Instant::now();
        let (mut after, mut listed, mut pages) = (None, 0, 0u32);
        loop {
            let page = block_on(node.list_connections(after.clone(), PAGE)).unwrap();
            listed += page.len();
            pages += 1;
            if page.len() < PAGE {
                break;
            }
            after = page.last().map(sluice_tracker::ConnectionRecord::key);
        }
        let took = started.elapsed();
        assert_eq!(listed, agents as usize);
        println!(
            "round {round}: {agents} agents listed in {pages} pages in {took:?} ({:?} per page)",
            took / pages
        );
    }
}
