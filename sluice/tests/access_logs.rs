//! Access logs (docs/OPERATIONS.md, "Access logs"): with `access_log.enabled` the gateway and
//! the tunnel node write one JSON line per request through the process's log, sampled one in N
//! with every error kept, the client's text bounded and escaped. Real processes, real clients
//! (curl for the gateway, grpcio for the tunnel), on both monoio drivers.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::time::Duration;

use common::{client_args, metric, start_agent, wait_for_idle_tunnels, Secrets};
use serde_json::Value;
use test_support::{
    code_and_body, gateway_config_yaml, gateway_curl, on_both_drivers, run_on_driver,
    tunnel_client, upstream_cluster_yaml, wait_until, write_clusters_dir, ApiServer, Certificates,
    GrpcBackend, SluiceLauncher, SluiceProcess, HEALTH_CHECK_FAST, SERVE_LOOPBACK,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const HOST: &str = "kube.sluice.test";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// Two HTTP/1.1 requests as alice: an exec upgrade (closed once upgraded) and a GET whose
/// request line carries raw bytes that are not UTF-8. Prints each answer's status line.
const HTTP1_CLIENT: &str = r#"
import socket, ssl, sys
port, sni, ca, cert, key = sys.argv[1:6]
def connect():
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return context.wrap_socket(socket.create_connection(("127.0.0.1", int(port))), server_hostname=sni)
def status_line(conn, request):
    conn.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    conn.close()
    return head.split(b"\r\n")[0].decode()
host = b"Host: " + sni.encode() + b"\r\n"
print(status_line(connect(), b"POST /api/v1/namespaces/default/pods/web-1/exec?command=sh HTTP/1.1\r\n" + host
                  + b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Request-Id: exec-1\r\n\r\n"))
print(status_line(connect(), b"GET /api/v1/namespaces/default/pods/a\xff\xfe\x7fb HTTP/1.1\r\n" + host + b"\r\n"))
"#;

on_both_drivers!(
    the_gateway_logs_each_request_with_who_what_where_and_how_it_ended,
    the_tunnel_logs_each_call_with_its_agent_route_and_code,
);

/// The access lines a process wrote so far, parsed.
fn access_lines(process: &SluiceProcess) -> Vec<Value> {
    process
        .stderr()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "sluice::access")
        .collect()
}

/// Waits until `process` logged at least `count` access lines, then returns them all.
fn wait_for_lines(process: &SluiceProcess, count: usize) -> Vec<Value> {
    assert!(
        wait_until(Duration::from_secs(10), || access_lines(process).len()
            >= count),
        "{count} access lines expected; stderr:\n{}",
        process.stderr()
    );
    access_lines(process)
}

fn gateway_yaml(clusters_dir: &std::path::Path, driver: &str, access_log: &str) -> String {
    let yaml = gateway_config_yaml(
        driver,
        1,
        "",
        clusters_dir,
        &format!(", access_log: {access_log}"),
    );
    format!("logging: {{format: json}}\n{yaml}")
}

fn the_gateway_logs_each_request_with_who_what_where_and_how_it_ended(driver: &str) {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let cluster = upstream_cluster_yaml(
        HOST,
        &[server.url()],
        &certs,
        &identity,
        SERVE_LOOPBACK,
        HEALTH_CHECK_FAST,
    );
    let clusters_dir = write_clusters_dir(launcher.dir(), &cluster);
    let yaml = gateway_yaml(&clusters_dir, driver, "{enabled: true}");
    let config = launcher.write_file("gateway.yaml", &yaml).unwrap();
    let gateway = run_on_driver(launcher, &config, driver);
    let alice = certs.client("alice", &["dev-team"]).unwrap();
    let curl = |client, extra: &[&str], path: &str| {
        let options = ["--silent", "--http2", "--max-time", "10"];
        let output = gateway_curl(&gateway, HOST, &certs, client, &options, path)
            .args(["--write-out", "\n%{http_code}"])
            .args(extra)
            .output()
            .expect("curl is installed");
        code_and_body(&output).0
    };

    assert_eq!(
        curl(Some(&alice), &["-H", "X-Request-Id: req-42"], PODS),
        200
    );
    // No certificate, no token, no anonymous access: refused before authentication.
    assert_eq!(curl(None, &[], "/api/v1/secrets"), 401);
    // A hostile request: an 8 KB path with escaped control bytes and invalid UTF-8 (curl
    // sends raw bytes in a path percent-encoded), and raw invalid UTF-8, a quote and a
    // backslash in its request id.
    let hostile = format!("{PODS}/%0A%1B[31m%FF%C3%28{}", "x".repeat(8 * 1024));
    let options = ["--silent", "--http2", "--max-time", "10", "--globoff"];
    let output = gateway_curl(&gateway, HOST, &certs, Some(&alice), &options, &hostile)
        .args(["--write-out", "\n%{http_code}", "-H"])
        .arg(OsStr::from_bytes(b"X-Request-Id: id-\xff\xfe-\"q\"\\"))
        .output()
        .unwrap();
    assert!(code_and_body(&output).0 >= 400, "{output:?}");

    let lines = wait_for_lines(&gateway, 3);
    let [ok, refused, long] = &lines[..] else {
        panic!("three lines: {lines:#?}");
    };
    assert_eq!(ok["role"], "gateway", "{ok}");
    assert_eq!(ok["level"], "INFO", "{ok}");
    assert!(ok["timestamp"].is_string(), "{ok}");
    assert_eq!(ok["principal"], "alice", "{ok}");
    assert_eq!(ok["method"], "GET", "{ok}");
    assert_eq!(ok["path"], PODS, "{ok}");
    assert_eq!(ok["cluster"], HOST, "{ok}");
    assert_eq!(ok["upstream"], server.url().trim_end_matches('/'), "{ok}");
    assert_eq!(ok["status"], 200, "{ok}");
    assert_eq!(ok["request_id"], "req-42", "{ok}");
    assert_eq!(ok["client"], "127.0.0.1", "{ok}");
    assert!(ok["duration_us"].as_u64().unwrap() > 0, "{ok}");
    assert!(ok["response_bytes"].as_u64().is_some(), "{ok}");

    assert_eq!(refused["status"], 401, "{refused}");
    assert_eq!(refused["path"], "/api/v1/secrets", "{refused}");
    assert!(
        refused.get("principal").is_none() && refused.get("upstream").is_none(),
        "nobody was authenticated and nothing forwarded: {refused}"
    );

    let path = long["path"].as_str().unwrap();
    assert!(path.len() <= 512 + 32, "{} bytes: {path}", path.len());
    assert!(
        path.starts_with(&format!("{PODS}/%0A%1B[31m%FF%C3%28x")),
        "{path}"
    );
    assert_eq!(long["request_id"], "id-\\xFF\\xFE-\"q\"\\x5C", "{long}");
    let raw_line = gateway
        .stderr()
        .lines()
        .find(|line| line.contains("id-\\\\xFF"))
        .map(str::to_string)
        .unwrap();
    assert!(
        raw_line.bytes().all(|byte| (b' '..=b'~').contains(&byte)),
        "the line is printable ASCII: {raw_line}"
    );
    assert!(
        path.ends_with(&format!("...({} bytes)", hostile.len())),
        "{path}"
    );

    // HTTP/1.1: an exec upgrade, logged when its session ends, and a raw invalid UTF-8 byte in
    // a request line.
    let output = Command::new(test_support::python())
        .arg("-c")
        .arg(HTTP1_CLIENT)
        .arg(gateway.address("gateway").port().to_string())
        .arg(HOST)
        .args([&certs.ca_cert, &alice.cert, &alice.key])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {output:?}");
    let statuses: Vec<&str> = stdout.lines().collect();
    assert!(statuses[0].contains(" 101 "), "{stdout}");
    // hyper answers a request line that is not ASCII itself: it never reaches the gateway.
    assert!(statuses[1].contains(" 400 "), "{stdout}");
    let lines = wait_for_lines(&gateway, 4);
    let exec = &lines[3];
    assert_eq!(exec["method"], "POST", "{exec}");
    assert_eq!(
        exec["path"], "/api/v1/namespaces/default/pods/web-1/exec?command=sh",
        "{exec}"
    );
    assert_eq!(exec["status"], 101, "{exec}");
    assert_eq!(exec["principal"], "alice", "{exec}");
    assert_eq!(exec["request_id"], "exec-1", "{exec}");
    assert!(exec["upstream"].is_string(), "{exec}");

    // Sampled one in 4, errors always: a reload switches it live.
    let config_path = gateway.dir().join("gateway.yaml");
    let sampled = gateway_yaml(
        &clusters_dir,
        driver,
        "{enabled: true, sample: 4, errors_always: true}",
    );
    std::fs::write(&config_path, sampled).unwrap();
    gateway.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || metric(
        &gateway,
        "sluice_config_reloads_total{result=\"applied\"}"
    ) == Some(1.0)));
    let mut many = gateway_curl(
        &gateway,
        HOST,
        &certs,
        Some(&alice),
        &["--silent", "--http2", "--output", "/dev/null"],
        PODS,
    );
    for _ in 1..40 {
        many.arg(format!(
            "https://{HOST}:{}{PODS}",
            gateway.address("gateway").port()
        ));
    }
    assert!(many.status().unwrap().success());
    for _ in 0..3 {
        assert_eq!(curl(None, &[], PODS), 401);
    }
    let lines = wait_for_lines(&gateway, 4 + 10 + 3);
    std::thread::sleep(Duration::from_millis(200));
    let lines = access_lines(&gateway).len().max(lines.len());
    assert_eq!(lines, 4 + 10 + 3, "one in 4 of 40, and every 401");
    let written = "sluice_access_log_lines_total{role=\"gateway\"}";
    assert_eq!(metric(&gateway, written), Some(17.0));
    let dropped = "sluice_access_log_dropped_total{role=\"gateway\"}";
    assert_eq!(metric(&gateway, dropped), Some(0.0));
}

