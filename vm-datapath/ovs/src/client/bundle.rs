//! Atomic flow changes: one bundle opened, filled, checked with a barrier, then committed or
//! discarded.

use sluice_openflow::flow::Flow;
use sluice_openflow::{
    encode_barrier_request, encode_bundle_add_flow, encode_bundle_add_flow_mod,
    encode_bundle_control, BundleControl, BundleControlType, EncodeError, FlowMod, Message,
    OfError, BUNDLE_ATOMIC, BUNDLE_ORDERED,
};

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
}
