//! The reverse tunnel end to end with real processes: `sluice run` (node), `sluice agent`, a
//! Python grpcio backend behind the agent and Python grpcio + PyJWT clients.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{client_args, metric, start_agent, start_node, wait_for_idle_tunnels, Secrets};
use serde_json::Value;
use test_support::{
    on_both_drivers, spawn_tunnel_client, tunnel_client, Certificates, GrpcBackend,
};

// Every case below runs once per monoio driver (the nodes and agents of a case share it).
on_both_drivers!(
    a_client_cancel_reaches_the_backend_and_deadlines_are_enforced,
    a_request_waits_for_its_agent_and_an_absent_agent_times_out,
    killing_the_agent_mid_stream_ends_the_call_with_unavailable_and_others_keep_working,
    every_bad_credential_is_refused_and_counted,
    two_hundred_clients_times_fifty_calls_through_a_pool_of_twenty,
    the_tunnel_runs_over_tls_on_both_sides,
);

#[test]
fn calls_of_every_shape_cross_the_tunnel_on_io_uring() {
    calls_of_every_shape("uring");
}

#[test]
fn calls_of_every_shape_cross_the_tunnel_on_legacy() {
    calls_of_every_shape("legacy");
}

fn calls_of_every_shape(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = common::start_node_on(
        &secrets,
        "20s",
        32 * 1024 * 1024,
        None,
        driver,
        "",
        "",
        None,
    );
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);

    let result = tunnel_client("shapes", &client_args(&node, &secrets, 7));
    assert_eq!(result["unary"], "hello", "{result}");
    assert_eq!(
        result["initial_metadata"], "r-42",
        "request metadata reached the backend and came back: {result}"
    );
    assert_eq!(result["trailing_metadata"], "done", "{result}");
    assert_eq!(result["server_stream_count"], 10_000, "{result}");
    assert_eq!(result["server_stream_in_order"], true, "{result}");
    let expected_total: usize = (1..=100).sum();
    assert_eq!(
        result["client_stream"],
        format!("100:{expected_total}"),
        "{result}"
    );
    assert_eq!(result["bidi"], true, "{result}");
    assert_eq!(
        result["big_echo"], true,
        "a 16 MiB message went there and back: {result}"
    );
    assert_eq!(result["big_size"], 16 * 1024 * 1024, "{result}");
    assert_eq!(result["fail"]["code"], "NOT_FOUND", "{result}");
    assert_eq!(result["fail"]["details"], "nope", "{result}");
    assert_eq!(result["fail_trailer"], "test", "{result}");

    let ok = metric(
        &node,
        "sluice_tunnel_requests_total{method=\"/test.Echo/Unary\",code=\"OK\"}",
    );
    assert_eq!(ok, Some(2.0), "unary and the 16 MiB echo were counted");
    let listed = tunnel_client("list-agents", &client_args(&node, &secrets, 7));
    let bytes = listed["bytes"].as_str().unwrap();
    assert!(
        !bytes.is_empty(),
        "ListConnectedAgents answered with at least one agent"
    );
    // agent_id = 7 is field 1 varint inside the first ConnectedAgent (field 1 of the response).
    assert!(bytes.starts_with("0a") && bytes.contains("0807"), "{bytes}");
    assert!(
        bytes.contains(&hex_of("test-node")),
        "the node name is reported: {bytes}"
    );
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|byte| format!("{byte:02x}")).collect()
}

fn a_client_cancel_reaches_the_backend_and_deadlines_are_enforced(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "20s", 32 * 1024 * 1024, None);
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);

    let mut args = client_args(&node, &secrets, 7);
    let started = backend.hang_started_file();
    args.extend(["--cancel-when".into(), started.display().to_string()]);
    let cancelled = tunnel_client("cancel", &args);
    assert_eq!(cancelled["reached_backend"], true, "{cancelled}");
    assert_eq!(cancelled["cancelled"], true, "{cancelled}");
    assert!(
        backend.saw_cancellation(Duration::from_secs(10)),
        "the backend saw the client's cancel"
    );

    let mut args = client_args(&node, &secrets, 7);
    args.extend(["--timeout".into(), "1.0".into()]);
    let expired = tunnel_client("deadline", &args);
    assert_eq!(expired["code"], "DEADLINE_EXCEEDED", "{expired}");
    // The bound is the behaviour (the node enforces the client's 1 s deadline instead of
    // waiting for the backend's 1 s delay plus more); 2 s of margin for a loaded machine.
    assert!(expired["elapsed"].as_f64().unwrap() < 3.0, "{expired}");
}

