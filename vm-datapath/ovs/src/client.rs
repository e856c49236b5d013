//! OpenFlow client over a bridge's management socket (`<rundir>/<bridge>.mgmt`).
//!
//! One reader task per connection routes replies to waiting requests by xid; requests encode
//! into a per-connection buffer that is reused. When the switch goes away (OVS restart) a
//! supervisor reconnects with backoff and bumps [`OpenFlowClient::connection_generation`], which
//! is the owner's hook to replay its desired flows onto the fresh switch.

mod meter;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use sluice_openflow::flow::Flow;
use sluice_openflow::{
    decode, encode_barrier_request, encode_bundle_add_flow, encode_bundle_add_flow_mod,
    encode_bundle_control, encode_enable_packet_in, encode_features_request,
    encode_flow_stats_request, encode_hello, encode_packet_out, encode_set_packet_in_format,
    negotiate_version, parse_header, BundleControl, BundleControlType, DecodeError, Decoded,
    EncodeError, Features, FlowMod, FlowStats, FlowStatsRequest, Message, OfError, PacketIn,
    PacketOut, BUNDLE_ATOMIC, BUNDLE_ORDERED, HEADER_LEN,
};

/// Timeouts and limits of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Connecting plus the hello/features handshake.
    pub connect_timeout: Duration,
    /// Waiting for the reply to one request (a whole bundle counts as one request).
    pub request_timeout: Duration,
    /// Packet-ins buffered for [`OpenFlowClient::packet_ins`]; more are dropped (and counted).
    pub packet_in_queue: usize,
    /// Longest pause between reconnection attempts.
    pub max_reconnect_backoff: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            packet_in_queue: 1024,
            max_reconnect_backoff: Duration::from_secs(1),
        }
    }
}

/// What went wrong talking to the switch.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("I/O on the OpenFlow connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the switch speaks neither OpenFlow 1.3 nor 1.4 (its hello offered bitmap {offered:#x}); set the bridge's protocols to include OpenFlow13/OpenFlow14")]
    Incompatible { offered: u32 },
    #[error(
        "no OpenFlow handshake with {path} within {timeout:?} (is it a bridge's .mgmt socket?)"
    )]
    HandshakeTimeout { path: PathBuf, timeout: Duration },
    #[error("{request} (xid {xid:#x}) got no reply within {timeout:?}")]
    Timeout {
        request: &'static str,
        xid: u32,
        timeout: Duration,
    },
    #[error("the connection to the switch was lost (it will be re-established)")]
    Disconnected,
    #[error("the switch rejected {request}: {error}")]
    Rejected {
        request: &'static str,
        error: OfError,
    },
    #[error(
        "bundle rolled back, nothing applied: flow mod #{index} `{flow_mod}` was rejected: {error}"
    )]
    BundleRejected {
        index: usize,
        flow_mod: String,
        error: OfError,
    },
    #[error("unexpected reply to {request}: {message}")]
    Unexpected {
        request: &'static str,
        message: String,
    },
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("malformed message from the switch: {0}")]
    Decode(#[from] DecodeError),
}

type Reply = Result<Decoded, DecodeError>;

/// Bytes encoded before each write of a large bundle: big enough for few system calls, small
/// enough that the switch gets to work early.
const STREAM_CHUNK: usize = 64 << 10;

/// Requests waiting for messages whose xid is in `first..first+count` (wrapping).
struct Pending {
    first: u32,
    count: u32,
    replies: mpsc::UnboundedSender<Reply>,
}

struct WriteState {
    socket: OwnedWriteHalf,
    buf: Vec<u8>,
}

