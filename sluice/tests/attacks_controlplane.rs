//! Issue 32, findings 2 and 3, against the real `sluice controlplane`: one principal (a VM
//! agent's token, or peers without credentials) cannot take a shared resource of the control
//! plane from the others.
//!
//! - Watches: a vm-agent identity stops at its cap, the vm-agent role stops at its reservation
//!   plus the shared part, and a node, a gateway and the admin still get theirs.
//! - Requests in flight: one VM's stalled requests stop at its cap; another VM and a node are
//!   still answered.
//! - Authenticated connections: one VM, and the VM agents together, stop at their shares; a
//!   node, a gateway and the admin still connect.
//! - Connections: 2,000 idle TLS + HTTP/2 connections without credentials from one address
//!   (the admin's own), and 2,000 from 200 addresses, while the admin's kubectl keeps working;
//!   every one of them is closed.
//! - `?watch=true` on a named GET or a POST neither makes it a watch nor lifts its timeout.
//!
//! The control plane is a tokio server (no monoio driver), so each case runs once.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use sluice_watch_client::{Transport, WatchClientConfig, WatchError};
use test_support::{wait_until, ControlPlane, CurlWatch};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const ZERO_SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn transport(cp: &ControlPlane, dir: &Path, name: &str, token: &str) -> Transport {
    let token_file = dir.join(format!("{name}.token"));
    std::fs::write(&token_file, token).unwrap();
    let mut config = WatchClientConfig::new(cp.url(), cp.ca_file());
    config.token_file = Some(token_file);
    Transport::new(&config).unwrap()
}

/// An open watch (its response body and connection), held until dropped.
type Held = Box<dyn std::any::Any + Send>;

/// Opens watches on `path` until one is refused (at most `bound`): the open ones and the
/// refusal's `(status, message)`.
async fn watches_until_refused(
    transport: &Transport,
    path: &str,
    bound: usize,
) -> (Vec<Held>, Option<(u16, String)>) {
    let mut open = Vec::new();
    for _ in 0..bound {
        match transport.get(path).await {
            Ok(watch) => open.push(Box::new(watch) as Held),
            Err(WatchError::Status { status, message }) => return (open, Some((status, message))),
            Err(other) => panic!("watch {path}: {other}"),
        }
    }
    (open, None)
}

