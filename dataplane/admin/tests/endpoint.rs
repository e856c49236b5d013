//! The admin endpoint over real sockets: routes, statuses, limits, keep-alive, metrics.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{default_options, start, LineClient, DRIVERS};
use sluice_admin::AdminOptions;
use test_support::http_get;

fn raw_exchange(address: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).expect("connect to admin");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set read timeout");
    stream.write_all(request).expect("send request");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

#[test]
fn routes_answer_with_the_right_statuses_on_each_driver() {
    for driver in DRIVERS {
        let harness = start(driver, Duration::ZERO, default_options());
        let admin = harness.admin;

        let health = http_get(admin, "/healthz").unwrap();
        assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
        let ready = http_get(admin, "/readyz?verbose").unwrap();
        assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
        let index = http_get(admin, "/").unwrap();
        assert!(index.body.contains("/metrics"));
        let missing = http_get(admin, "/nope").unwrap();
        assert_eq!(missing.status, 404);
        assert!(missing.body.contains("\"/nope\""), "{}", missing.body);

        // Data-plane traffic shows up in the per-listener and per-worker counters.
        for _ in 0..8 {
            let mut client = LineClient::connect(harness.data).unwrap();
            assert!(client.call("ping").unwrap().starts_with("pong"));
        }
        let stats = harness.data_stats.clone();
        assert!(test_support::wait_until(Duration::from_secs(5), || stats
            .requests
            .sum()
            == 8));
        let metrics = http_get(admin, "/metrics").unwrap();
        assert_eq!(metrics.status, 200);
        assert!(
            metrics
                .head
                .contains("Content-Type: application/openmetrics-text"),
            "{}",
            metrics.head
        );
        let text = metrics.body;
        let revision = sluice_admin::REVISION;
        // Built from this git checkout: the commit, abbreviated.
        assert!(
            revision.len() == 12 && revision.bytes().all(|b| b.is_ascii_hexdigit()),
            "{revision}"
        );
        let build = format!(
            "sluice_build_info{{version=\"9.9.9\",revision=\"{revision}\",driver=\"{driver}\"}}"
        );
        assert_eq!(metric_value(&text, &build), Some(1.0), "{text}");
        assert_eq!(metric_value(&text, "sluice_workers"), Some(2.0), "{text}");
        assert_eq!(
            metric_value(
                &text,
                "sluice_connections_accepted_total{listener=\"echo\"}"
            ),
            Some(8.0),
            "{text}"
        );
        assert_eq!(
            metric_value(&text, "sluice_requests_total{listener=\"echo\"}"),
            Some(8.0),
            "{text}"
        );
        let per_worker: f64 = (0..2)
            .filter_map(|worker| {
                metric_value(
                    &text,
                    &format!("sluice_worker_requests_total{{worker=\"{worker}\"}}"),
                )
            })
            .sum();
        assert_eq!(per_worker, 8.0, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        harness.running.shutdown();
    }
}

#[test]
fn bad_requests_get_clear_statuses_and_are_counted_on_each_driver() {
    for driver in DRIVERS {
        bad_requests_get_clear_statuses_and_are_counted(driver);
    }
}

fn bad_requests_get_clear_statuses_and_are_counted(driver: sluice_runtime::Driver) {
    let harness = start(driver, Duration::ZERO, default_options());
    let admin = harness.admin;

    let post = raw_exchange(
        admin,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    );
    assert!(post.starts_with("HTTP/1.1 413 "), "{driver}: {post}");
    let delete = raw_exchange(
        admin,
        b"DELETE /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(
        delete.starts_with("HTTP/1.1 405 ") && delete.contains("Allow: GET, HEAD"),
        "{driver}: {delete}"
    );
    let garbage = raw_exchange(
        admin,
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",
    );
    assert!(garbage.starts_with("HTTP/1.1 400 "), "{driver}: {garbage}");
    let huge = format!("GET /{} HTTP/1.1\r\n", "a".repeat(20_000));
    let too_large = raw_exchange(admin, huge.as_bytes());
    assert!(
        too_large.starts_with("HTTP/1.1 431 "),
        "{driver}: {too_large}"
    );
    let head = raw_exchange(
        admin,
        b"HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(
        head.starts_with("HTTP/1.1 200 ")
            && head.contains("Content-Length: 3")
            && head.ends_with("\r\n\r\n"),
        "{driver}: {head:?}"
    );

    let text = http_get(admin, "/metrics").unwrap().body;
    for (reason, count) in [
        ("body", 1.0),
        ("method", 1.0),
        ("malformed", 1.0),
        ("too_large", 1.0),
    ] {
        let series = format!("sluice_admin_bad_requests_total{{reason=\"{reason}\"}}");
        assert_eq!(
            metric_value(&text, &series),
            Some(count),
            "{driver}: {series} in {text}"
        );
    }
    harness.running.shutdown();
}

#[test]
fn keep_alive_serves_pipelined_requests_and_slow_heads_time_out_on_each_driver() {
    for driver in DRIVERS {
        keep_alive_serves_pipelined_requests_and_slow_heads_time_out(driver);
    }
}

fn keep_alive_serves_pipelined_requests_and_slow_heads_time_out(driver: sluice_runtime::Driver) {
    let options = AdminOptions {
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(500),
    };
    let harness = start(driver, Duration::ZERO, options);
    let admin = harness.admin;

    let pipelined = raw_exchange(
        admin,
        b"GET /healthz HTTP/1.1\r\n\r\nGET /readyz HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        pipelined.matches("HTTP/1.1 200 OK").count(),
        2,
        "{driver}: {pipelined}"
    );
    assert!(
        pipelined.contains("Connection: keep-alive") && pipelined.ends_with("ready\n"),
        "{driver}: {pipelined}"
    );

    // A head that never completes gets 408 after the header timeout.
    let slow = raw_exchange(admin, b"GET /healthz HTTP/1.1\r\nX-Slow: ");
    assert!(slow.starts_with("HTTP/1.1 408 "), "{driver}: {slow}");

    // An idle kept-alive connection is closed after the idle timeout.
    let mut idle = TcpStream::connect(admin).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let started = std::time::Instant::now();
    idle.read_to_end(&mut reply).unwrap();
    assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200 "));
    // The bound is the behaviour: the 500 ms idle timeout closes it, not the client's 5 s
    // read timeout; 3.5 s of margin.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{driver}: closed by the idle timeout, not the client"
    );
    harness.running.shutdown();
}