/// One live connection.
struct Connection {
    version: u8,
    features: Features,
    writer: tokio::sync::Mutex<WriteState>,
    /// Guarded by `pending`'s lock: false once the reader has stopped.
    pending: Mutex<Vec<Pending>>,
    alive: std::sync::atomic::AtomicBool,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl Connection {
    /// Registers interest in `count` xids from `first`; dropping the receiver forgets nothing by
    /// itself, so callers unregister through [`PendingGuard`].
    fn register(self: &Arc<Self>, first: u32, count: u32) -> PendingGuard {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut pending = lock(&self.pending);
        // On a dead connection the sender is dropped right away: the waiter sees Disconnected.
        if self.alive.load(Ordering::Relaxed) {
            pending.push(Pending {
                first,
                count,
                replies: tx,
            });
        }
        PendingGuard {
            connection: self.clone(),
            first,
            replies: rx,
        }
    }

    /// Encodes with `encode` into the reused buffer and writes it out in one go.
    async fn send(
        &self,
        encode: impl FnOnce(&mut Vec<u8>, u8) -> Result<(), EncodeError>,
    ) -> Result<(), ClientError> {
        let mut encode = Some(encode);
        self.send_streamed(|buf, version| {
            if let Some(encode) = encode.take() {
                encode(buf, version)?;
            }
            Ok(true)
        })
        .await
    }

    /// Writes what `fill` encodes, chunk by chunk, until it reports it is done: the switch
    /// starts working on the first messages of a large bundle while later ones are encoded.
    /// Other requests wait for the whole sequence (the writer lock is held throughout).
    async fn send_streamed(
        &self,
        mut fill: impl FnMut(&mut Vec<u8>, u8) -> Result<bool, EncodeError>,
    ) -> Result<(), ClientError> {
        let mut state = self.writer.lock().await;
        let WriteState { socket, buf } = &mut *state;
        let result = loop {
            buf.clear();
            let done = fill(buf, self.version)?;
            if let Err(err) = socket.write_all(buf).await {
                break Err(err);
            }
            if done {
                break Ok(());
            }
        };
        // Keep the buffer for reuse unless something inflated it.
        if buf.capacity() > 4 << 20 {
            *buf = Vec::with_capacity(64 << 10);
        }
        result.map_err(|err| match err.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                ClientError::Disconnected
            }
            _ => ClientError::Io(err),
        })
    }
}

struct PendingGuard {
    connection: Arc<Connection>,
    first: u32,
    replies: mpsc::UnboundedReceiver<Reply>,
}

impl PendingGuard {
    async fn next(&mut self) -> Result<Decoded, ClientError> {
        match self.replies.recv().await {
            Some(reply) => Ok(reply?),
            None => Err(ClientError::Disconnected),
        }
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        lock(&self.connection.pending).retain(|p| p.first != self.first);
    }
}

/// Locks a std mutex, recovering from poisoning: the guarded data (pending lists, handles) stays
/// consistent even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Shared {
    path: PathBuf,
    config: ClientConfig,
    connection: Mutex<Option<Arc<Connection>>>,
    next_xid: AtomicU32,
    generation: watch::Sender<u64>,
    lost: Arc<Notify>,
    closed: Arc<Notify>,
    packet_in_tx: mpsc::Sender<PacketIn>,
    packet_in_rx: Mutex<Option<mpsc::Receiver<PacketIn>>>,
    dropped_packet_ins: Arc<AtomicU64>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(connection) = lock(&self.connection).take() {
            if let Some(reader) = lock(&connection.reader).take() {
                reader.abort();
            }
        }
        self.closed.notify_one();
    }
}

/// A native OpenFlow 1.3/1.4 client. Cheap to clone; all clones share one connection.
#[derive(Clone)]
pub struct OpenFlowClient {
    shared: Arc<Shared>,
}

impl OpenFlowClient {
    /// Connects to the switch at `path` (a bridge's `.mgmt` socket), negotiates the version and
    /// keeps the connection up from then on. Must be called inside a tokio runtime.
    pub async fn connect(
        path: impl AsRef<Path>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let (packet_in_tx, packet_in_rx) = mpsc::channel(config.packet_in_queue.max(1));
        let shared = Arc::new(Shared {
            path: path.as_ref().to_path_buf(),
            config,
            connection: Mutex::new(None),
            next_xid: AtomicU32::new(1),
            generation: watch::channel(0).0,
            lost: Arc::new(Notify::new()),
            closed: Arc::new(Notify::new()),
            packet_in_tx,
            packet_in_rx: Mutex::new(Some(packet_in_rx)),
            dropped_packet_ins: Arc::new(AtomicU64::new(0)),
        });
        let connection = establish(&shared).await?;
        *lock(&shared.connection) = Some(connection);
        shared.generation.send_replace(1);
        tokio::spawn(supervise(
            Arc::downgrade(&shared),
            shared.lost.clone(),
            shared.closed.clone(),
        ));
        Ok(OpenFlowClient { shared })
    }

    /// Counts connections made so far (1 after `connect`). It changes after every reconnect:
    /// the owner then replays its desired state, since a restarted switch has no flows.
    pub fn connection_generation(&self) -> watch::Receiver<u64> {
        self.shared.generation.subscribe()
    }

