//! The rig of `attacks_fairness.rs`: a gateway in front of one simulator, HTTP/2 clients as
//! the greedy user, alice and new token users, and what they got.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls_pki_types::ServerName;
use test_support::{
    gateway_config_yaml, run_on_driver, upstream_cluster_yaml, write_clusters_dir, ApiServer,
    Certificates, ClientCert, SluiceLauncher, SluiceProcess, TokenUser, HEALTH_CHECK_FAST,
    SERVE_LOOPBACK,
};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_sluice");
/// The cluster's name: clients reach it with this TLS server name.
pub(crate) const HOST: &str = "kube.sluice.test";
/// Streams the simulator allows per connection; with `maxConnectionsPerServer` equal to the
/// gateway's cores each core has one connection, so this is a core's stream capacity to it.
pub(crate) const SERVER_STREAMS: u32 = 200;
/// The greedy user's watches, over this many connections (the gateway allows 1,000 streams per
/// client connection).
pub(crate) const GREEDY_WATCHES: usize = 2_200;
pub(crate) const GREEDY_CONNECTIONS: usize = 4;
/// Longest wait for any answer: far above what an answered request takes here, so a request
/// that gets none is one starved behind the greedy user's streams.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(15);

pub(crate) struct Rig {
    pub(crate) certs: Certificates,
    pub(crate) server: ApiServer,
    pub(crate) process: SluiceProcess,
    pub(crate) alice: ClientCert,
    pub(crate) greedy: ClientCert,
    pub(crate) _gateway_identity: ClientCert,
}

/// A gateway with `workers` cores on `driver` in front of one simulator; `pool` is the
/// cluster's `connectionPool` flow map.
pub(crate) fn start(driver: &str, workers: usize, pool: &str) -> Rig {
    let certs = Certificates::generate(&[HOST]).unwrap();
    let gateway_identity = certs.client("sluice-gateway", &[]).unwrap();
    let server = ApiServer::start_with(
        test_support::apiserver_options(&certs).max_concurrent_streams(SERVER_STREAMS),
    )
    .unwrap();
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let rest = format!("{HEALTH_CHECK_FAST}  connectionPool: {pool}\n");
    let cluster = upstream_cluster_yaml(
        HOST,
        &[server.url()],
        &certs,
        &gateway_identity,
        SERVE_LOOPBACK,
        &rest,
    );
    let clusters_dir = write_clusters_dir(launcher.dir(), &cluster);
    let yaml = gateway_config_yaml(
        driver,
        workers,
        "",
        &clusters_dir,
        ", reload_interval: 200ms",
    );
    let config = launcher.write_file("gateway.yaml", &yaml).unwrap();
    let process = run_on_driver(launcher, &config, driver);
    Rig {
        alice: certs.client("alice", &["dev-team"]).unwrap(),
        greedy: certs.client("greedy", &["dev-team"]).unwrap(),
        certs,
        server,
        process,
        _gateway_identity: gateway_identity,
    }
}

pub(crate) fn metrics(process: &SluiceProcess) -> String {
    test_support::http_get(process.address("admin"), "/metrics")
        .unwrap()
        .body
}

/// The value of the metric line that starts with `prefix` (0 when absent).
pub(crate) fn metric(process: &SluiceProcess, prefix: &str) -> f64 {
    metrics(process)
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn fair_share_refused(process: &SluiceProcess, reason: &str) -> f64 {
    metric(
        process,
        &format!("sluice_gateway_fair_share_rejected_total{{cluster=\"{HOST}\",level=\"(none)\",reason=\"{reason}\"}}"),
    )
}

/// How a client reaches the gateway: its address, the CA, and the identity it presents.
#[derive(Clone)]
pub(crate) struct Client {
    address: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    pub(crate) fn new(rig: &Rig, identity: Option<&ClientCert>) -> Self {
        let identity = identity.map(|cert| (cert.cert.as_path(), cert.key.as_path()));
        Self {
            address: rig.process.address("gateway"),
            tls: sluice_grpc::tls::client_config(Some(&rig.certs.ca_cert), identity).unwrap(),
        }
    }

    pub(crate) async fn connect(&self) -> h2::client::SendRequest<Bytes> {
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
pub(crate) fn get(path: &str, bearer: Option<&str>) -> http::Request<()> {
    let mut request = http::Request::get(format!("https://{HOST}{path}"));
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).unwrap()
}

/// One answer: status, `Retry-After`, and the body unless it streams on (a watch).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<String>,
    pub(crate) body: String,
    /// An accepted watch's stream, kept open by whoever holds it.
    pub(crate) open: Option<h2::RecvStream>,
}

/// Sends `request` and waits for its answer (its whole body unless it is a 200 watch); `None`
/// when nothing came within [`ANSWER_WITHIN`].
pub(crate) async fn ask(
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

pub(crate) fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>> {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
}

/// What the greedy user got for its watches.
#[derive(Debug, Default)]
pub(crate) struct Greedy {
    pub(crate) accepted: usize,
    /// 429 answers that are well-formed `TooManyRequests` Statuses with `Retry-After`.
    pub(crate) refused: usize,
    /// Anything else, by status (0: no answer within [`ANSWER_WITHIN`]); a few kept to show.
    pub(crate) other: Vec<(u16, String)>,
}

/// What the greedy user sends: `count` GETs of `path`, at once.
#[derive(Clone, Copy)]
pub(crate) struct Load {
    pub(crate) path: &'static str,
    pub(crate) count: usize,
    pub(crate) watch: bool,
}

pub(crate) const WATCHES: Load = Load {
    path: "/api/v1/namespaces/default/pods?watch=true",
    count: GREEDY_WATCHES,
    watch: true,
};

/// The greedy user's requests (`load`), on a thread of their own; accepted watches stay open
/// until `stop` fires. Reports what it got once every request was answered (or given up on).
pub(crate) fn start_greedy(
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
            // The test may be gone already (it failed): nobody to tell.
            let _ = report.send(greedy);
            // Until told, or until the test is gone.
            while matches!(stop.try_recv(), Err(mpsc::TryRecvError::Empty)) {
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            drop(open_streams);
        })
    });
}

/// A 429 as the gateway answers a request over its fair share: a `TooManyRequests` Status with
/// `retryAfterSeconds` and the same `Retry-After` header.
pub(crate) fn is_fair_share_status(answer: &Answer) -> bool {
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
pub(crate) fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99).div_ceil(100) - 1]
}

/// Alice's GETs, one after another on one connection: each one's latency, or its status when
/// it was not a 200 PodList.
pub(crate) async fn alice_gets(client: &Client, count: usize) -> Result<Vec<Duration>, String> {
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
pub(crate) async fn token_users(client: &Client, tokens: &[String]) -> Vec<Option<Answer>> {
    let mut answers = Vec::new();
    for token in tokens {
        let send = client.connect().await;
        let path = "/api/v1/namespaces/default/pods";
        answers.push(ask(&send, get(path, Some(token)), false).await);
    }
    answers
}

pub(crate) fn statuses(answers: &[Option<Answer>]) -> Vec<u16> {
    answers
        .iter()
        .map(|answer| answer.as_ref().map_or(0, |answer| answer.status))
        .collect()
}

pub(crate) fn add_token_users(server: &ApiServer, prefix: &str, count: usize) -> Vec<String> {
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

/// An exec upgrade as alice over HTTP/1.1 on its own TLS connection: the connection, once the
/// answer's head is read, and that head.
pub(crate) fn exec_upgrade(
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
