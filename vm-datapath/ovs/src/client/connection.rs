//! One live connection to the switch: the handshake, the reader task that routes replies by
//! xid, and the supervisor that reconnects after a loss.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use sluice_openflow::{
    decode, encode_barrier_request, encode_enable_packet_in, encode_features_request, encode_hello,
    encode_set_packet_in_format, negotiate_version, parse_header, DecodeError, Decoded,
    EncodeError, Features, Message, PacketIn, HEADER_LEN,
};

use super::{ClientError, Shared};

type Reply = Result<Decoded, DecodeError>;

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
pub(super) struct Connection {
    pub(super) version: u8,
    pub(super) features: Features,
    writer: tokio::sync::Mutex<WriteState>,
    /// Guarded by `pending`'s lock: false once the reader has stopped.
    pending: Mutex<Vec<Pending>>,
    alive: AtomicBool,
    pub(super) reader: Mutex<Option<JoinHandle<()>>>,
}

impl Connection {
    /// Registers interest in `count` xids from `first`; dropping the receiver forgets nothing by
    /// itself, so callers unregister through [`PendingGuard`].
    pub(super) fn register(self: &Arc<Self>, first: u32, count: u32) -> PendingGuard {
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
    pub(super) async fn send(
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
    pub(super) async fn send_streamed(
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

pub(super) struct PendingGuard {
    connection: Arc<Connection>,
    first: u32,
    replies: mpsc::UnboundedReceiver<Reply>,
}

impl PendingGuard {
    pub(super) async fn next(&mut self) -> Result<Decoded, ClientError> {
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
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
pub(super) async fn establish(shared: &Shared) -> Result<Arc<Connection>, ClientError> {
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
    let (read_half, write_half) = stream.into_split();
    let mut handshake = Handshake {
        reader: BufReader::with_capacity(64 << 10, read_half),
        writer: write_half,
        buf: Vec::with_capacity(64 << 10),
        out: Vec::with_capacity(256),
    };
    let version = handshake.exchange_hellos().await?;
    let features = handshake.set_up(version).await?;
    let Handshake {
        reader,
        writer,
        buf,
        ..
    } = handshake;

    let connection = Arc::new(Connection {
        version,
        features,
        writer: tokio::sync::Mutex::new(WriteState {
            socket: writer,
            buf: Vec::with_capacity(64 << 10),
        }),
        pending: Mutex::new(Vec::new()),
        alive: AtomicBool::new(true),
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

/// A fresh connection before the reader task takes it over: requests and replies in turn.
struct Handshake {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Received messages (kept for the reader task).
    buf: Vec<u8>,
    /// Messages to send.
    out: Vec<u8>,
}

impl Handshake {
    /// Sends our hello and picks the version from the switch's.
    async fn exchange_hellos(&mut self) -> Result<u8, ClientError> {
        encode_hello(&mut self.out, 0);
        self.writer.write_all(&self.out).await?;
        loop {
            let (_, reply) = read_message(&mut self.reader, &mut self.buf).await?;
            let header_version = self.buf[0];
            match reply?.message {
                Message::Hello { versions } => {
                    return negotiate_version(header_version, versions).ok_or(
                        ClientError::Incompatible {
                            offered: versions.unwrap_or(1 << header_version.min(31)),
                        },
                    );
                }
                Message::Error(error) => {
                    return Err(ClientError::Rejected {
                        request: "HELLO",
                        error,
                    })
                }
                _ => continue,
            }
        }
    }

    /// Asks for the features and for packet-ins (in the packet-in2 format), then waits for the
    /// barrier behind them; answers echo requests meanwhile.
    async fn set_up(&mut self, version: u8) -> Result<Features, ClientError> {
        self.out.clear();
        encode_features_request(&mut self.out, version, 1);
        encode_set_packet_in_format(&mut self.out, version, 2);
        encode_enable_packet_in(&mut self.out, version, 3);
        encode_barrier_request(&mut self.out, version, 4);
        self.writer.write_all(&self.out).await?;
        let mut features = None;
        loop {
            let (xid, reply) = read_message(&mut self.reader, &mut self.buf).await?;
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
                    self.out.clear();
                    sluice_openflow::encode_echo(&mut self.out, version, xid, true, &payload)?;
                    self.writer.write_all(&self.out).await?;
                }
                Message::BarrierReply if xid == 4 => break,
                _ => {}
            }
        }
        features.ok_or(ClientError::Unexpected {
            request: "FEATURES_REQUEST",
            message: "barrier reply came before the features reply".to_string(),
        })
    }
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
pub(super) async fn supervise(shared: Weak<Shared>, lost: Arc<Notify>, closed: Arc<Notify>) {
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
