//! A client that holds ONE HTTP/2 connection to a gateway and keeps a few pod lists in flight on
//! it, as kubectl and client-go do, until the gateway says GOAWAY. Then it finishes the streams
//! the gateway took (ids up to GOAWAY's last stream id), sends the ones it did not take again on a
//! new connection to the other gateway (RFC 9113 6.8: those were never processed), and goes on
//! there. Frames are written by hand (test_support::raw_h2) over rustls, so that every frame the
//! gateway sends is seen and counted.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use test_support::raw_h2::{
    frame, literal, read_frame, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, RST_STREAM,
    SETTINGS,
};
use test_support::ClientCert;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const WINDOW_UPDATE: u8 = 8;
const ACK: u8 = 0x1;
/// HPACK static table entry 8, `:status: 200`, as an indexed field (RFC 7541 appendix A).
const STATUS_200: u8 = 0x88;
/// Streams kept open at once on the held connection.
const IN_FLIGHT: usize = 4;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// What the held client saw; read by the test while it runs and at the end.
#[derive(Debug, Default, Clone)]
pub struct HeldReport {
    /// Pod lists answered 200, per connection (in the order the connections were opened).
    pub ok_per_connection: Vec<u64>,
    /// The gateway port of each connection.
    pub ports: Vec<u16>,
    /// Streams answered after the gateway's final GOAWAY arrived (ids up to its last stream id):
    /// the in-flight streams the drain let finish.
    pub ok_after_goaway: u64,
    /// Streams the gateway did not take (ids above GOAWAY's last stream id), sent again on the
    /// next connection.
    pub resent: u64,
    /// GOAWAY frames received: (last stream id, error code).
    pub goaways: Vec<(u32, u32)>,
    /// Anything else: a status other than 200, a reset stream, a connection lost mid-stream.
    pub failed: Vec<String>,
}

pub struct HeldClient {
    pub report: Arc<Mutex<HeldReport>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HeldClient {
    /// Holds a connection to `ports[0]` first, to `ports[1]` after its GOAWAY, and so on.
    pub fn start(ca: &std::path::Path, client: &ClientCert, host: &str, ports: [u16; 2]) -> Self {
        let config = tls_config(ca, client);
        let report = Arc::new(Mutex::new(HeldReport::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping, host) = (report.clone(), stop.clone(), host.to_string());
        let thread = std::thread::spawn(move || {
            let mut resend = 0u64;
            let mut turn = 0;
            while !stopping.load(Ordering::SeqCst) {
                let port = ports[turn % 2];
                turn += 1;
                let mut connection = match Connection::open(&config, &host, port) {
                    Ok(connection) => connection,
                    Err(error) => {
                        let mut report = shared.lock().unwrap();
                        report.failed.push(format!("connect to {port}: {error}"));
                        return;
                    }
                };
                {
                    let mut report = shared.lock().unwrap();
                    report.ok_per_connection.push(0);
                    report.ports.push(port);
                }
                resend = connection.run(&host, resend, &shared, &stopping);
            }
        });
        Self {
            report,
            stop,
            thread: Some(thread),
        }
    }

    pub fn report(&self) -> HeldReport {
        self.report.lock().unwrap().clone()
    }

    pub fn finish(mut self) -> HeldReport {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.report()
    }
}

fn tls_config(ca: &std::path::Path, client: &ClientCert) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&client.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&client.key).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Reads the TLS stream without writing: rustls's `Stream` flushes its pending writes before a
/// read, so after one write failed every read would fail with it, and the answers the gateway
/// sent before it stopped reading would never be seen.
struct ReadOnly<'a>(&'a mut Tls);

impl std::io::Read for ReadOnly<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.0.conn.reader().read(buf) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            if self.0.conn.read_tls(&mut self.0.sock)? == 0 {
                return Ok(0);
            }
            self.0
                .conn
                .process_new_packets()
                .map_err(std::io::Error::other)?;
        }
    }
}

struct Connection {
    tls: Tls,
    next_stream: u32,
    open: BTreeSet<u32>,
    /// Open streams whose response head came (a later HEADERS frame on one is its trailers).
    headed: BTreeSet<u32>,
    /// False once a write failed: no new stream goes out on this connection.
    writable: bool,
    /// Connection window used since the last WINDOW_UPDATE.
    consumed: u32,
    /// The lowest last stream id of the GOAWAYs so far (`None` before the first).
    last_stream: Option<u32>,
}

