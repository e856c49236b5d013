//! Fair share under hostile load (issue 32, finding 1), against the real `sluice` binary in
//! front of the apiserver simulator: one well-authenticated but greedy user opens thousands of
//! watches through the gateway. It gets its long-running budget and 429 Statuses past it; other
//! users' GETs keep their latency, and new bearer-token users still authenticate, because the
//! gateway's TokenReviews ride connections client traffic never holds. See docs/SECURITY.md,
//! "Gateway: shared resources".
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls_pki_types::ServerName;
use test_support::{
    on_both_drivers, ApiServer, Certificates, ClientCert, SluiceLauncher, SluiceProcess, TokenUser,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The cluster's name: clients reach it with this TLS server name.
const HOST: &str = "kube.sluice.test";
/// Streams the simulator allows per connection; with `maxConnectionsPerServer` equal to the
/// gateway's cores each core has one connection, so this is a core's stream capacity to it.
const SERVER_STREAMS: u32 = 200;
/// The greedy user's watches, over this many connections (the gateway allows 1,000 streams per
/// client connection).
const GREEDY_WATCHES: usize = 2_200;
const GREEDY_CONNECTIONS: usize = 4;
/// Longest wait for any answer: far above what an answered request takes here, so a request
/// that gets none is one starved behind the greedy user's streams.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

// Every case runs once per monoio driver.
on_both_drivers!(
    a_user_with_thousands_of_watches_gets_its_budget_and_starves_nobody,
    token_reviews_pass_even_when_watches_hold_every_client_stream,
    upgrades_of_all_users_together_stop_at_the_clusters_budget,
    a_user_waiting_for_a_stream_waits_one_turn_behind_a_greedy_one,
);

struct Rig {
    certs: Certificates,
    server: ApiServer,
    process: SluiceProcess,
    alice: ClientCert,
    greedy: ClientCert,
    _gateway_identity: ClientCert,
}

/// A gateway with `workers` cores on `driver` in front of one simulator; `pool` is the
/// cluster's `connectionPool` flow map.
fn start(driver: &str, workers: usize, pool: &str) -> Rig {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let gateway_identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(
        test_support::apiserver_options(&certs).max_concurrent_streams(SERVER_STREAMS),
    )
    .unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let clusters_dir = launcher.dir().join("clusters");
    std::fs::create_dir_all(&clusters_dir).unwrap();
    std::fs::write(
        clusters_dir.join("cluster.yaml"),
        format!(
            "apiVersion: proxy.sluice.dev/v1alpha1\nkind: UpstreamCluster\nmetadata:\n  name: {HOST}\nspec:\n  servers:\n  - endpoint: {url}\n  clientConfig:\n    certFile: {gw_cert}\n    keyFile: {gw_key}\n    caFile: {ca}\n  secureServing:\n    certFile: {cert}\n    keyFile: {key}\n    clientCAFile: {ca}\n    extraHostnames: ['127.0.0.1']\n  healthCheck: {{interval: 200ms, timeout: 1s}}\n  connectionPool: {pool}\n",
            url = server.url(),
            gw_cert = gateway_identity.cert.display(),
            gw_key = gateway_identity.key.display(),
            ca = certs.ca_cert.display(),
            cert = certs.server_cert.display(),
            key = certs.server_key.display(),
        ),
    )
    .unwrap();
    let config = launcher
        .write_file(
            "gateway.yaml",
            &format!(
                "runtime: {{workers: {workers}, drain_timeout: 2s, driver: {driver}}}\nlisteners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway: {{clusters_dir: '{}', reload_interval: 200ms}}\n",
                clusters_dir.display()
            ),
        )
        .unwrap();
    let process = launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("gateway starts");
    test_support::assert_driver(&metrics(&process), driver);
    Rig {
        alice: certs.client("alice", &["dev-team"]).unwrap(),
        greedy: certs.client("greedy", &["dev-team"]).unwrap(),
        certs,
        server,
        process,
        _gateway_identity: gateway_identity,
    }
}

fn metrics(process: &SluiceProcess) -> String {
    test_support::http_get(process.address("admin"), "/metrics")
        .unwrap()
        .body
}

/// The value of the metric line that starts with `prefix` (0 when absent).
fn metric(process: &SluiceProcess, prefix: &str) -> f64 {
    metrics(process)
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

fn fair_share_refused(process: &SluiceProcess, reason: &str) -> f64 {
    metric(
        process,
        &format!("sluice_gateway_fair_share_rejected_total{{cluster=\"{HOST}\",level=\"(none)\",reason=\"{reason}\"}}"),
    )
}

/// How a client reaches the gateway: its address, the CA, and the identity it presents.
#[derive(Clone)]
struct Client {
    address: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    fn new(rig: &Rig, identity: Option<&ClientCert>) -> Self {
        let identity = identity.map(|cert| (cert.cert.as_path(), cert.key.as_path()));
        Self {
            address: rig.process.address("gateway"),
            tls: sluice_grpc::tls::client_config(Some(&rig.certs.ca_cert), identity).unwrap(),
        }
    }

    async fn connect(&self) -> h2::client::SendRequest<Bytes> {
        let connection = sluice_grpc::transport::connect(
            self.address,
            Some((self.tls.clone(), ServerName::try_from(HOST).unwrap())),
            &sluice_grpc::transport::H2Settings::default(),
        )
        .await
        .expect("TLS and HTTP/2 with the gateway");
        connection.send_request
    }
}

/// A GET of `path`, with a bearer token when given.
fn get(path: &str, bearer: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::get(format!("https://{HOST}{path}"));
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).unwrap()
}

/// One answer: status, `Retry-After`, and the body unless it streams on (a watch).
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
    /// An accepted watch's stream, kept open by whoever holds it.
    open: Option<h2::RecvStream>,
}

