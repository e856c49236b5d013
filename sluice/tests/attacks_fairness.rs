//! Fair share under hostile load (issue 32, finding 1), against the real `sluice` binary in
//! front of the apiserver simulator: one well-authenticated but greedy user opens thousands of
//! watches through the gateway. It gets its long-running budget and 429 Statuses past it; other
//! users' GETs keep their latency, and new bearer-token users still authenticate, because the
//! gateway's TokenReviews ride connections client traffic never holds. Also: upgrades of all
//! users together stop at the cluster's budget, and a user waiting for a stream waits one turn
//! behind a greedy user, not behind its whole queue. See docs/SECURITY.md, "Gateway", "Shared
//! resources"; the rig is in `fairness/rig.rs`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::mpsc;
use std::time::Duration;

use test_support::on_both_drivers;

#[path = "fairness/rig.rs"]
mod rig;
use rig::*;

// Every case runs once per monoio driver.
on_both_drivers!(
    a_user_with_thousands_of_watches_gets_its_budget_and_starves_nobody,
    token_reviews_pass_even_when_watches_hold_every_client_stream,
    upgrades_of_all_users_together_stop_at_the_clusters_budget,
    a_user_waiting_for_a_stream_waits_one_turn_behind_a_greedy_one,
    many_users_within_their_budgets_still_leave_half_the_streams,
);

/// Starts the greedy user's `WATCHES` and waits until every one is answered, each with its
/// watch or a fair-share 429 (nothing else); what it got, and the sender that ends its watches.
fn greedy_holds_watches(rig: &Rig) -> (Greedy, mpsc::Sender<()>) {
    let (report, reported) = mpsc::channel();
    let (stop, stopped) = mpsc::channel();
    start_greedy(
        Client::new(rig, Some(&rig.greedy)),
        WATCHES,
        report,
        stopped,
    );
    let greedy = reported
        .recv_timeout(ANSWER_WITHIN + Duration::from_secs(30))
        .expect("the greedy user's watches were all answered");
    assert!(
        greedy.other.is_empty(),
        "{:?}",
        &greedy.other[..greedy.other.len().min(5)]
    );
    (greedy, stop)
}

/// The acceptance case of finding 1. With the defaults but a per-user budget of 40
/// long-running requests per core: the greedy user's 2,200 watches give it at most 80 (two
/// cores), every other one a 429 Status at once; alice's GETs keep a p99 under 100 ms (the
/// issue's figure; measured here about 2 ms, a margin of some 50 times on a noisy 2-core
/// machine, over 400 GETs); new token users authenticate. Before fair shares the first 200 watches per
/// core took every stream to the apiserver and everything behind them (the rest of the watches,
/// alice's GETs, the TokenReviews) waited inside the pool until it timed out.
fn a_user_with_thousands_of_watches_gets_its_budget_and_starves_nobody(driver: &str) {
    let (workers, per_user) = (2, 40);
    let rig = start(
        driver,
        workers,
        &format!("{{maxConnectionsPerServer: 2, maxLongRunningPerUser: {per_user}}}"),
    );
    rig.server.create_pod("default", "web");
    let tokens = add_token_users(&rig.server, "newcomer", 20);
    let (greedy, stop) = greedy_holds_watches(&rig);
    let budget = per_user * workers;
    assert!(
        (per_user..=budget).contains(&greedy.accepted),
        "the greedy user holds {} watches; its budget is {per_user} per core",
        greedy.accepted
    );
    assert_eq!(greedy.accepted + greedy.refused, GREEDY_WATCHES);
    assert_eq!(
        rig.server.watchers("pods"),
        greedy.accepted,
        "only the accepted watches reached the apiserver"
    );

    // While the greedy user holds its watches: alice's GETs and new token users.
    let alice = Client::new(&rig, Some(&rig.alice));
    let anonymous = Client::new(&rig, None);
    let reviews_before = rig.server.token_review_calls();
    let (latencies, statuses) = runtime().block_on(async {
        let latencies = alice_gets(&alice, 400).await;
        (latencies, statuses(&token_users(&anonymous, &tokens).await))
    });
    let mut latencies = latencies.expect("every GET of alice answered 200");
    let p99 = p99(&mut latencies);
    eprintln!(
        "alice's GETs while the greedy user holds {} watches: p99 {p99:?}, max {:?}",
        greedy.accepted,
        latencies.last().unwrap()
    );
    assert!(p99 < Duration::from_millis(100), "alice's p99 is {p99:?}");
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
    assert!(rig.server.token_review_calls() >= reviews_before + tokens.len());

    // Counted by level and reason; the user's name is no label.
    let refused = fair_share_refused(&rig.process, "user_long_running");
    assert_eq!(refused, greedy.refused as f64);
    assert_eq!(
        metric(
            &rig.process,
            "sluice_gateway_rejected_total{reason=\"fair_share\"}"
        ),
        greedy.refused as f64
    );
    assert!(!metrics(&rig.process).contains("greedy"));
    stop.send(()).unwrap();
}

