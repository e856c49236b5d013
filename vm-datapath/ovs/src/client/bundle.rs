//! Atomic flow changes: one bundle opened, filled, checked with a barrier, then committed or
//! discarded.

use sluice_openflow::flow::Flow;
use sluice_openflow::{
    encode_barrier_request, encode_bundle_add_flow, encode_bundle_add_flow_mod,
    encode_bundle_control, BundleControl, BundleControlType, EncodeError, FlowMod, Message,
    OfError, BUNDLE_ATOMIC, BUNDLE_ORDERED,
};

use super::connection::{Connection, PendingGuard};
use super::{ClientError, OpenFlowClient};

/// Bytes encoded before each write of a large bundle: big enough for few system calls, small
/// enough that the switch gets to work early.
const STREAM_CHUNK: usize = 64 << 10;

impl OpenFlowClient {
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
        let xids = BundleXids {
            open: self.reserve_xids(count),
            len,
        };
        let mut pending = connection.register(xids.open, count);
        self.with_timeout("BUNDLE_CONTROL commit", xids.last(), async {
            let refused = fill(&connection, &mut pending, xids, &encode_nth).await?;
            finish(&connection, &mut pending, xids, refused)
                .await
                .map_err(|outcome| match outcome {
                    Refused::FlowMod(index, error) => ClientError::BundleRejected {
                        index,
                        flow_mod: describe_nth(index),
                        error,
                    },
                    Refused::Other(error) => error,
                })
        })
        .await
    }
}

/// The xids of one bundle: `open` (which doubles as the bundle id, unique among this client's
/// open bundles), one per flow mod, the barrier, and the commit or discard.
#[derive(Clone, Copy)]
struct BundleXids {
    open: u32,
    len: usize,
}

impl BundleXids {
    const FLAGS: u16 = BUNDLE_ATOMIC | BUNDLE_ORDERED;

    fn nth(self, index: usize) -> u32 {
        self.open.wrapping_add(1 + index as u32)
    }

    fn barrier(self) -> u32 {
        self.nth(self.len)
    }

    fn last(self) -> u32 {
        self.nth(self.len + 1)
    }

    /// Which flow mod an error with this xid is about, if any.
    fn flow_mod_index(self, xid: u32) -> Option<usize> {
        let offset = xid.wrapping_sub(self.open) as usize;
        (1..=self.len).contains(&offset).then(|| offset - 1)
    }

    fn control(self, kind: BundleControlType) -> BundleControl {
        BundleControl {
            bundle_id: self.open,
            kind,
            flags: Self::FLAGS,
        }
    }
}

/// Why a bundle did not apply: a flow mod the switch refused (named by the caller), or anything
/// else.
enum Refused {
    FlowMod(usize, OfError),
    Other(ClientError),
}

impl From<ClientError> for Refused {
    fn from(error: ClientError) -> Self {
        Refused::Other(error)
    }
}

/// Phase 1: open and fill the bundle, then a barrier, so that every flow mod the switch refuses
/// while adding is known before anything is committed (OVS would otherwise commit the rest of
/// the bundle without the refused message). Returns the first refusal.
async fn fill(
    connection: &Connection,
    pending: &mut PendingGuard,
    xids: BundleXids,
    encode_nth: &impl Fn(&mut Vec<u8>, u8, u32, u32, u16, usize) -> Result<(), EncodeError>,
) -> Result<Option<(usize, OfError)>, ClientError> {
    let mut next = 0;
    connection
        .send_streamed(|buf, version| {
            if next == 0 {
                encode_bundle_control(
                    buf,
                    version,
                    xids.open,
                    &xids.control(BundleControlType::OpenRequest),
                )?;
            }
            while next < xids.len && buf.len() < STREAM_CHUNK {
                encode_nth(
                    buf,
                    version,
                    xids.nth(next),
                    xids.open,
                    BundleXids::FLAGS,
                    next,
                )?;
                next += 1;
            }
            if next < xids.len {
                return Ok(false);
            }
            encode_barrier_request(buf, version, xids.barrier());
            Ok(true)
        })
        .await?;
    let mut first_rejection: Option<(usize, OfError)> = None;
    loop {
        let reply = pending.next().await?;
        match reply.message {
            Message::Error(error) => match xids.flow_mod_index(reply.xid) {
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
            }) if reply.xid == xids.open => {}
            Message::BarrierReply if reply.xid == xids.barrier() => return Ok(first_rejection),
            other => {
                return Err(ClientError::Unexpected {
                    request: "BUNDLE_ADD_MESSAGE",
                    message: format!("{other:?}"),
                })
            }
        }
    }
}

/// Phase 2: commit, or discard when something was refused.
async fn finish(
    connection: &Connection,
    pending: &mut PendingGuard,
    xids: BundleXids,
    mut first_rejection: Option<(usize, OfError)>,
) -> Result<(), Refused> {
    let kind = match first_rejection {
        Some(_) => BundleControlType::DiscardRequest,
        None => BundleControlType::CommitRequest,
    };
    connection
        .send(|buf, version| encode_bundle_control(buf, version, xids.last(), &xids.control(kind)))
        .await?;
    let refused = |rejection: Option<(usize, OfError)>| match rejection {
        None => Ok(()),
        Some((index, error)) => Err(Refused::FlowMod(index, error)),
    };
    loop {
        let reply = pending.next().await?;
        match reply.message {
            Message::Error(error) => match xids.flow_mod_index(reply.xid) {
                Some(index) => {
                    first_rejection.get_or_insert((index, error));
                }
                None => {
                    refused(first_rejection)?;
                    return Err(Refused::Other(ClientError::Rejected {
                        request: "BUNDLE_CONTROL commit",
                        error,
                    }));
                }
            },
            Message::BundleControl(BundleControl {
                kind: BundleControlType::CommitReply | BundleControlType::DiscardReply,
                ..
            }) if reply.xid == xids.last() => return refused(first_rejection),
            other => {
                return Err(Refused::Other(ClientError::Unexpected {
                    request: "BUNDLE_CONTROL commit",
                    message: format!("{other:?}"),
                }))
            }
        }
    }
}
