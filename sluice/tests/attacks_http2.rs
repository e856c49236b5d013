//! The usual HTTP/2 abuse against the real `sluice run` binary's external listener (issue 13,
//! attack suite): rapid reset, CONTINUATION flood, SETTINGS and PING floods from a peer that
//! never reads, an HPACK bomb, zero-window stalls, and 10,000 idle connections. Frames are
//! written by hand on raw sockets (no client library would send them). Under each, a
//! well-behaved client keeps getting correct answers, the node stays ready, its peak RSS while
//! the attack's connections are open stays within the bound each case states, and the attacker
//! is refused (cut, answered GOAWAY, or no longer read), not only survived.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;
/// The tunnel crate's harness, for its gRPC outcome reader.
#[path = "../../dataplane/tunnel/tests/common/mod.rs"]
mod sluice_tunnel_harness;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{agents_yaml, assert_driver, client_jwt, rss_kib, Secrets};
use test_support::raw_h2::{
    frame, literal, read_frame, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING,
    RST_STREAM, SETTINGS,
};
use test_support::{http_get, on_both_drivers, SluiceLauncher, SluiceProcess};

// Every attack runs once per monoio driver: what a flood costs and when the node cuts it depend
// on how the driver reads and writes the socket.
on_both_drivers!(
    rapid_reset_is_cut_off_and_others_are_served,
    a_continuation_flood_is_refused_without_buffering_it,
    settings_and_ping_floods_from_a_peer_that_never_reads_stay_bounded,
    an_hpack_bomb_is_refused_at_the_header_list_limit,
    ten_thousand_idle_connections_do_not_stop_the_node_serving,
    zero_window_stalls_hold_only_bounded_memory,
);

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// HTTP/2's error code for a peer behaving abusively (RFC 9113 7).
const ENHANCE_YOUR_CALM: u32 = 0xb;
fn request_block() -> Vec<u8> {
    let mut block = Vec::new();
    literal(&mut block, ":method", "POST");
    literal(&mut block, ":scheme", "http");
    literal(&mut block, ":path", "/test.Echo/Unary");
    literal(&mut block, ":authority", "node");
    literal(&mut block, "content-type", "application/grpc");
    block
}

fn open(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(PREFACE).unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    stream
}

/// The abused node, on the driver of `secrets` (checked).
fn start_node(secrets: &Secrets) -> SluiceProcess {
    let agents = agents_yaml(secrets);
    let yaml = format!(
        "runtime: {{workers: 2, drain_timeout: 2s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n\
         \x20 external: {{address: '127.0.0.1:0', max_connections_per_worker: 8000, backlog: 4096}}\n\
         tunnel:\n  node_name: abused\n  max_wait: 1s\n  agents:\n{agents}  jwt: {{secret_file: '{}'}}\n",
        secrets.jwt_secret.display(),
        driver = secrets.driver,
    );
    // Without backtraces: in debug builds h2 debug-asserts that no stream is counted when a
    // connection's state is dropped, which streams stalled by these attacks can violate (the
    // panic is contained and the connection closed; release builds do not check). Printing
    // its backtrace would load ~100 MB of debug info into the node, which is not memory the
    // attack made it hold.
    let launcher = SluiceLauncher::new(common::BIN).unwrap();
    let config = launcher.write_file("node.yaml", &yaml).unwrap();
    let node = launcher
        .env("RUST_BACKTRACE", "0")
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("node starts");
    assert_driver(&node, &secrets.driver);
    node
}