fn metrics(cp: &ControlPlane) -> String {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(cp.ca_file())
        .arg(format!("{}/metrics", cp.url()))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const POLICIES: &str = "/apis/policy.sluice.dev/v1alpha1/networkpolicies?watch=1";
const AGENTS: &str = "/apis/tunnel.sluice.dev/v1alpha1/agents";
const CLUSTERS: &str = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters?watch=1";

/// Finding 2. A pool of 60 watches: reservations admin 5, gateway 10, node 10, vm-agent 10,
/// 25 shared; one vm-agent identity holds at most 8.
#[test]
fn a_vm_agent_stops_at_its_watch_cap_and_the_other_roles_still_watch() {
    let cp = ControlPlane::start(
        BIN,
        &[
            "--max-watches=60",
            "--watch-share=admin=5/20",
            "--watch-share=gateway=10/10",
            "--watch-share=node=10/10",
            "--watch-share=vm-agent=10/8",
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let vm_tokens: Vec<String> = (1..=5)
        .map(|index| cp.token("vm-agent", &format!("vm-{index}")))
        .collect();
    let node = transport(&cp, dir.path(), "node", &cp.token("node", "node-1"));
    let gateway = transport(&cp, dir.path(), "gateway", &cp.token("gateway", "gw-1"));
    runtime().block_on(async {
        let mut held = Vec::new();
        // vm-1 alone: refused at its own cap, with a message naming that budget.
        let vm1 = transport(&cp, dir.path(), "vm-1", &vm_tokens[0]);
        let (open, refused) = watches_until_refused(&vm1, POLICIES, 100).await;
        assert_eq!(open.len(), 8, "vm-1 holds its cap of watches");
        let (status, message) = refused.expect("vm-1 is refused past its cap");
        assert_eq!(status, 429, "{message}");
        assert!(
            message.contains("sluice:vm-agent:vm-1") && message.contains("open watches"),
            "{message}"
        );
        held.extend(open);
        // More VMs: the role's 10 reserved plus the 25 shared, then the role's budget refuses.
        let mut role_refusal = None;
        for (index, token) in vm_tokens.iter().enumerate().skip(1) {
            let vm = transport(&cp, dir.path(), &format!("vm-{}", index + 1), token);
            let (open, refused) = watches_until_refused(&vm, POLICIES, 100).await;
            held.extend(open);
            if let Some((429, message)) = refused {
                if message.contains("reserved for role vm-agent") {
                    role_refusal = Some(message);
                    break;
                }
            }
        }
        assert_eq!(
            held.len(),
            35,
            "vm agents hold their reservation and the shared part"
        );
        let message = role_refusal.expect("the vm-agent role is refused past its share");
        assert!(message.contains("25 shared"), "{message}");
        // The node and the gateway still open every watch of their reservations.
        let (nodes, refused) = watches_until_refused(&node, &format!("{AGENTS}?watch=1"), 10).await;
        assert_eq!((nodes.len(), refused), (10, None));
        let (gateways, refused) = watches_until_refused(&gateway, CLUSTERS, 10).await;
        assert_eq!((gateways.len(), refused), (10, None));
        // And the admin lists.
        let listed = cp.kubectl(&["get", "agents.tunnel.sluice.dev"], None);
        assert!(listed.status.success(), "{listed:?}");
        assert_refusal_says_when_to_retry(&cp, &vm_tokens[0]);
        drop((held, nodes, gateways));
    });
}

/// A client told 429 learns when to retry (`Retry-After`, a `TooManyRequests` Status); the
/// metric names the role and the budget, never the VM.
fn assert_refusal_says_when_to_retry(cp: &ControlPlane, vm_token: &str) {
    let answer = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10", "--cacert"])
        .arg(cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {vm_token}")])
        .arg(format!("{}{POLICIES}", cp.url()))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer.stdout).to_lowercase();
    assert!(
        answer.starts_with("http/2 429") || answer.starts_with("http/1.1 429"),
        "{answer}"
    );
    assert!(answer.contains("retry-after: 10"), "{answer}");
    assert!(
        answer.contains("\"reason\":\"toomanyrequests\""),
        "{answer}"
    );
    let text = metrics(cp);
    assert!(
        text.contains(
            "sluice_controlplane_admission_refused_total{pool=\"watches\",role=\"vm-agent\",budget=\"identity\"}"
        ),
        "{text}"
    );
    assert!(!text.contains("vm-1"), "no user name in a metric label");
}

/// `(status, body)` of a GET with `token` (curl, at most 10 s).
fn get_as(cp: &ControlPlane, token: &str, path: &str) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-w", "\n%{http_code}"])
        .arg(format!("{}{path}", cp.url()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A POST whose body never completes: in flight until the request timeout.
fn stalled_post(
    cp: &ControlPlane,
    token: &str,
    path: &str,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut stream = raw_tls_http1(cp);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"apiVersion\"",
        cp.address
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.flush().unwrap();
    stream
}

/// Finding 2's other pool: one identity's requests in flight stop at its cap (2 here) while
/// another VM and a node are still answered.
#[test]
fn a_vm_agent_stops_at_its_requests_in_flight_cap() {
    let cp = ControlPlane::start(BIN, &["--request-share=vm-agent=2/2"]).unwrap();
    let (vm1, vm2) = (cp.token("vm-agent", "vm-1"), cp.token("vm-agent", "vm-2"));
    let node = cp.token("node", "node-1");
    let list = "/apis/policy.sluice.dev/v1alpha1/networkpolicies";
    let infos = "/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos";
    let stalled = [
        stalled_post(&cp, &vm1, infos),
        stalled_post(&cp, &vm1, infos),
    ];
    let mut refusal = String::new();
    let refused = wait_until(Duration::from_secs(10), || {
        let (code, body) = get_as(&cp, &vm1, list);
        refusal = body;
        code == 429
    });
    assert!(
        refused,
        "vm-1 with 2 requests in flight was answered: {refusal}"
    );
    assert!(
        refusal.contains("requests in flight") && refusal.contains("sluice:vm-agent:vm-1"),
        "{refusal}"
    );
    assert_eq!(
        get_as(&cp, &vm2, list).0,
        200,
        "another VM is not held back"
    );
    assert_eq!(get_as(&cp, &node, AGENTS).0, 200, "nor is a node");
    drop(stalled);
    assert!(
        wait_until(Duration::from_secs(10), || get_as(&cp, &vm1, list).0 == 200),
        "vm-1's slots come back when its requests end"
    );
}

/// One GET with `token` on its own HTTP/1.1 connection, kept open afterwards: the answer's
/// status and body, and the connection.
fn kept_get(
    cp: &ControlPlane,
    token: &str,
    path: &str,
) -> (
    u16,
    String,
    rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
) {
    let mut stream = raw_tls_http1(cp);
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\r\n",
        cp.address
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream.flush().unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let text = String::from_utf8_lossy(&answer).to_lowercase();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .and_then(|value| value.trim().parse::<usize>().ok());
            if length.is_some_and(|length| body.len() >= length) {
                break;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&chunk[..read]),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, text, stream)
}

/// Opens kept connections with `token` until one is refused (at most `bound`).
fn connections_until_refused(
    cp: &ControlPlane,
    token: &str,
    path: &str,
    bound: usize,
) -> (Vec<impl Sized>, Option<String>) {
    let mut open = Vec::new();
    for _ in 0..bound {
        let (status, text, stream) = kept_get(cp, token, path);
        match status {
            200 => open.push(stream),
            429 => return (open, Some(text)),
            other => panic!("GET {path}: {other} {text}"),
        }
    }
    (open, None)
}

/// Finding 3's authenticated side: the table's authenticated part (48 of 64 here) is shared
/// per role and capped per identity, so one VM's token, or all VM agents together, cannot
/// hold every connection; a node, a gateway and the admin still connect.
#[test]
fn one_identity_cannot_hold_every_authenticated_connection() {
    let cp = ControlPlane::start(
        BIN,
        &[
            "--max-connections=64",
            "--max-unauthenticated-connections=16",
            "--connection-share=admin=4/8",
            "--connection-share=gateway=4/8",
            "--connection-share=node=4/8",
            "--connection-share=vm-agent=8/6",
        ],
    )
    .unwrap();
    let policies = "/apis/policy.sluice.dev/v1alpha1/networkpolicies";
    let (mut held, mut kept, mut refusals) = (Vec::new(), Vec::new(), Vec::new());
    for index in 1..=8 {
        let token = cp.token("vm-agent", &format!("vm-{index}"));
        let (open, refused) = connections_until_refused(&cp, &token, policies, 20);
        held.push(open.len());
        kept.push(open);
        refusals.push(refused.unwrap_or_default());
    }
    // vm-1..vm-6 hold their cap of 6; the role's 8 reserved and 28 shared are then used up.
    assert_eq!(held, [6, 6, 6, 6, 6, 6, 0, 0], "{refusals:?}");
    assert!(
        refusals[0].contains("sluice:vm-agent:vm-1") && refusals[0].contains("open connections"),
        "{}",
        refusals[0]
    );
    assert!(refusals[0].contains("retry-after: 10"), "{}", refusals[0]);
    assert!(
        refusals[6].contains("reserved for role vm-agent"),
        "{}",
        refusals[6]
    );
    let node = cp.token("node", "node-1");
    let (nodes, refused) = connections_until_refused(&cp, &node, AGENTS, 4);
    assert_eq!((nodes.len(), refused), (4, None));
    let gateway = cp.token("gateway", "gw-1");
    let clusters = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters";
    let (gateways, refused) = connections_until_refused(&cp, &gateway, clusters, 4);
    assert_eq!((gateways.len(), refused), (4, None));
    let listed = cp.kubectl(&["get", "agents.tunnel.sluice.dev"], None);
    assert!(listed.status.success(), "{listed:?}");
}

fn h2_client(ca: &Path) -> Arc<rustls::ClientConfig> {
    tls_client(ca, b"h2")
}

/// A TLS client without credentials that trusts `ca` and offers the one ALPN protocol `alpn`.
fn tls_client(ca: &Path, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// A TLS + HTTP/2 connection with no credentials that sends the preface and its SETTINGS and
/// then nothing; `None` when the server closed it before that was done.
fn idle_h2(
    cp: &ControlPlane,
    config: &Arc<rustls::ClientConfig>,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    idle_h2_from(cp, config, TcpStream::connect(cp.address).ok()?)
}

/// [`idle_h2`] on a connected `tcp`.
fn idle_h2_from(
    cp: &ControlPlane,
    config: &Arc<rustls::ClientConfig>,
    tcp: TcpStream,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    tcp.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let name = ServerName::try_from(cp.address.ip().to_string()).unwrap();
    let connection = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream.write_all(&preface).ok()?;
    stream.flush().ok()?;
    Some(stream)
}

/// Whether the server has closed `stream` (EOF or reset) within its read timeout.
/// Every connection of `flood` has been closed by the control plane (each read waits up to the
/// stream's read timeout).
fn assert_all_closed_by_server(
    flood: &mut [rustls::StreamOwned<rustls::ClientConnection, TcpStream>],
) {
    let open = flood
        .iter_mut()
        .map(closed_by_server)
        .filter(|closed| !closed)
        .count();
    assert_eq!(open, 0, "idle unauthenticated connections left open");
}

fn closed_by_server(stream: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>) -> bool {
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) => {
                return !matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// Finding 3. A table of 512 connections, at most 256 of them unauthenticated and 128 per
/// address; 2,000 idle unauthenticated connections from 127.0.0.1, the admin's own address.
#[test]
fn idle_connections_without_credentials_never_lock_out_the_admin() {
    const FLOOD: usize = 2000;
    let cp = ControlPlane::start(
        BIN,
        &[
            "--max-connections=512",
            "--max-unauthenticated-connections=256",
            "--max-unauthenticated-connections-per-address=128",
            "--first-request-timeout=3s",
        ],
    )
    .unwrap();
    let config = h2_client(&cp.ca_file());
    let mut flood: Vec<_> = (0..FLOOD).filter_map(|_| idle_h2(&cp, &config)).collect();
    eprintln!(
        "{} of {FLOOD} flood connections completed TLS and the preface",
        flood.len()
    );
    assert!(flood.len() >= 128, "the flood got in: {}", flood.len());
    // While the flood is held (and renewed, as it would be), the admin gets through.
    for _ in 0..3 {
        flood.extend((0..200).filter_map(|_| idle_h2(&cp, &config)));
        let listed = cp.kubectl(&["get", "agents.tunnel.sluice.dev"], None);
        assert!(
            listed.status.success(),
            "the admin's kubectl during the flood: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
        let (code, body) = cp.curl("GET", AGENTS, None);
        assert_eq!(code, 200, "{body}");
    }
    let text = metrics(&cp);
    let gauge = text
        .lines()
        .find_map(|line| line.strip_prefix("sluice_controlplane_unauthenticated_connections "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .expect("the unauthenticated connections gauge");
    assert!(
        gauge <= 256.0,
        "unauthenticated connections {gauge} over the limit"
    );
    assert!(
        text.contains("sluice_controlplane_connections_refused_total{reason=\"evicted\"}"),
        "{text}"
    );
    // Every idle connection without credentials is closed: displaced by newer ones, or at the
    // first-request timeout (3 s; each read below waits up to 30 s).
    assert_all_closed_by_server(&mut flood);
    assert!(
        wait_until(Duration::from_secs(20), || metrics(&cp).contains(
            "sluice_controlplane_connections_refused_total{reason=\"first_request_timeout\"}"
        )),
        "the first-request timeout closed connections"
    );
}

/// A TCP connection to `to` from `source` (any 127/8 address is local on Linux).
fn connect_from(source: std::net::Ipv4Addr, to: std::net::SocketAddr) -> Option<TcpStream> {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(to) = to else {
        return None;
    };
    let address = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let (local, remote) = (address(source, 0), address(*to.ip(), to.port()));
    let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream from here on; the addresses outlive the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let stream = TcpStream::from_raw_fd(fd);
        let bound = libc::bind(fd, (&raw const local).cast(), length);
        let connected = libc::connect(fd, (&raw const remote).cast(), length);
        (bound == 0 && connected == 0).then_some(stream)
    }
}

/// Finding 3 from many addresses: 2,000 idle connections without credentials spread over 200
/// addresses (127.0.0.2 to 127.0.0.201, 10 each), so no per-address cap is reached and only
/// the global unauthenticated part (256 of 512) holds them; the admin still gets in.
#[test]
fn idle_connections_from_many_addresses_never_lock_out_the_admin() {
    let cp = ControlPlane::start(
        BIN,
        &[
            "--max-connections=512",
            "--max-unauthenticated-connections=256",
            "--first-request-timeout=3s",
        ],
    )
    .unwrap();
    let config = h2_client(&cp.ca_file());
    let mut flood = Vec::new();
    for round in 0..10 {
        for host in 2..=201u8 {
            let source = std::net::Ipv4Addr::new(127, 0, 0, host);
            if let Some(tcp) = connect_from(source, cp.address) {
                flood.extend(idle_h2_from(&cp, &config, tcp));
            }
        }
        if round % 3 == 2 {
            let listed = cp.kubectl(&["get", "agents.tunnel.sluice.dev"], None);
            assert!(
                listed.status.success(),
                "the admin's kubectl during the flood: {}",
                String::from_utf8_lossy(&listed.stderr)
            );
        }
    }
    eprintln!(
        "{} of 2000 flood connections completed TLS and the preface",
        flood.len()
    );
    assert!(flood.len() >= 256, "the flood got in: {}", flood.len());
    let text = metrics(&cp);
    assert!(
        text.contains("sluice_controlplane_connections_refused_total{reason=\"evicted\"}"),
        "{text}"
    );
    let (code, body) = cp.curl("GET", AGENTS, None);
    assert_eq!(code, 200, "{body}");
    assert_all_closed_by_server(&mut flood);
}

fn raw_tls_http1(cp: &ControlPlane) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let config = tls_client(&cp.ca_file(), b"http/1.1");
    let name = ServerName::try_from(cp.address.ip().to_string()).unwrap();
    let connection = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(cp.address).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    rustls::StreamOwned::new(connection, tcp)
}

/// Finding 3's last point: `?watch=true` on a request that is not a watch (a named GET, a
/// POST) changes nothing; a real watch still streams past the request timeout.
#[test]
fn watch_true_on_other_requests_keeps_their_timeout() {
    let cp = ControlPlane::start(BIN, &["--request-timeout=2s"]).unwrap();
    let agent = serde_json::json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "agent-1"}, "spec": {"id": 1, "tokenSha256": ZERO_SHA}});
    let (code, body) = cp.curl("POST", AGENTS, Some(&agent.to_string()));
    assert_eq!(code, 201, "{body}");
    // A named GET with watch=true is that object, answered at once (curl gives up after 10 s).
    let (code, body) = cp.curl("GET", &format!("{AGENTS}/agent-1?watch=true"), None);
    assert_eq!(code, 200, "{body}");
    let object: Value = serde_json::from_str(&body).expect("one JSON object, not a stream");
    assert_eq!(object["kind"], "Agent", "{body}");
    // A real watch outlives the request timeout.
    let watch = CurlWatch::start(&cp, &cp.admin_token(), &format!("{AGENTS}?watch=1")).unwrap();
    let first = watch
        .next_event(Duration::from_secs(10))
        .expect("the ADDED of agent-1");
    assert_eq!(first["type"], "ADDED", "{first}");
    // Not a synchronisation: the watch must still be open once the 2 s request timeout has
    // passed, so the next event comes after it.
    std::thread::sleep(Duration::from_secs(3));
    let later = serde_json::json!({"apiVersion": "tunnel.sluice.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "agent-2"}, "spec": {"id": 2, "tokenSha256": ZERO_SHA}});
    let (code, body) = cp.curl("POST", AGENTS, Some(&later.to_string()));
    assert_eq!(code, 201, "{body}");
    let second = watch
        .next_event(Duration::from_secs(10))
        .expect("the watch outlives 2 s");
    assert_eq!(second["object"]["metadata"]["name"], "agent-2", "{second}");
    // A POST with watch=true whose body never comes is answered 503 at the request timeout.
    let mut stream = raw_tls_http1(&cp);
    let head = format!(
        "POST {AGENTS}?watch=true HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"apiVersion\"",
        cp.address,
        cp.admin_token()
    );
    let started = Instant::now();
    stream.write_all(head.as_bytes()).unwrap();
    stream.flush().unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("\r\n\r\n{") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => answer.extend_from_slice(&chunk[..read]),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "no answer to a stalled POST ?watch=true after {:?}: {answer:?}",
        started.elapsed()
    );
}