    /// The negotiated OpenFlow version of the current connection.
    pub fn version(&self) -> Result<u8, ClientError> {
        Ok(self.current()?.version)
    }

    /// The features the switch reported on the current connection.
    pub fn features(&self) -> Result<Features, ClientError> {
        Ok(self.current()?.features)
    }

    /// Packet-ins (from `controller` actions) of every connection. Only the first caller gets
    /// the receiver.
    pub fn packet_ins(&self) -> Option<mpsc::Receiver<PacketIn>> {
        lock(&self.shared.packet_in_rx).take()
    }

    /// Packet-ins dropped because the receiver did not keep up.
    pub fn dropped_packet_ins(&self) -> u64 {
        self.shared.dropped_packet_ins.load(Ordering::Relaxed)
    }

    fn current(&self) -> Result<Arc<Connection>, ClientError> {
        lock(&self.shared.connection)
            .clone()
            .ok_or(ClientError::Disconnected)
    }

    /// Reserves `count` consecutive xids (wrapping; 0 is never handed out so it can mean none).
    fn reserve_xids(&self, count: u32) -> u32 {
        loop {
            let first = self.shared.next_xid.fetch_add(count, Ordering::Relaxed);
            let last = first.wrapping_add(count - 1);
            if first != 0 && last >= first {
                return first;
            }
        }
    }