/// Reserved capacity, isolated: one core with one client connection to the simulator (200
/// streams), and watches may take every client stream (`longRunningStreamsPercent: 100`), so
/// the greedy user's watches hold all of them. A GET then waits its bounded turn and gets a 429
/// Status (`maxQueueWait`); new token users still authenticate, on the reserved review
/// connection, and then wait their bounded turn like alice (a 429, not the 503 of an
/// unavailable review nor the 401 of a rejected token); once the watches end all are served.
/// Before, the TokenReviews queued behind the watches and the users got 503s.
fn token_reviews_pass_even_when_watches_hold_every_client_stream(driver: &str) {
    let rig = start(
        driver,
        1,
        "{connectionsPerServer: 1, maxConnectionsPerServer: 1, longRunningStreamsPercent: 100, maxLongRunningPerUser: 5000, maxQueueWait: 300ms}",
    );
    rig.server.create_pod("default", "web");
    let tokens = add_token_users(&rig.server, "late", 3);
    let alice = Client::new(&rig, Some(&rig.alice));
    // One GET first: the core learns the simulator's stream limit from its SETTINGS (until
    // then it assumes h2's 100 per connection).
    let warm_up = runtime().block_on(async {
        let send = alice.connect().await;
        ask(&send, get("/api/v1/namespaces/default/pods", None), false).await
    });
    assert_eq!(warm_up.map(|answer| answer.status), Some(200));
    let (greedy, stop) = greedy_holds_watches(&rig);
    assert_eq!(
        greedy.accepted, SERVER_STREAMS as usize,
        "watches hold every client stream"
    );
    assert_eq!(
        fair_share_refused(&rig.process, "server_long_running"),
        greedy.refused as f64
    );

    let anonymous = Client::new(&rig, None);
    let reviews_before = rig.server.token_review_calls();
    let pods = "/api/v1/namespaces/default/pods";
    let (alice_answer, newcomers) = runtime().block_on(async {
        let send = alice.connect().await;
        let alice_answer = ask(&send, get(pods, None), false).await;
        (alice_answer, token_users(&anonymous, &tokens).await)
    });
    let waited_turn =
        |answer: &Answer| is_fair_share_status(answer) && answer.body.contains("queue wait limit");
    let alice_answer = alice_answer.expect("alice is answered within the queue wait");
    assert!(waited_turn(&alice_answer), "{}", alice_answer.body);
    for answer in &newcomers {
        let answer = answer.as_ref().expect("a token user is answered");
        assert!(waited_turn(answer), "{}: {}", answer.status, answer.body);
    }
    // Their tokens were reviewed upstream (on the reserved connection: every client stream
    // was held) and accepted, or they would have had a 503 or a 401.
    assert_eq!(
        rig.server.token_review_calls(),
        reviews_before + tokens.len()
    );
    assert_eq!(
        fair_share_refused(&rig.process, "queue_wait"),
        (1 + tokens.len()) as f64
    );

    // The watches end: everyone is served again, the tokens from the cache.
    stop.send(()).unwrap();
    assert!(test_support::wait_until(Duration::from_secs(10), || {
        rig.server.watchers("pods") == 0
    }));
    let after = runtime().block_on(async { token_users(&anonymous, &tokens).await });
    assert_eq!(statuses(&after), vec![200; tokens.len()]);
    assert_eq!(
        rig.server.token_review_calls(),
        reviews_before + tokens.len()
    );
}