impl Connection {
    fn open(config: &Arc<rustls::ClientConfig>, host: &str, port: u16) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let name = ServerName::try_from(host.to_string()).unwrap();
        let connection = rustls::ClientConnection::new(config.clone(), name).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, tcp);
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tls.write_all(&hello)?;
        tls.flush()?;
        Ok(Self {
            tls,
            next_stream: 1,
            open: BTreeSet::new(),
            headed: BTreeSet::new(),
            writable: true,
            consumed: 0,
            last_stream: None,
        })
    }

    fn request(&mut self, host: &str, path: &str) -> std::io::Result<()> {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", host),
            (":path", path),
        ] {
            literal(&mut block, name, value);
        }
        let id = self.next_stream;
        self.next_stream += 2;
        self.open.insert(id);
        self.tls
            .write_all(&frame(HEADERS, END_HEADERS | END_STREAM, id, &block))?;
        self.tls.flush()
    }

    /// Serves the connection until the gateway closes it after GOAWAY (or `stop`); returns the
    /// number of streams to send again on the next connection.
    fn run(
        &mut self,
        host: &str,
        mut resend: u64,
        report: &Mutex<HeldReport>,
        stop: &AtomicBool,
    ) -> u64 {
        let fail = |what: String| report.lock().unwrap().failed.push(what);
        loop {
            // New streams only while no GOAWAY came: the gateway refuses those after it.
            while self.last_stream.is_none()
                && self.writable
                && !stop.load(Ordering::SeqCst)
                && self.open.len() < IN_FLIGHT
            {
                if let Err(error) = self.request(host, super::PODS) {
                    fail(format!("writing a request: {error}"));
                    return resend;
                }
                resend = resend.saturating_sub(1);
            }
            let leaving = self.last_stream.is_some() || !self.writable;
            if self.open.is_empty() && (leaving || stop.load(Ordering::SeqCst)) {
                return resend;
            }
            // A write of flow control or an acknowledgement can fail once the gateway has
            // stopped reading; what it sent before is still to be read, as a client does.
            // Its closing the connection fails only the streams it had taken and not answered.
            match read_frame(&mut ReadOnly(&mut self.tls)) {
                Ok(Some(frame)) => {
                    if self.on_frame(frame, report).is_err() {
                        self.writable = false;
                    }
                }
                Ok(None) => return resend + self.closed(report, "closed"),
                Err(error) => return resend + self.closed(report, &error.to_string()),
            }
        }
    }

    /// The connection is gone: its open streams the gateway had taken failed, the others are
    /// to be sent again (their number).
    fn closed(&mut self, report: &Mutex<HeldReport>, how: &str) -> u64 {
        let taken = self.last_stream.unwrap_or(u32::MAX);
        let mut report = report.lock().unwrap();
        let mut resend = 0;
        for id in std::mem::take(&mut self.open) {
            if id <= taken {
                report
                    .failed
                    .push(format!("stream {id}: connection {how} before its answer (writable {}, GOAWAY last {:?})", self.writable, self.last_stream));
            } else {
                resend += 1;
                report.resent += 1;
            }
        }
        resend
    }

    fn on_frame(
        &mut self,
        frame: test_support::raw_h2::Frame,
        report: &Mutex<HeldReport>,
    ) -> std::io::Result<()> {
        match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => {
                self.tls
                    .write_all(&test_support::raw_h2::frame(SETTINGS, ACK, 0, &[]))?;
            }
            PING if frame.flags & ACK == 0 => {
                let pong = test_support::raw_h2::frame(PING, ACK, 0, &frame.payload);
                self.tls.write_all(&pong)?;
            }
            GOAWAY => {
                let last = u32::from_be_bytes(frame.payload[..4].try_into().unwrap()) & 0x7fff_ffff;
                let code = frame.error_code().unwrap_or(0);
                self.last_stream = Some(self.last_stream.map_or(last, |seen| seen.min(last)));
                let mut report = report.lock().unwrap();
                report.goaways.push((last, code));
                // Streams above the last id were never processed: send them again elsewhere.
                let refused: Vec<u32> = self.open.range(last + 1..).copied().collect();
                for id in refused {
                    self.open.remove(&id);
                    report.resent += 1;
                }
            }
            RST_STREAM if self.open.remove(&frame.stream) => {
                let code = frame.error_code().unwrap_or(0);
                let mut report = report.lock().unwrap();
                if self.last_stream.is_some_and(|last| frame.stream > last) {
                    report.resent += 1;
                } else {
                    report
                        .failed
                        .push(format!("stream {} reset with code {code}", frame.stream));
                }
            }
            HEADERS if self.open.contains(&frame.stream) => {
                let status_ok =
                    !self.headed.insert(frame.stream) || frame.payload.first() == Some(&STATUS_200);
                let ended = frame.flags & END_STREAM != 0;
                if !status_ok {
                    self.open.remove(&frame.stream);
                    report.lock().unwrap().failed.push(format!(
                        "stream {}: not 200 (header block {:02x?})",
                        frame.stream,
                        &frame.payload[..frame.payload.len().min(16)]
                    ));
                } else if ended {
                    self.answered(frame.stream, report);
                }
            }
            DATA => {
                // The connection's window comes back once half of it was used, as the h2 crate
                // and Go's client do (answers are far below a stream's window). A WINDOW_UPDATE
                // after every DATA frame makes the legacy driver's gateway lose the last answers
                // of a drained connection (the report of issue 33 says how).
                self.consumed += frame.payload.len() as u32;
                if self.consumed >= 32 * 1024 {
                    let used = self.consumed.to_be_bytes();
                    self.consumed = 0;
                    self.tls
                        .write_all(&test_support::raw_h2::frame(WINDOW_UPDATE, 0, 0, &used))?;
                }
                if frame.flags & END_STREAM != 0 && self.open.contains(&frame.stream) {
                    self.answered(frame.stream, report);
                }
            }
            _ => {}
        }
        self.tls.flush()
    }

    fn answered(&mut self, stream: u32, report: &Mutex<HeldReport>) {
        self.open.remove(&stream);
        self.headed.remove(&stream);
        let mut report = report.lock().unwrap();
        if let Some(count) = report.ok_per_connection.last_mut() {
            *count += 1;
        }
        if self.last_stream.is_some() {
            report.ok_after_goaway += 1;
        }
    }
}