fn a_request_waits_for_its_agent_and_an_absent_agent_times_out(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "4s", 32 * 1024 * 1024, None);

    // Sent before agent 7 connects; the agent arrives 2 s later.
    let mut args = client_args(&node, &secrets, 7);
    args.extend([
        "--timeout".into(),
        "15".into(),
        "--payload".into(),
        "early".into(),
    ]);
    let early = spawn_tunnel_client("unary", &args);
    // grpcio connects on its first call: once the external listener accepted it, the call is
    // waiting (Python's start-up time varies too much to sleep blindly).
    assert!(test_support::wait_until(
        Duration::from_secs(10),
        || metric(
            &node,
            "sluice_connections_accepted_total{listener=\"external\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    ));
    // Not a synchronisation: the scenario is an agent that arrives 2 s after the call (the
    // call is known to wait already, above), and the bound below checks the call waited.
    std::thread::sleep(Duration::from_secs(2));
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    let output = early.wait_with_output().unwrap();
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["code"], "OK", "{result}");
    assert_eq!(result["reply"], "early", "{result}");
    assert!(
        result["elapsed"].as_f64().unwrap() >= 1.5,
        "it really waited: {result}"
    );

    // Agent 8 never connects: the call ends after tunnel.max_wait (4 s) naming the agent.
    let mut args = client_args(&node, &secrets, 8);
    args.extend(["--timeout".into(), "30".into()]);
    let absent = tunnel_client("unary", &args);
    assert_eq!(absent["code"], "DEADLINE_EXCEEDED", "{absent}");
    assert!(
        absent["details"].as_str().unwrap().contains("agent 8"),
        "{absent}"
    );
    let elapsed = absent["elapsed"].as_f64().unwrap();
    // The bound is the behaviour: max_wait (4 s) ends the call, not the client's 30 s
    // timeout; 0.5 s below for clock granularity, 6 s above for a loaded machine.
    assert!(
        (3.5..10.0).contains(&elapsed),
        "ended by max_wait: {absent}"
    );
}

fn killing_the_agent_mid_stream_ends_the_call_with_unavailable_and_others_keep_working(
    driver: &str,
) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "5s", 32 * 1024 * 1024, None);
    let doomed = start_agent(&secrets, 7, &node, backend.address, 20, None);
    let _survivor = start_agent(&secrets, 8, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 4.0);

    let mut stream = spawn_tunnel_client("slow-stream", &client_args(&node, &secrets, 7));
    let mut stdout = BufReader::new(stream.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("streaming"), "the stream was flowing: {line}");
    let killed_at = std::time::SystemTime::now();
    doomed.signal(libc::SIGKILL);
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let ended: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ended["code"], "UNAVAILABLE", "{ended}");
    let killed_at = killed_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let took = ended["ended_at"].as_f64().unwrap() - killed_at;
    // The bound is the behaviour: the node notices the agent's connection closing at once
    // (no keepalive timeout, which would take many seconds); 1 s is far above the expected
    // few milliseconds and far below any timer-based detection.
    assert!(
        took < 1.0,
        "the client heard within 1 s ({took:.3} s): {ended}"
    );
    let _ = stream.wait();

    let other = tunnel_client("unary", &client_args(&node, &secrets, 8));
    assert_eq!(other["code"], "OK", "agent 8 still served: {other}");
}