/// Upgrades hold a connection each to an apiserver, so all users' together have a budget per
/// core (`maxUpgradeConnections`), whatever each user's own: past it a 429 Status, counted; a
/// closed upgrade frees its slot.
fn upgrades_of_all_users_together_stop_at_the_clusters_budget(driver: &str) {
    use std::io::Read;
    let rig = start(
        driver,
        1,
        "{maxConnectionsPerServer: 2, maxUpgradeConnections: 2}",
    );
    let (first, head) = exec_upgrade(&rig);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let (_second, head) = exec_upgrade(&rig);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let (mut third, head) = exec_upgrade(&rig);
    assert!(head.starts_with("HTTP/1.1 429 "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    let mut body = String::new();
    let _ = third.read_to_string(&mut body);
    assert!(body.contains("\"reason\":\"TooManyRequests\""), "{body}");
    assert!(body.contains("exec, attach and port-forward"), "{body}");
    assert_eq!(fair_share_refused(&rig.process, "cluster_upgrades"), 1.0);
    // The first upgrade ends: its slot is free again.
    drop(first);
    assert!(test_support::wait_until(Duration::from_secs(10), || {
        exec_upgrade(&rig).1.starts_with("HTTP/1.1 101 ")
    }));
}

/// Fair queueing, end to end: the apiserver answers reads slowly (400 ms: a big list), one
/// core has 200 streams to it, and the greedy user sends 600 GETs at once, so 400 of them wait
/// in its queue. Alice's one GET then reaches the apiserver after at most one turn of the
/// greedy user's, not behind its 400 (first come, first served, as h2's own queue did before,
/// puts them all before her). Asserted on the order the apiserver saw, not on a clock.
fn a_user_waiting_for_a_stream_waits_one_turn_behind_a_greedy_one(driver: &str) {
    let rig = start(
        driver,
        1,
        "{connectionsPerServer: 1, maxConnectionsPerServer: 1}",
    );
    rig.server.create_pod("default", "web");
    let alice = Client::new(&rig, Some(&rig.alice));
    let pods = "/api/v1/namespaces/default/pods";
    // The core learns the simulator's stream limit from a first answer.
    let warm_up =
        runtime().block_on(async { ask(&alice.connect().await, get(pods, None), false).await });
    assert_eq!(warm_up.map(|answer| answer.status), Some(200));
    rig.server.set_read_delay(Duration::from_millis(400));
    let (report, reported) = mpsc::channel();
    let (_stop, stopped) = mpsc::channel();
    let load = Load {
        path: "/api/v1/namespaces/default/pods",
        count: 600,
        watch: false,
    };
    start_greedy(Client::new(&rig, Some(&rig.greedy)), load, report, stopped);
    let waiting =
        format!("sluice_gateway_fair_queue_waiting{{cluster=\"{HOST}\",level=\"(none)\"}}");
    assert!(
        test_support::wait_until(Duration::from_secs(10), || metric(&rig.process, &waiting)
            >= 350.0),
        "the greedy user's requests queue: {}",
        metric(&rig.process, &waiting)
    );
    // Connected first, so that the snapshot is taken just before her request leaves.
    let (before, answer) = runtime().block_on(async {
        let send = alice.connect().await;
        let before = rig.server.requests().len();
        (before, ask(&send, get(pods, None), false).await)
    });
    assert_eq!(answer.map(|answer| answer.status), Some(200));
    let seen: Vec<_> = rig.server.requests().into_iter().skip(before).collect();
    let alices = seen
        .iter()
        .position(|request| request.impersonate_user.as_deref() == Some("alice"))
        .expect("alice's GET reached the apiserver");
    let greedy_first = seen[..alices]
        .iter()
        .filter(|request| request.impersonate_user.as_deref() == Some("greedy"))
        .count();
    // One turn (usually 0 or 1 are counted). When a batch of streams happened to free in the
    // instant between the snapshot and her request's arrival, its 200 grants to the greedy user
    // count too; still under 250, while a first-come queue puts the 350 or more already waiting
    // before her (403 when tried with alice's request sent as the greedy user).
    assert!(
        greedy_first < 250,
        "{greedy_first} of the greedy user's requests reached the apiserver before alice's"
    );
    let greedy = reported
        .recv_timeout(ANSWER_WITHIN + Duration::from_secs(30))
        .expect("the greedy user's requests were all answered");
    assert_eq!(
        greedy.accepted,
        load.count,
        "{:?}",
        &greedy.other[..greedy.other.len().min(5)]
    );
    assert!(metric(&rig.process, "sluice_gateway_fair_queue_wait_seconds_count") >= 400.0);
}

/// The variation with many principals: twenty users with twenty watches each, every one
/// within its own budget (100 per core). Together they still get only their share of the
/// core's 200 streams (`longRunningStreamsPercent`: 50), the rest 429 at once, and alice's GETs
/// and a new token user are served on the other half.
fn many_users_within_their_budgets_still_leave_half_the_streams(driver: &str) {
    let (users, watches) = (20, 20);
    let rig = start(
        driver,
        1,
        "{connectionsPerServer: 1, maxConnectionsPerServer: 1}",
    );
    rig.server.create_pod("default", "web");
    let tokens = add_token_users(&rig.server, "another", 1);
    let alice = Client::new(&rig, Some(&rig.alice));
    let pods = "/api/v1/namespaces/default/pods";
    // The core learns the simulator's stream limit (200) from a first answer.
    let warm_up =
        runtime().block_on(async { ask(&alice.connect().await, get(pods, None), false).await });
    assert_eq!(warm_up.map(|answer| answer.status), Some(200));
    let (report, reported) = mpsc::channel();
    let mut stops = Vec::new();
    for user in 0..users {
        let cert = rig
            .certs
            .client(&format!("watcher-{user}"), &["dev-team"])
            .unwrap();
        let (stop, stopped) = mpsc::channel();
        stops.push((stop, cert.clone()));
        let load = Load {
            count: watches,
            ..WATCHES
        };
        start_greedy(
            Client::new(&rig, Some(&cert)),
            load,
            report.clone(),
            stopped,
        );
    }
    let mut accepted = 0;
    let mut refused = 0;
    for _ in 0..users {
        let got = reported
            .recv_timeout(ANSWER_WITHIN + Duration::from_secs(30))
            .expect("every user's watches were answered");
        assert!(
            got.other.is_empty(),
            "{:?}",
            &got.other[..got.other.len().min(5)]
        );
        accepted += got.accepted;
        refused += got.refused;
    }
    let share = SERVER_STREAMS as usize / 2;
    assert_eq!(
        accepted, share,
        "the long-running share of the core's streams"
    );
    assert_eq!(refused, users * watches - share);
    assert_eq!(
        fair_share_refused(&rig.process, "server_long_running"),
        refused as f64
    );
    assert_eq!(rig.server.watchers("pods"), share);
    let anonymous = Client::new(&rig, None);
    let (latencies, newcomer) = runtime().block_on(async {
        (
            alice_gets(&alice, 50).await,
            token_users(&anonymous, &tokens).await,
        )
    });
    assert_eq!(latencies.expect("alice is served").len(), 50);
    assert_eq!(statuses(&newcomer), vec![200]);
    for (stop, _) in stops {
        let _ = stop.send(());
    }
}