/// Sends `request` and waits for its answer (its whole body unless it is a 200 watch); `None`
/// when nothing came within [`ANSWER_WITHIN`].
async fn ask(
    send: &h2::client::SendRequest<Bytes>,
    request: http::Request<()>,
    watch: bool,
) -> Option<Answer> {
    let answered = async {
        let mut send = send.clone().ready().await.ok()?;
        let (response, _) = send.send_request(request, true).ok()?;
        let (head, mut recv) = response.await.ok()?.into_parts();
        let status = head.status.as_u16();
        let retry_after = head
            .headers
            .get("retry-after")
            .map(|value| value.to_str().unwrap_or_default().to_string());
        if watch && status == 200 {
            return Some(Answer {
                status,
                retry_after,
                body: String::new(),
                open: Some(recv),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.ok()?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            body.extend_from_slice(&chunk);
        }
        Some(Answer {
            status,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
            open: None,
        })
    };
    monoio::time::timeout(ANSWER_WITHIN, answered)
        .await
        .ok()
        .flatten()
}

fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>> {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
}

/// What the greedy user got for its watches.
#[derive(Debug, Default)]
struct Greedy {
    accepted: usize,
    /// 429 answers that are well-formed `TooManyRequests` Statuses with `Retry-After`.
    refused: usize,
    /// Anything else, by status (0: no answer within [`ANSWER_WITHIN`]); a few kept to show.
    other: Vec<(u16, String)>,
}

/// What the greedy user sends: `count` GETs of `path`, at once.
#[derive(Clone, Copy)]
struct Load {
    path: &'static str,
    count: usize,
    watch: bool,
}

const WATCHES: Load = Load {
    path: "/api/v1/namespaces/default/pods?watch=true",
    count: GREEDY_WATCHES,
    watch: true,
};

/// The greedy user's requests (`load`), on a thread of their own; accepted watches stay open
/// until `stop` fires. Reports what it got once every request was answered (or given up on).
fn start_greedy(
    client: Client,
    load: Load,
    report: mpsc::Sender<Greedy>,
    stop: mpsc::Receiver<()>,
) {
    std::thread::spawn(move || {
        runtime().block_on(async move {
            let mut connections = Vec::new();
            for _ in 0..GREEDY_CONNECTIONS {
                connections.push(client.connect().await);
            }
            let watches: Vec<_> = (0..load.count)
                .map(|index| {
                    let send = connections[index % GREEDY_CONNECTIONS].clone();
                    monoio::spawn(async move { ask(&send, get(load.path, None), load.watch).await })
                })
                .collect();
            let mut greedy = Greedy::default();
            let mut open_streams = Vec::new();
            for watch in watches {
                match watch.await {
                    Some(Answer {
                        status: 200, open, ..
                    }) => {
                        greedy.accepted += 1;
                        open_streams.extend(open);
                    }
                    Some(answer) if is_fair_share_status(&answer) => greedy.refused += 1,
                    Some(answer) => greedy.other.push((answer.status, answer.body)),
                    None => greedy.other.push((0, "no answer".into())),
                }
            }
            report.send(greedy).unwrap();
            while stop.try_recv().is_err() {
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            drop(open_streams);
        })
    });
}

/// A 429 as the gateway answers a request over its fair share: a `TooManyRequests` Status with
/// `retryAfterSeconds` and the same `Retry-After` header.
fn is_fair_share_status(answer: &Answer) -> bool {
    let Ok(status) = serde_json::from_str::<serde_json::Value>(&answer.body) else {
        return false;
    };
    answer.status == 429
        && answer.retry_after.as_deref() == Some("1")
        && status["kind"] == "Status"
        && status["reason"] == "TooManyRequests"
        && status["code"] == 429
        && status["details"]["retryAfterSeconds"] == 1
}

/// The 99th percentile of `samples`.
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99).div_ceil(100) - 1]
}

