//! Rolling restart of two gateways in front of one apiserver simulator: a client that round
//! robins over both keeps listing pods while each gateway in turn gets SIGTERM, drains, exits
//! and comes back on the same port. Watches open through the draining gateway end with a clean
//! close (curl sees a complete stream over HTTP/2 and a terminated chunked body over HTTP/1.1)
//! and resume on the other gateway from the last resourceVersion they saw. Beside the round
//! robin (a connection per request, its retries on the other gateway counted), one client holds
//! ONE HTTP/2 connection through each drain (`rolling_restart_gateway/held_h2.rs`): the streams
//! in flight when GOAWAY comes finish, and it goes on over a new connection to the other gateway
//! without a failure.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "rolling_restart_gateway/held_h2.rs"]
mod held_h2;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use test_support::{
    curl_at, on_both_drivers, run_on_driver, upstream_cluster_yaml, write_clusters_dir, ApiServer,
    Certificates, ClientCert, SluiceLauncher, SluiceProcess, HEALTH_CHECK_FAST,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const HOST: &str = "kube.sluice.test";
const PODS: &str = "/api/v1/namespaces/default/pods";

on_both_drivers!(two_gateways_restarted_in_turn_fail_no_request_and_end_watches_cleanly);

struct Client {
    ca: PathBuf,
    alice: ClientCert,
}

impl Client {
    fn curl(&self, port: u16, http: &str, path: &str) -> Command {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let options = ["--silent", "--show-error", http];
        curl_at(address, HOST, &self.ca, Some(&self.alice), &options, path)
    }
}

/// A gateway on `driver`, checked to run on it (the first start and every restart).
fn start_gateway(driver: &str, clusters_dir: &Path, port: u16) -> SluiceProcess {
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: 2, drain_timeout: 20s, driver: {driver}}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:{port}'}}\ngateway: {{clusters_dir: '{}', reload_interval: 1s}}\n",
                clusters_dir.display()
            ),
        )
        .unwrap();
    run_on_driver(launcher, &config, driver)
}

/// A watch through one gateway: the events' resourceVersions come out of `events`.
struct Watch {
    child: Child,
    events: mpsc::Receiver<String>,
}

impl Watch {
    fn start(client: &Client, port: u16, http: &str, from: &str) -> Self {
        let mut child = client
            .curl(
                port,
                http,
                &format!("{PODS}?watch=1&resourceVersion={from}"),
            )
            .arg("-N")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let event: serde_json::Value =
                    serde_json::from_str(&line).unwrap_or_else(|error| {
                        panic!("a watch line is not one whole event ({error}): {line}")
                    });
                let version = event["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if sender.send(version).is_err() {
                    return;
                }
            }
        });
        Self { child, events }
    }

    fn next(&self) -> String {
        self.events
            .recv_timeout(Duration::from_secs(10))
            .expect("a watch event")
    }

    /// Waits for curl to end; returns its exit code and what it said on stderr.
    fn ended(mut self, within: Duration) -> (Option<i32>, String) {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut stderr = String::new();
                use std::io::Read;
                let _ = self
                    .child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr);
                return (status.code(), stderr);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        (None, "still running".into())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl's exits for a connection that failed before any request went out: refused (7), or
/// closed during the TLS handshake (35; a connection still in the listen backlog, or accepted
/// but not through its handshake, when the listener closed).
const NOT_SENT: [i32; 2] = [7, 35];