    async fn with_timeout<T>(
        &self,
        request: &'static str,
        xid: u32,
        work: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let timeout = self.shared.config.request_timeout;
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ClientError::Timeout {
                request,
                xid,
                timeout,
            })?
    }

    /// Sends a barrier and waits until the switch has processed everything sent before it.
    pub async fn barrier(&self) -> Result<(), ClientError> {
        let connection = self.current()?;
        let xid = self.reserve_xids(1);
        let mut pending = connection.register(xid, 1);
        self.with_timeout("BARRIER_REQUEST", xid, async {
            connection
                .send(|buf, version| {
                    encode_barrier_request(buf, version, xid);
                    Ok(())
                })
                .await?;
            expect_reply(pending.next().await?, "BARRIER_REQUEST", |m| {
                matches!(m, Message::BarrierReply)
            })
        })
        .await
    }

    /// Applies `flow_mods` atomically in one bundle (open, add all, commit): either every flow
    /// mod takes effect at once or none does. A rejected flow mod is named in the error.
    pub async fn apply_bundle(&self, flow_mods: &[FlowMod]) -> Result<(), ClientError> {
        self.run_bundle(
            flow_mods.len(),
            |buf, version, xid, bundle_id, flags, index| {
                encode_bundle_add_flow_mod(buf, version, xid, bundle_id, flags, &flow_mods[index])
            },
            |index| flow_mods[index].to_string(),
        )
        .await
    }

    /// Adds `flows` atomically in one bundle, like [`Self::apply_bundle`] with `FlowMod::Add`
    /// for each but without copying them (the replay of a full state after a reconnect).
    pub async fn add_flows(&self, flows: &[Flow]) -> Result<(), ClientError> {
        self.run_bundle(
            flows.len(),
            |buf, version, xid, bundle_id, flags, index| {
                encode_bundle_add_flow(buf, version, xid, bundle_id, flags, &flows[index])
            },
            |index| format!("add {}", flows[index]),
        )
        .await
    }

    async fn run_bundle(
        &self,
        len: usize,
        encode_nth: impl Fn(&mut Vec<u8>, u8, u32, u32, u16, usize) -> Result<(), EncodeError>,
        describe_nth: impl Fn(usize) -> String,
    ) -> Result<(), ClientError> {
        // xids: open, one per flow mod, barrier, commit (or discard).
        let count = u32::try_from(len)
            .ok()
            .and_then(|n| n.checked_add(3))
            .ok_or(EncodeError::Invalid("too many flow mods for one bundle"))?;
        let connection = self.current()?;
        let open_xid = self.reserve_xids(count);
        let barrier_xid = open_xid.wrapping_add(count - 2);
        let final_xid = open_xid.wrapping_add(count - 1);
        // The xid doubles as the bundle id: unique among this client's open bundles.
        let bundle_id = open_xid;
        let flags = BUNDLE_ATOMIC | BUNDLE_ORDERED;
        let control = |kind| BundleControl {
            bundle_id,
            kind,
            flags,
        };
        let rejected = |index: usize, error: OfError| ClientError::BundleRejected {
            index,
            flow_mod: describe_nth(index),
            error,
        };
        let flow_mod_index = |xid: u32| {
            let offset = xid.wrapping_sub(open_xid) as usize;
            (1..=len).contains(&offset).then(|| offset - 1)
        };
        let mut pending = connection.register(open_xid, count);
        self.with_timeout("BUNDLE_CONTROL commit", final_xid, async {
            // Phase 1: open and fill the bundle, then a barrier, so that every flow mod the
            // switch refuses while adding is known before anything is committed (OVS would
            // otherwise commit the rest of the bundle without the refused message).
            let mut next = 0;
            connection
                .send_streamed(|buf, version| {
                    if next == 0 {
                        encode_bundle_control(
                            buf,
                            version,
                            open_xid,
                            &control(BundleControlType::OpenRequest),
                        )?;
                    }
                    while next < len && buf.len() < STREAM_CHUNK {
                        let xid = open_xid.wrapping_add(1 + next as u32);
                        encode_nth(buf, version, xid, bundle_id, flags, next)?;
                        next += 1;
                    }
                    if next < len {
                        return Ok(false);
                    }
                    encode_barrier_request(buf, version, barrier_xid);
                    Ok(true)
                })
                .await?;
            let mut first_rejection: Option<(usize, OfError)> = None;
            loop {
                let reply = pending.next().await?;
                match reply.message {
                    Message::Error(error) => match flow_mod_index(reply.xid) {
                        Some(index) => {
                            first_rejection.get_or_insert((index, error));
                        }
                        None => {
                            return Err(ClientError::Rejected {
                                request: "BUNDLE_CONTROL open",
                                error,
                            })
                        }
                    },
                    Message::BundleControl(BundleControl {
                        kind: BundleControlType::OpenReply,
                        ..
                    }) if reply.xid == open_xid => {}
                    Message::BarrierReply if reply.xid == barrier_xid => break,
                    other => {
                        return Err(ClientError::Unexpected {
                            request: "BUNDLE_ADD_MESSAGE",
                            message: format!("{other:?}"),
                        })
                    }
                }
            }

            // Phase 2: commit, or discard when something was refused.
            let kind = match first_rejection {
                Some(_) => BundleControlType::DiscardRequest,
                None => BundleControlType::CommitRequest,
            };
            connection
                .send(|buf, version| encode_bundle_control(buf, version, final_xid, &control(kind)))
                .await?;
            loop {
                let reply = pending.next().await?;
                match reply.message {
                    Message::Error(error) => match flow_mod_index(reply.xid) {
                        Some(index) => {
                            first_rejection.get_or_insert((index, error));
                        }
                        None => {
                            return Err(match first_rejection {
                                Some((index, error)) => rejected(index, error),
                                None => ClientError::Rejected {
                                    request: "BUNDLE_CONTROL commit",
                                    error,
                                },
                            })
                        }
                    },
                    Message::BundleControl(BundleControl {
                        kind: BundleControlType::CommitReply | BundleControlType::DiscardReply,
                        ..
                    }) if reply.xid == final_xid => {
                        return match first_rejection {
                            None => Ok(()),
                            Some((index, error)) => Err(rejected(index, error)),
                        };
                    }
                    other => {
                        return Err(ClientError::Unexpected {
                            request: "BUNDLE_CONTROL commit",
                            message: format!("{other:?}"),
                        })
                    }
                }
            }
        })
        .await
    }

    /// Statistics of every flow whose cookie matches `cookie` under `cookie_mask` (mask 0: all).
    pub async fn flow_stats(
        &self,
        cookie: u64,
        cookie_mask: u64,
    ) -> Result<Vec<FlowStats>, ClientError> {
        let connection = self.current()?;
        let xid = self.reserve_xids(1);
        let mut pending = connection.register(xid, 1);
        let request = FlowStatsRequest {
            table: None,
            cookie,
            cookie_mask,
        };
        self.with_timeout("MULTIPART_REQUEST flow", xid, async {
            connection
                .send(|buf, version| encode_flow_stats_request(buf, version, xid, &request))
                .await?;
            let mut all = Vec::new();
            loop {
                match pending.next().await?.message {
                    Message::FlowStatsReply { more, flows } => {
                        all.extend(flows);
                        if !more {
                            return Ok(all);
                        }
                    }
                    Message::Error(error) => {
                        return Err(ClientError::Rejected {
                            request: "MULTIPART_REQUEST flow",
                            error,
                        })
                    }
                    other => {
                        return Err(ClientError::Unexpected {
                            request: "MULTIPART_REQUEST flow",
                            message: format!("{other:?}"),
                        })
                    }
                }
            }
        })
        .await
    }

    /// Injects a packet and waits (with a barrier) until the switch has processed it.
    pub async fn packet_out(&self, packet_out: &PacketOut) -> Result<(), ClientError> {
        let connection = self.current()?;
        let xid = self.reserve_xids(2);
        let mut pending = connection.register(xid, 2);
        self.with_timeout("PACKET_OUT", xid, async {
            connection
                .send(|buf, version| {
                    encode_packet_out(buf, version, xid, packet_out)?;
                    encode_barrier_request(buf, version, xid.wrapping_add(1));
                    Ok(())
                })
                .await?;
            expect_reply(pending.next().await?, "PACKET_OUT", |m| {
                matches!(m, Message::BarrierReply)
            })
        })
        .await
    }
}