/// Alice's GETs, one after another on one connection: each one's latency, or its status when
/// it was not a 200 PodList.
async fn alice_gets(client: &Client, count: usize) -> Result<Vec<Duration>, String> {
    let send = client.connect().await;
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let answer = ask(&send, get("/api/v1/namespaces/default/pods", None), false).await;
        match answer {
            Some(answer) if answer.status == 200 && answer.body.contains("PodList") => {
                latencies.push(started.elapsed());
            }
            Some(answer) => return Err(format!("{}: {}", answer.status, answer.body)),
            None => return Err("no answer".into()),
        }
    }
    Ok(latencies)
}

/// New bearer-token users, each on its own connection (so each token is reviewed): their
/// answers (`None`: none within [`ANSWER_WITHIN`]).
async fn token_users(client: &Client, tokens: &[String]) -> Vec<Option<Answer>> {
    let mut answers = Vec::new();
    for token in tokens {
        let send = client.connect().await;
        let path = "/api/v1/namespaces/default/pods";
        answers.push(ask(&send, get(path, Some(token)), false).await);
    }
    answers
}

fn statuses(answers: &[Option<Answer>]) -> Vec<u16> {
    answers
        .iter()
        .map(|answer| answer.as_ref().map_or(0, |answer| answer.status))
        .collect()
}

fn add_token_users(server: &ApiServer, prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|index| {
            let token = format!("token-{prefix}-{index}");
            server.add_token(
                &token,
                TokenUser::new(&format!("{prefix}-{index}"), &["dev-team"]),
            );
            token
        })
        .collect()
}

/// The acceptance case of finding 1. With the defaults but a per-user budget of 40
/// long-running requests per core: the greedy user's 2,200 watches give it at most 80 (two
/// cores), every other one a 429 Status at once; alice's GETs keep a p99 under 100 ms (the
/// issue's figure; unloaded they take a few ms here, so the margin is over tenfold on a noisy
/// 2-core machine); new token users authenticate. Before fair shares the first 200 watches per
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
    let (report, reported) = mpsc::channel();
    let (stop, stopped) = mpsc::channel();
    start_greedy(
        Client::new(&rig, Some(&rig.greedy)),
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
    let (report, reported) = mpsc::channel();
    let (stop, stopped) = mpsc::channel();
    start_greedy(
        Client::new(&rig, Some(&rig.greedy)),
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

/// An exec upgrade as alice over HTTP/1.1 on its own TLS connection: the connection, once the
/// answer's head is read, and that head.
fn exec_upgrade(
    rig: &Rig,
) -> (
    rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
    String,
) {
    use std::io::{Read, Write};
    let identity = Some((rig.alice.cert.as_path(), rig.alice.key.as_path()));
    let tls = sluice_grpc::tls::client_config(Some(&rig.certs.ca_cert), identity).unwrap();
    let mut config = (*tls).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connection =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from(HOST).unwrap())
            .unwrap();
    let tcp = std::net::TcpStream::connect(rig.process.address("gateway")).unwrap();
    tcp.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let request = format!(
        "POST /api/v1/namespaces/default/pods/web/exec?command=sh HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (stream, String::from_utf8_lossy(&head).into_owned())
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
/// would put about 200 before her). Asserted on the order the apiserver saw, not on a clock.
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
            >= 300.0),
        "the greedy user's requests queue: {}",
        metric(&rig.process, &waiting)
    );
    let before = rig.server.requests().len();
    let answer =
        runtime().block_on(async { ask(&alice.connect().await, get(pods, None), false).await });
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
    // One turn, plus a few granted before alice asked that reach the simulator after her
    // snapshot (its tasks record concurrently): far from the hundreds of a first-come queue.
    assert!(
        greedy_first <= 20,
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