fn the_tunnel_logs_each_call_with_its_agent_route_and_code(driver: &str) {
    let secrets = Secrets::on(driver);
    let backend = GrpcBackend::start().expect("grpc backend");
    let node = common::start_node_on(
        &secrets,
        "1s",
        1024 * 1024,
        None,
        driver,
        "  access_log: {enabled: true}\n",
        "logging: {format: json}\n",
        None,
    );
    let _agent = start_agent(&secrets, 7, &node, backend.address, 4, None);
    wait_for_idle_tunnels(&node, 1.0);

    let ok = tunnel_client("unary", &client_args(&node, &secrets, 7));
    assert_eq!(ok["code"], "OK", "{ok}");
    let unknown = tunnel_client("unary", &client_args(&node, &secrets, 99));
    assert_ne!(unknown["code"], "OK", "{unknown}");
    let mut forged = client_args(&node, &secrets, 7);
    forged.extend(["--issuer".into(), "someone-else".into()]);
    let refused = tunnel_client("unary", &forged);
    assert_eq!(refused["code"], "UNAUTHENTICATED", "{refused}");

    let lines = wait_for_lines(&node, 3);
    let [ok_line, unknown_line, refused_line] = &lines[..] else {
        panic!("three lines: {lines:#?}");
    };
    assert_eq!(ok_line["role"], "tunnel", "{ok_line}");
    assert_eq!(ok_line["endpoint"], "external", "{ok_line}");
    assert_eq!(ok_line["grpc_method"], "/test.Echo/Unary", "{ok_line}");
    assert_eq!(ok_line["agent_id"], 7, "{ok_line}");
    assert_eq!(ok_line["route"], "local", "{ok_line}");
    assert_eq!(ok_line["grpc_code"], "OK", "{ok_line}");
    assert_eq!(ok_line["grpc_status"], 0, "{ok_line}");
    assert_eq!(ok_line["authenticated"], true, "{ok_line}");

    assert_eq!(unknown_line["agent_id"], 99, "{unknown_line}");
    assert_eq!(unknown_line["route"], "none", "{unknown_line}");
    assert_eq!(unknown_line["grpc_code"], unknown["code"], "{unknown_line}");

    assert_eq!(refused_line["authenticated"], false, "{refused_line}");
    assert_eq!(
        refused_line["grpc_code"], "UNAUTHENTICATED",
        "{refused_line}"
    );
    assert!(
        refused_line.get("agent_id").is_none(),
        "an unauthenticated caller's agent id is not logged: {refused_line}"
    );
    let written = "sluice_access_log_lines_total{role=\"tunnel\"}";
    assert_eq!(metric(&node, written), Some(3.0));
}