/// A well-behaved client calling ListConnectedAgents on fresh connections until stopped:
/// (answered OK, anything else).
struct GoodClient {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    bad: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl GoodClient {
    fn start(node: SocketAddr, token: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (stop2, ok2, bad2) = (stop.clone(), ok.clone(), bad.clone());
        let thread = std::thread::spawn(move || {
            let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
                .enable_timer()
                .build()
                .unwrap();
            while !stop2.load(Ordering::Relaxed) {
                let answered = runtime.block_on(async {
                    monoio::time::timeout(Duration::from_secs(5), list_agents(node, &token)).await
                });
                match answered {
                    Ok(Ok(status)) if status.starts_with("0:") => {
                        ok2.fetch_add(1, Ordering::Relaxed)
                    }
                    other => {
                        eprintln!("good client: {other:?}");
                        bad2.fetch_add(1, Ordering::Relaxed)
                    }
                };
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            ok,
            bad,
            thread,
        }
    }

    /// Stops it; asserts it was answered correctly throughout, at least `min_ok` times.
    fn finish(self, what: &str, min_ok: u64) {
        // Counts, not time: on a loaded machine the good client's calls come slower, so it
        // gets until it has been answered `min_ok` times (or a generous deadline).
        test_support::wait_until(Duration::from_secs(30), || {
            self.ok.load(Ordering::Relaxed) >= min_ok || self.bad.load(Ordering::Relaxed) > 0
        });
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        let (ok, bad) = (
            self.ok.load(Ordering::Relaxed),
            self.bad.load(Ordering::Relaxed),
        );
        assert_eq!(
            bad, 0,
            "{what}: {bad} calls of the good client failed ({ok} ok)"
        );
        assert!(ok >= min_ok, "{what}: only {ok} good calls answered");
    }
}

async fn list_agents(node: SocketAddr, token: &str) -> Result<String, String> {
    let settings = sluice_grpc::transport::H2Settings::default();
    let connection = sluice_grpc::transport::connect(node, None, &settings)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut ready = connection
        .ready()
        .await
        .map_err(|e| format!("ready: {e}"))?;
    let request = common::list_agents_request(token);
    let (response, mut send) = ready
        .send_request(request, false)
        .map_err(|e| format!("send: {e}"))?;
    let _ = send.send_data(sluice_grpc::encode_message(false, b""), true);
    let outcome = sluice_tunnel_harness::grpc_outcome(response).await;
    Ok(format!("{}:{}", outcome.0, outcome.1))
}

/// Good calls that must be answered after an attack ends: ten at the good client's pace (a
/// call, then 20 ms) is the ~300 ms it was given as a fixed sleep before, on an idle machine.
const CALLS_AFTER_ATTACK: u64 = 10;

/// Runs `attack` against a fresh node on `driver` while a good client calls it; checks the node
/// stayed ready and grew by less than `rss_bound_kib`.
fn under_attack(
    driver: &str,
    what: &str,
    rss_bound_kib: u64,
    attack: impl FnOnce(SocketAddr, &Secrets),
) {
    let what = &format!("{driver}: {what}");
    let secrets = Secrets::on(driver);
    let node = start_node(&secrets);
    let external = node.address("external");
    let before = rss_kib(node.pid());
    reset_peak_rss(node.pid());
    let good = GoodClient::start(external, client_jwt(&secrets, 50));
    let started = Instant::now();
    attack(external, &secrets);
    let attack_took = started.elapsed();
    // The good client keeps being answered after the attack too: counted, not timed, so a
    // loaded machine waits longer instead of checking fewer calls.
    let after_attack = good.ok.load(Ordering::Relaxed) + CALLS_AFTER_ATTACK;
    good.finish(what, after_attack.max(5));
    // The peak since the reset: what the node held while the attack's connections were open,
    // not what is left once they closed.
    let grown = peak_rss_kib(node.pid()).saturating_sub(before);
    assert!(
        grown < rss_bound_kib,
        "{what}: node RSS grew by {grown} KiB (bound {rss_bound_kib} KiB); node stderr:\n{}\nstdout:\n{}",
        node.stderr(),
        node.stdout()
    );
    let ready = http_get(node.address("admin"), "/readyz").unwrap();
    assert_eq!(ready.status, 200, "{what}: still ready");
    eprintln!(
        "{what}: attack {attack_took:?}, with the good calls after it {:?}, node RSS +{grown} KiB",
        started.elapsed()
    );
}

/// Frames of at least `frame_bytes` each (their acknowledgements no larger) that a flood must
/// send to be sure the node itself read them: twice what the kernel can buffer on loopback,
/// the flood in our send and the node's receive buffer, the acknowledgements in the node's send
/// and our receive buffer (each at most `tcp_rmem`/`tcp_wmem`'s maximum).
fn frames_beyond_socket_buffers(frame_bytes: usize) -> usize {
    let maximum = |name: &str| -> usize {
        let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap();
        text.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let buffered = 2 * (maximum("tcp_rmem") + maximum("tcp_wmem"));
    2 * buffered / frame_bytes
}

/// Resets the node's peak resident set (VmHWM) to its current RSS (`clear_refs` 5, proc(5)).
fn reset_peak_rss(pid: i32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// The node's peak resident set since the last [`reset_peak_rss`] (VmHWM), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Writes as long as the node reads (it closes the connection, or stops reading, when it has
/// had enough); how many frames went out.
fn flood(stream: &mut TcpStream, frames: impl Iterator<Item = Vec<u8>>) -> usize {
    flood_until_refused(stream, frames).0
}

/// [`flood`], also saying why it stopped early: the write that failed (the node closed the
/// connection, or stopped reading until the write timeout), `None` if every frame went out.
fn flood_until_refused(
    stream: &mut TcpStream,
    frames: impl Iterator<Item = Vec<u8>>,
) -> (usize, Option<std::io::Error>) {
    let mut sent = 0;
    for frame in frames {
        if let Err(error) = stream.write_all(&frame) {
            return (sent, Some(error));
        }
        sent += 1;
    }
    (sent, None)
}

fn rapid_reset_is_cut_off_and_others_are_served(driver: &str) {
    under_attack(driver, "rapid reset", 32 * 1024, |node, _| {
        let mut stream = open(node);
        let block = request_block();
        let frames = (0..100_000u32).flat_map(|index| {
            let id = 1 + 2 * index;
            [
                frame(HEADERS, END_HEADERS, id, &block),
                frame(RST_STREAM, 0, id, &8u32.to_be_bytes()),
            ]
        });
        let sent = flood(&mut stream, frames);
        assert!(
            sent < 200_000,
            "the node never cut the rapid-reset connection"
        );
    });
}

fn a_continuation_flood_is_refused_without_buffering_it(driver: &str) {
    under_attack(driver, "CONTINUATION flood", 32 * 1024, |node, _| {
        let mut stream = open(node);
        let mut block = request_block();
        block.truncate(block.len() - 1);
        let junk = vec![0x40u8; 16 * 1024 - 1];
        let frames = std::iter::once(frame(HEADERS, 0, 1, &block))
            .chain((0..20_000).map(|_| frame(CONTINUATION, 0, 1, &junk)));
        let sent = flood(&mut stream, frames);
        assert!(
            sent < 20_001,
            "the node read 320 MiB of one header block without closing"
        );
    });
}

fn settings_and_ping_floods_from_a_peer_that_never_reads_stay_bounded(driver: &str) {
    under_attack(driver, "SETTINGS + PING flood", 64 * 1024, |node, _| {
        let frames = frames_beyond_socket_buffers(15);
        let mut streams: Vec<TcpStream> = (0..4).map(|_| open(node)).collect();
        for (index, stream) in streams.iter_mut().enumerate() {
            stream
                .set_write_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
            let ping = frame(PING, 0, 0, &[7; 8]);
            // Never read: the acknowledgements back up; the node must not queue them forever.
            let (sent, stopped) = flood_until_refused(
                stream,
                (0..frames).map(|i| {
                    if i % 2 == 0 {
                        settings.clone()
                    } else {
                        ping.clone()
                    }
                }),
            );
            eprintln!("SETTINGS + PING flood {index}: {sent} of {frames} frames, then {stopped:?}");
            assert!(
                stopped.is_some(),
                "connection {index}: the node read all {frames} frames of a peer that never reads \
                 its acknowledgements: more than the kernel can buffer, so it queued them itself"
            );
        }
    });
}

fn an_hpack_bomb_is_refused_at_the_header_list_limit(driver: &str) {
    under_attack(driver, "HPACK bomb", 32 * 1024, |node, _| {
        let mut stream = open(node);
        // One 3,000-byte header added to the dynamic table (literal with incremental indexing:
        // 3,036 bytes of the default 4,096-byte table), then referenced 16,000 times (indexed
        // field 62): 48 MB decoded from 19 KB on the wire.
        let mut block = request_block();
        block.push(0x40);
        block.push(4);
        block.extend_from_slice(b"x-bm");
        block.extend_from_slice(&[0x7f, 0xb9, 0x16]); // length 3000 = 127 + 2873, 7-bit prefix
        block.extend_from_slice(&[b'a'; 3000]);
        block.extend(std::iter::repeat_n(0xbe, 16_000)); // 0x80 | 62
        let frames = block
            .chunks(16 * 1024 - 1)
            .enumerate()
            .map(|(index, chunk)| {
                let last = (index + 1) * (16 * 1024 - 1) >= block.len();
                let flags = if last { END_HEADERS | END_STREAM } else { 0 };
                let kind = if index == 0 { HEADERS } else { CONTINUATION };
                frame(kind, flags, 1, chunk)
            })
            .collect::<Vec<_>>();
        flood(&mut stream, frames.into_iter());
        // What the node answered: it must cut the connection with GOAWAY ENHANCE_YOUR_CALM
        // (the header list over its limit) and never take the bomb as a request.
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answered = Vec::new();
        let closed = loop {
            match read_frame(&mut stream) {
                Ok(Some(frame)) => answered.push(frame),
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        let kinds: Vec<(u8, u32, Option<u32>)> = answered
            .iter()
            .map(|frame| (frame.kind, frame.stream, frame.error_code()))
            .collect();
        assert!(
            answered
                .iter()
                .any(|frame| frame.kind == GOAWAY && frame.error_code() == Some(ENHANCE_YOUR_CALM)),
            "no GOAWAY ENHANCE_YOUR_CALM; frames (type, stream, error): {kinds:?}"
        );
        assert!(
            !answered
                .iter()
                .any(|frame| frame.stream == 1 && frame.kind == HEADERS),
            "the bomb was answered as a request: {kinds:?}"
        );
        assert!(
            closed.is_ok(),
            "the connection stayed open after the GOAWAY: {closed:?}"
        );
    });
}

/// Idle connections cost memory until `header_timeout` closes them: 127-140 KiB each measured here
/// with monoio-compat's adapter (two 64 KiB buffers per connection); 48-56 KiB since the
/// gathering adapter (`sluice_grpc::transport::compat`: a 16 KiB read buffer, a send buffer
/// only while there is something to send), measured 2026-11-26 on a busy machine. The bound
/// states what is known with room for allocator noise, so growth beyond it fails.
///
/// The two drivers' cases take turns: together they would hold 20,000 sockets in this test
/// process, over a common open-files limit, and fail on the client's side.
fn ten_thousand_idle_connections_do_not_stop_the_node_serving(driver: &str) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    under_attack(
        driver,
        "10,000 idle connections",
        10_000 * 128,
        |node, _| {
            let held: Vec<TcpStream> = (0..10_000).map(|_| open(node)).collect();
            // Not a synchronisation: the attack is holding them open while the good client
            // calls (a second of its calls).
            std::thread::sleep(Duration::from_secs(1));
            drop(held);
        },
    );
}

/// Zero-window stalls: peers that set their stream window to 0 (SETTINGS_INITIAL_WINDOW_SIZE),
/// open authenticated calls, and never read or grant credit. Each answer waits in the node for
/// credit that never comes; what that holds is bounded by the streams a connection may open,
/// and other clients are served meanwhile.
fn zero_window_stalls_hold_only_bounded_memory(driver: &str) {
    under_attack(driver, "zero-window stalls", 64 * 1024, |node, secrets| {
        let token = client_jwt(secrets, 50);
        let mut block = Vec::new();
        literal(&mut block, ":method", "POST");
        literal(&mut block, ":scheme", "http");
        literal(
            &mut block,
            ":path",
            sluice_tunnel::protocol::LIST_AGENTS_PATH,
        );
        literal(&mut block, ":authority", "node");
        literal(&mut block, "content-type", "application/grpc");
        literal(&mut block, "authorization", &format!("Bearer {token}"));
        let empty_message = [0u8; 5];
        let stalled: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut stream = open(node);
                stream
                    .write_all(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]))
                    .unwrap();
                let calls = (0..100u32).flat_map(|index| {
                    let id = 1 + 2 * index;
                    [
                        frame(HEADERS, END_HEADERS, id, &block),
                        frame(DATA, END_STREAM, id, &empty_message),
                    ]
                });
                flood(&mut stream, calls);
                stream
            })
            .collect();
        // Not a synchronisation: the attack is holding the stalled calls while the good
        // client calls (a second of its calls).
        std::thread::sleep(Duration::from_secs(1));
        drop(stalled);
    });
}