fn expect_reply(
    reply: Decoded,
    request: &'static str,
    wanted: impl Fn(&Message) -> bool,
) -> Result<(), ClientError> {
    match reply.message {
        Message::Error(error) => Err(ClientError::Rejected { request, error }),
        message if wanted(&message) => Ok(()),
        message => Err(ClientError::Unexpected {
            request,
            message: format!("{message:?}"),
        }),
    }
}

/// Reads one framed message into `buf` (reused) and decodes it.
async fn read_message(
    reader: &mut BufReader<OwnedReadHalf>,
    buf: &mut Vec<u8>,
) -> Result<(u32, Reply), std::io::Error> {
    buf.resize(HEADER_LEN, 0);
    reader.read_exact(&mut buf[..HEADER_LEN]).await?;
    let header = parse_header(buf).map_err(|err| {
        // A length below the header size cannot be framed: the stream is unusable.
        std::io::Error::new(std::io::ErrorKind::InvalidData, err)
    })?;
    let length = usize::from(header.length);
    buf.resize(length, 0);
    reader.read_exact(&mut buf[HEADER_LEN..]).await?;
    Ok((header.xid, decode(buf)))
}

/// Connects and runs the handshake: hellos, version choice, features, packet-in setup.
async fn establish(shared: &Shared) -> Result<Arc<Connection>, ClientError> {
    let timeout = shared.config.connect_timeout;
    tokio::time::timeout(timeout, establish_inner(shared))
        .await
        .map_err(|_| ClientError::HandshakeTimeout {
            path: shared.path.clone(),
            timeout,
        })?
}

async fn establish_inner(shared: &Shared) -> Result<Arc<Connection>, ClientError> {
    let stream =
        UnixStream::connect(&shared.path)
            .await
            .map_err(|source| ClientError::Connect {
                path: shared.path.clone(),
                source,
            })?;
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 << 10, read_half);
    let mut buf = Vec::with_capacity(64 << 10);
    let mut out = Vec::with_capacity(256);
    encode_hello(&mut out, 0);
    write_half.write_all(&out).await?;

    let version = loop {
        let (_, reply) = read_message(&mut reader, &mut buf).await?;
        let header_version = buf[0];
        match reply?.message {
            Message::Hello { versions } => {
                break negotiate_version(header_version, versions).ok_or(
                    ClientError::Incompatible {
                        offered: versions.unwrap_or(1 << header_version.min(31)),
                    },
                )?;
            }
            Message::Error(error) => {
                return Err(ClientError::Rejected {
                    request: "HELLO",
                    error,
                })
            }
            _ => continue,
        }
    };

    out.clear();
    encode_features_request(&mut out, version, 1);
    encode_set_packet_in_format(&mut out, version, 2);
    encode_enable_packet_in(&mut out, version, 3);
    encode_barrier_request(&mut out, version, 4);
    write_half.write_all(&out).await?;
    let mut features = None;
    loop {
        let (xid, reply) = read_message(&mut reader, &mut buf).await?;
        match reply?.message {
            Message::FeaturesReply(reply) => features = Some(reply),
            Message::Error(error) => {
                let request = match xid {
                    1 => "FEATURES_REQUEST",
                    2 => "NXT_SET_PACKET_IN_FORMAT",
                    3 => "NXT_SET_ASYNC_CONFIG",
                    _ => "handshake",
                };
                return Err(ClientError::Rejected { request, error });
            }
            Message::EchoRequest(payload) => {
                out.clear();
                sluice_openflow::encode_echo(&mut out, version, xid, true, &payload)?;
                write_half.write_all(&out).await?;
            }
            Message::BarrierReply if xid == 4 => break,
            _ => {}
        }
    }
    let features = features.ok_or(ClientError::Unexpected {
        request: "FEATURES_REQUEST",
        message: "barrier reply came before the features reply".to_string(),
    })?;

    let connection = Arc::new(Connection {
        version,
        features,
        writer: tokio::sync::Mutex::new(WriteState {
            socket: write_half,
            buf: Vec::with_capacity(64 << 10),
        }),
        pending: Mutex::new(Vec::new()),
        alive: std::sync::atomic::AtomicBool::new(true),
        reader: Mutex::new(None),
    });
    let task = tokio::spawn(read_loop(
        reader,
        buf,
        Arc::downgrade(&connection),
        shared.packet_in_tx.clone(),
        shared.dropped_packet_ins.clone(),
        shared.lost.clone(),
    ));
    *lock(&connection.reader) = Some(task);
    Ok(connection)
}