/// Lists pods in a loop, taking the gateways in turn. A connection that failed before its
/// request was sent ([`NOT_SENT`]) goes to the other gateway, as a round robin does, and is
/// counted as a retry with the state of the gateway it failed on; anything else but a 200
/// counts as a failed request.
struct Load {
    ok: Arc<AtomicU64>,
    failed: Arc<std::sync::Mutex<Vec<String>>>,
    /// Retries on the other gateway: (index of the gateway that refused, whether the test had
    /// stopped it at that moment, curl's exit).
    retries: Arc<std::sync::Mutex<Vec<(usize, bool, i32)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `stopped[i]` is set by the test from gateway i's SIGTERM until it is back.
    fn start(client: Arc<Client>, ports: [u16; 2], stopped: Arc<[AtomicBool; 2]>) -> Self {
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, failures, stopping) = (ok.clone(), failed.clone(), stop.clone());
        let retried = retries.clone();
        let thread = std::thread::spawn(move || {
            let mut turn = 0usize;
            while !stopping.load(Ordering::SeqCst) {
                turn += 1;
                let output = (0..2)
                    .map(|attempt| {
                        let index = (turn + attempt) % 2;
                        let was_stopped = stopped[index].load(Ordering::SeqCst);
                        let output = client
                            .curl(ports[index], "--http2", PODS)
                            .args(["--max-time", "10", "--write-out", "\n%{http_code}"])
                            .output()
                            .unwrap();
                        (
                            index,
                            was_stopped || stopped[index].load(Ordering::SeqCst),
                            output,
                        )
                    })
                    .find(|(index, was_stopped, output)| {
                        let code = output.status.code();
                        let not_sent = code.is_some_and(|code| NOT_SENT.contains(&code));
                        if not_sent {
                            let entry = (*index, *was_stopped, code.unwrap_or_default());
                            retried.lock().unwrap().push(entry);
                        }
                        !not_sent
                    })
                    .map(|(_, _, output)| output);
                let Some(output) = output else {
                    failures
                        .lock()
                        .unwrap()
                        .push("both gateways refused".into());
                    continue;
                };
                let text = String::from_utf8_lossy(&output.stdout);
                if output.status.success() && text.ends_with("\n200") {
                    counted.fetch_add(1, Ordering::SeqCst);
                } else {
                    failures.lock().unwrap().push(format!(
                        "exit {:?}: {} {}",
                        output.status.code(),
                        text.rsplit('\n').next().unwrap_or_default(),
                        String::from_utf8_lossy(&output.stderr)
                    ));
                }
            }
        });
        Self {
            ok,
            failed,
            retries,
            stop,
            thread: Some(thread),
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
    }

    fn wait_for_more(&self, more: u64) -> bool {
        let target = self.ok() + more;
        test_support::wait_until(Duration::from_secs(60), || self.ok() >= target)
    }

    fn retries(&self) -> Vec<(usize, bool, i32)> {
        self.retries.lock().unwrap().clone()
    }

    fn finish(mut self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        (self.ok(), self.failed.lock().unwrap().clone())
    }
}

