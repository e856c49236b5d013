//! OpenFlow client over a bridge's management socket (`<rundir>/<bridge>.mgmt`).
//!
//! One reader task per connection routes replies to waiting requests by xid; requests encode
//! into a per-connection buffer that is reused. When the switch goes away (OVS restart) a
//! supervisor reconnects with backoff and bumps [`OpenFlowClient::connection_generation`], which
//! is the owner's hook to replay its desired flows onto the fresh switch.

mod bundle;
mod connection;
mod meter;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};

use sluice_openflow::{
    encode_barrier_request, encode_flow_stats_request, encode_packet_out, DecodeError, Decoded,
    EncodeError, Features, FlowStats, FlowStatsRequest, Message, OfError, PacketIn, PacketOut,
};

use connection::{establish, lock, supervise, Connection};

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