fn every_bad_credential_is_refused_and_counted(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "5s", 32 * 1024 * 1024, None);
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);

    let mut args = client_args(&node, &secrets, 7);
    args.extend(["--agent-token".into(), secrets.token(8).to_string()]);
    let results = tunnel_client("auth-matrix", &args);
    for case in [
        "no_token",
        "wrong_secret",
        "expired",
        "wrong_issuer",
        "wrong_audience",
        "alg_none",
        "agent_token",
        "garbage",
    ] {
        let code = results[case]["code"].as_str().unwrap();
        assert_eq!(code, "UNAUTHENTICATED", "{case}: {}", results[case]);
    }
    assert_eq!(
        results["missing_agent_id"]["code"], "INVALID_ARGUMENT",
        "{results}"
    );
    assert_eq!(
        results["malformed_agent_id"]["code"], "INVALID_ARGUMENT",
        "{results}"
    );
    // alg "none" and garbage are not well-formed HS256 JWTs: reason invalid_token.
    for reason in [
        "missing",
        "bad_signature",
        "expired",
        "wrong_issuer",
        "wrong_audience",
        "invalid_token",
    ] {
        let series = format!(
            "sluice_tunnel_auth_failures_total{{endpoint=\"external\",reason=\"{reason}\"}}"
        );
        assert!(
            metric(&node, &series).unwrap_or(0.0) >= 1.0,
            "{series} counted"
        );
    }
    // Refused before authentication: counted, but the client's method never becomes a label.
    let unauthenticated = metric(
        &node,
        "sluice_tunnel_requests_total{method=\"unauthenticated\",code=\"UNAUTHENTICATED\"}",
    );
    assert!(unauthenticated.unwrap_or(0.0) >= 7.0, "{unauthenticated:?}");
    let labelled = metric(
        &node,
        "sluice_tunnel_requests_total{method=\"/test.Echo/Unary\",code=\"UNAUTHENTICATED\"}",
    );
    assert_eq!(
        labelled, None,
        "an unauthenticated caller's method became a label"
    );

    // An agent with a token the node does not know is refused and counted on the agent endpoint.
    let impostor_secrets = Secrets::on(driver);
    let _impostor = start_agent(&impostor_secrets, 7, &node, backend.address, 20, None);
    let agent_refusals =
        "sluice_tunnel_auth_failures_total{endpoint=\"agent\",reason=\"unknown_agent_token\"}";
    assert!(
        test_support::wait_until(Duration::from_secs(10), || metric(&node, agent_refusals)
            .unwrap_or(0.0)
            >= 1.0),
        "{agent_refusals}"
    );
}

fn two_hundred_clients_times_fifty_calls_through_a_pool_of_twenty(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "30s", 32 * 1024 * 1024, None);
    let _agent = start_agent(&secrets, 7, &node, backend.address, 20, None);
    wait_for_idle_tunnels(&node, 2.0);
    let mut args = client_args(&node, &secrets, 7);
    args.extend([
        "--clients".into(),
        "200".into(),
        "--requests".into(),
        "50".into(),
    ]);
    let started = Instant::now();
    let mut client = spawn_tunnel_client("concurrency", &args);
    // The pool's bound holds at its peak, not only once the load is gone: sample the gauge
    // while the calls run (every scrape is a moment of the load; the last comes after it).
    let mut samples = Vec::new();
    let status = loop {
        if let Some(status) = client.try_wait().unwrap() {
            break status;
        }
        samples.push(metric(&node, "sluice_tunnel_connected_tunnels").unwrap());
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut client.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{stdout}");
    let result: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|error| panic!("not JSON ({error}): {stdout}"));
    assert_eq!(result["calls"], 10_000, "{result}");
    assert_eq!(result["mismatches"], 0, "{result}");
    let peak = samples.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "10,000 calls in {:?}; connected tunnels peaked at {peak} over {} samples",
        started.elapsed(),
        samples.len()
    );
    assert!(
        samples.len() >= 10,
        "too few samples of the load: {samples:?}"
    );
    assert!(
        peak <= 20.0,
        "the pool went past max at its peak: {samples:?}"
    );
    assert!(
        metric(&node, "sluice_tunnel_connected_tunnels").unwrap() <= 20.0,
        "the pool stayed within max"
    );
}

fn the_tunnel_runs_over_tls_on_both_sides(driver: &str) {
    let certs = Certificates::generate(&[]).expect("certificates");
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = start_node(&secrets, "10s", 32 * 1024 * 1024, Some(&certs));
    let _agent = start_agent(
        &secrets,
        7,
        &node,
        backend.address,
        20,
        Some(&certs.ca_cert),
    );
    wait_for_idle_tunnels(&node, 2.0);
    let mut args = client_args(&node, &secrets, 7);
    // The certificate names localhost.
    args[1] = format!("localhost:{}", node.address("external").port());
    args.extend([
        "--ca-file".into(),
        certs.ca_cert.display().to_string(),
        "--payload".into(),
        "over tls".into(),
    ]);
    let result = tunnel_client("unary", &args);
    assert_eq!(result["code"], "OK", "{result}");
    assert_eq!(result["reply"], "over tls", "{result}");
}