fn two_gateways_restarted_in_turn_fail_no_request_and_end_watches_cleanly(driver: &str) {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(test_support::apiserver_options(&certs)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let urls = [server.url()];
    let cluster = upstream_cluster_yaml(HOST, &urls, &certs, &identity, "", HEALTH_CHECK_FAST);
    let clusters = write_clusters_dir(dir.path(), &cluster);
    let mut gateways: Vec<SluiceProcess> = (0..2)
        .map(|_| start_gateway(driver, &clusters, 0))
        .collect();
    let ports: [u16; 2] = [0, 1].map(|index| gateways[index].address("gateway").port());
    let client = Arc::new(Client {
        ca: certs.ca_cert.clone(),
        alice: certs.client("alice", &["dev-team"]).unwrap(),
    });
    let first = server.create_pod("default", "first");
    let stopped = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let load = Load::start(client.clone(), ports, stopped.clone());
    assert!(load.wait_for_more(20), "the load does not get going");
    let held = held_h2::HeldClient::start(&client.ca, &client.alice, HOST, ports);
    assert!(
        test_support::wait_until(Duration::from_secs(30), || held
            .report()
            .ok_per_connection
            .first()
            .is_some_and(|ok| *ok >= 20)),
        "the held connection does not get going: {:?}",
        held.report()
    );

    let mut last_version = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut pods = 0;
    for index in 0..2 {
        let draining = ports[index];
        let other = ports[1 - index];
        // One watch per HTTP version through the gateway about to drain.
        let watches: Vec<Watch> = ["--http2", "--http1.1"]
            .iter()
            .map(|http| Watch::start(&client, draining, http, &last_version))
            .collect();
        assert!(test_support::wait_until(Duration::from_secs(10), || server
            .watchers("pods")
            >= 2));
        pods += 1;
        let created = server.create_pod("default", &format!("pod-{pods}"));
        let version = created["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        for watch in &watches {
            assert_eq!(watch.next(), version);
        }
        last_version = version;
        let before = load.ok();
        let retries_before = load.retries().len();
        let stopped_at = Instant::now();
        stopped[index].store(true, Ordering::SeqCst);
        gateways[index].signal(libc::SIGTERM);
        for (watch, http) in watches.into_iter().zip(["HTTP/2", "HTTP/1.1"]) {
            let (code, stderr) = watch.ended(Duration::from_secs(10));
            assert_eq!(
                code,
                Some(0),
                "the {http} watch did not end cleanly: {stderr}"
            );
        }
        let status = gateways[index].wait_exit(Duration::from_secs(30)).unwrap();
        assert!(status.success());
        let drained_in = stopped_at.elapsed();
        assert!(
            drained_in < Duration::from_secs(15),
            "the drain waited for its deadline ({drained_in:?}): the watches held it"
        );
        // The watch resumes on the other gateway from the last version it saw, and gets what
        // happens next.
        let resumed = Watch::start(&client, other, "--http2", &last_version);
        assert!(test_support::wait_until(Duration::from_secs(10), || server
            .watchers("pods")
            >= 1));
        pods += 1;
        let created = server.create_pod("default", &format!("pod-{pods}"));
        let version = created["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(resumed.next(), version, "the resumed watch missed an event");
        last_version = version;
        drop(resumed);
        assert!(load.wait_for_more(10), "no requests with one gateway down");
        // The held connection left the drained gateway for the other one.
        let connections = index + 2;
        assert!(
            test_support::wait_until(Duration::from_secs(30), || {
                let report = held.report();
                report.ports.len() >= connections && report.ok_per_connection[connections - 1] >= 10
            }),
            "the held client did not go on over a new connection: {:?}",
            held.report()
        );
        gateways[index] = start_gateway(driver, &clusters, draining);
        stopped[index].store(false, Ordering::SeqCst);
        assert!(
            load.wait_for_more(20),
            "no requests after the gateway came back"
        );
        // While gateway `index` was down every second attempt of the round robin went to its
        // closed port: at least one refused connection was retried, each on the stopped one.
        let retries = load.retries();
        let during = &retries[retries_before..];
        assert!(
            !during.is_empty(),
            "the round robin never met the stopped gateway: the restart went untested"
        );
        assert!(
            during
                .iter()
                .all(|(refused_by, was_stopped, _)| *refused_by == index && *was_stopped),
            "a retry not explained by the stopped gateway {index}: {during:?}"
        );
        println!(
            "gateway {index}: restarted; {} requests OK meanwhile, {} so far; {} retried on the other gateway",
            load.ok() - before,
            load.ok(),
            during.len()
        );
    }
    let report = held.finish();
    println!("held HTTP/2 connection on {driver}: {report:?}");
    assert!(
        report.failed.is_empty(),
        "held connection: {:?}",
        report.failed
    );
    // One connection per gateway the client was on: the first, then the other after each drain.
    assert_eq!(
        report.ports,
        vec![ports[0], ports[1], ports[0]],
        "{report:?}"
    );
    assert!(
        report.ok_per_connection.iter().all(|ok| *ok >= 10),
        "every held connection carried requests: {report:?}"
    );
    // A graceful drain: GOAWAY with NO_ERROR, at least one per drained connection, and every
    // stream the gateway had taken when it came was answered (none failed above). The streams
    // above its last stream id were never processed and went to the next connection.
    assert!(
        report.goaways.len() >= 2 && report.goaways.iter().all(|(_, code)| *code == 0),
        "{report:?}"
    );
    assert!(
        report.ok_after_goaway >= 1,
        "no stream in flight at GOAWAY was answered: {report:?}"
    );
    // Nothing to send again: the gateway's first GOAWAY carries the highest stream id (a
    // graceful shutdown, RFC 9113 6.8) and the client opens no stream after it, so none of its
    // streams can be above the last stream id of the GOAWAY that follows.
    assert_eq!(report.resent, 0, "{report:?}");
    // No retry outside the two restarts: with both gateways up, none refuses a connection.
    let retries = load.retries();
    assert!(
        retries.iter().all(|(_, was_stopped, _)| *was_stopped),
        "a retry while both gateways were up: {retries:?}"
    );
    let (ok, failed) = load.finish();
    println!(
        "gateway rolling restart on {driver}: {ok} requests OK, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    assert!(ok >= 60, "too few requests to mean anything: {ok}");
    println!(
        "{} requests retried on the other gateway: {retries:?}",
        retries.len()
    );
}