/// Routes every received message: replies to their waiting request, packet-ins to the queue,
/// echo requests answered. Ends (and reports the loss) when the socket closes.
async fn read_loop(
    mut reader: BufReader<OwnedReadHalf>,
    mut buf: Vec<u8>,
    connection: Weak<Connection>,
    packet_ins: mpsc::Sender<PacketIn>,
    dropped: Arc<AtomicU64>,
    lost: Arc<Notify>,
) {
    while let Ok((xid, reply)) = read_message(&mut reader, &mut buf).await {
        let Some(connection) = connection.upgrade() else {
            return;
        };
        match reply {
            Ok(Decoded {
                message: Message::PacketIn(packet_in),
                ..
            }) => {
                if packet_ins.try_send(packet_in).is_err() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Decoded {
                message: Message::EchoRequest(payload),
                ..
            }) => {
                // Answered from a task of its own: the writer may be busy with a large bundle
                // that the switch reads only as fast as this loop drains its replies.
                tokio::spawn(async move {
                    // A failed write shows up as a closed socket in this loop.
                    let _ = connection
                        .send(|out, version| {
                            sluice_openflow::encode_echo(out, version, xid, true, &payload)
                        })
                        .await;
                });
            }
            reply => {
                let pending = lock(&connection.pending);
                if let Some(waiter) = pending.iter().find(|p| xid.wrapping_sub(p.first) < p.count) {
                    // A waiter that gave up (timeout) has dropped its receiver; nothing to do.
                    let _ = waiter.replies.send(reply);
                }
            }
        }
    }
    if let Some(connection) = connection.upgrade() {
        // Waiters see their channel close and report Disconnected.
        let mut pending = lock(&connection.pending);
        connection.alive.store(false, Ordering::Relaxed);
        pending.clear();
    }
    lost.notify_one();
}

/// First pause after a failed reconnection attempt. A restarted ovs-vswitchd listens again within
/// a few hundred milliseconds and, in fail mode secure, forwards nothing until the replay: every
/// millisecond between its socket appearing and our next attempt is traffic cut. An attempt on a
/// unix socket that is not there yet costs microseconds, so start small and grow gently (x1.5).
const FIRST_RECONNECT_BACKOFF: Duration = Duration::from_millis(10);

/// Re-establishes the connection after each loss, with exponential backoff, until the client is
/// dropped.
async fn supervise(shared: Weak<Shared>, lost: Arc<Notify>, closed: Arc<Notify>) {
    loop {
        // Holds only weak references while waiting, so dropping the client ends this task.
        tokio::select! {
            _ = lost.notified() => {}
            _ = closed.notified() => return,
        }
        let mut backoff = FIRST_RECONNECT_BACKOFF;
        loop {
            let Some(strong) = shared.upgrade() else {
                return;
            };
            lock(&strong.connection).take();
            match establish(&strong).await {
                Ok(connection) => {
                    *lock(&strong.connection) = Some(connection);
                    strong.generation.send_modify(|generation| *generation += 1);
                    break;
                }
                Err(_) => {
                    let max = strong.config.max_reconnect_backoff;
                    drop(strong);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 3 / 2).min(max);
                }
            }
        }
    }
}
