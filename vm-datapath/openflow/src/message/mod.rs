//! Whole OpenFlow messages: encoders that append to a reusable buffer and one decoder that turns
//! a framed message into a typed [`Message`].

use std::fmt;
use std::time::Duration;

use crate::flow::{Action, Flow, FlowKey, Match};
use crate::meter::{MeterMod, MeterStats, MeterStatsRequest};
use crate::wire::Reader;
use crate::{names, DecodeError, HEADER_LEN, OFP13, OFP14};

const OFPT_HELLO: u8 = 0;
const OFPT_ERROR: u8 = 1;
const OFPT_ECHO_REQUEST: u8 = 2;
const OFPT_ECHO_REPLY: u8 = 3;
const OFPT_EXPERIMENTER: u8 = 4;
const OFPT_FEATURES_REQUEST: u8 = 5;
const OFPT_FEATURES_REPLY: u8 = 6;
const OFPT_PACKET_IN: u8 = 10;
const OFPT_PACKET_OUT: u8 = 13;
const OFPT_FLOW_MOD: u8 = 14;
const OFPT_MULTIPART_REQUEST: u8 = 18;
const OFPT_MULTIPART_REPLY: u8 = 19;
const OFPT_BARRIER_REQUEST: u8 = 20;
const OFPT_BARRIER_REPLY: u8 = 21;
const OFPT_METER_MOD: u8 = 29;
const OFPT_BUNDLE_CONTROL: u8 = 33;
const OFPT_BUNDLE_ADD_MESSAGE: u8 = 34;

const OFPHET_VERSIONBITMAP: u16 = 1;
const OFPMP_FLOW: u16 = 1;
const OFPMP_METER: u16 = 9;
const OFPMPF_MORE: u16 = 1;
const OFPTT_ALL: u8 = 0xff;
const OFPP_ANY: u32 = 0xffff_ffff;
const OFPG_ANY: u32 = 0xffff_ffff;
const OFP_NO_BUFFER: u32 = 0xffff_ffff;

const ONF_EXPERIMENTER_ID: u32 = 0x4f4e_4600;
const ONFT_BUNDLE_CONTROL: u32 = 2300;
const ONFT_BUNDLE_ADD_MESSAGE: u32 = 2301;
const NXT_SET_PACKET_IN_FORMAT: u32 = 16;
const NXT_SET_ASYNC_CONFIG: u32 = 19;
const NXT_PACKET_IN2: u32 = 30;
const NXPIF_NXT_PACKET_IN2: u32 = 2;

/// The versions this codec speaks, as a hello version bitmap.
pub const SUPPORTED_VERSIONS: u32 = (1 << OFP13) | (1 << OFP14);

/// The common header of a received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub msg_type: u8,
    pub length: u16,
    pub xid: u32,
}

/// Reads the header at the start of `buf` (at least [`HEADER_LEN`] bytes), checking that the
/// length can frame a message.
pub fn parse_header(buf: &[u8]) -> Result<Header, DecodeError> {
    let mut reader = Reader::new(buf, "OpenFlow header");
    let header = Header {
        version: reader.u8()?,
        msg_type: reader.u8()?,
        length: reader.u16()?,
        xid: reader.u32()?,
    };
    if usize::from(header.length) < HEADER_LEN {
        return Err(DecodeError::BadLength {
            what: "OpenFlow message",
            length: usize::from(header.length),
        });
    }
    Ok(header)
}

/// A flow table change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FlowMod {
    /// Add the flow, replacing one with the same table, priority and match (cookie included).
    Add(Flow),
    /// Replace the actions of exactly this flow (the cookie is kept, as OpenFlow 1.3 specifies).
    ModifyStrict(Flow),
    /// Delete exactly this flow.
    DeleteStrict(FlowKey),
    /// Delete every flow whose cookie matches `cookie` under `cookie_mask`, in one table or all.
    DeleteByCookie {
        table: Option<u8>,
        cookie: u64,
        cookie_mask: u64,
    },
}

impl fmt::Display for FlowMod {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowMod::Add(flow) => write!(out, "add {flow}"),
            FlowMod::ModifyStrict(flow) => write!(out, "modify_strict {flow}"),
            FlowMod::DeleteStrict(key) => {
                write!(
                    out,
                    "delete_strict table={},priority={}",
                    key.table, key.priority
                )?;
                if key.matches != Match::default() {
                    write!(out, ",{}", key.matches)?;
                }
                Ok(())
            }
            FlowMod::DeleteByCookie {
                table,
                cookie,
                cookie_mask,
            } => {
                out.write_str("delete ")?;
                if let Some(table) = table {
                    write!(out, "table={table},")?;
                }
                write!(out, "cookie={cookie:#x}/{cookie_mask:#x}")
            }
        }
    }
}

/// Kinds of bundle control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BundleControlType {
    OpenRequest,
    OpenReply,
    CloseRequest,
    CloseReply,
    CommitRequest,
    CommitReply,
    DiscardRequest,
    DiscardReply,
}

impl BundleControlType {
    fn code(self) -> u16 {
        self as u16
    }

    fn from_code(code: u16) -> Result<Self, DecodeError> {
        use BundleControlType::*;
        Ok(match code {
            0 => OpenRequest,
            1 => OpenReply,
            2 => CloseRequest,
            3 => CloseReply,
            4 => CommitRequest,
            5 => CommitReply,
            6 => DiscardRequest,
            7 => DiscardReply,
            other => {
                return Err(DecodeError::Unsupported {
                    what: "bundle control type",
                    value: u64::from(other),
                })
            }
        })
    }
}

/// Bundle flag: all messages apply or none.
pub const BUNDLE_ATOMIC: u16 = 1;
/// Bundle flag: messages apply in the order they were added.
pub const BUNDLE_ORDERED: u16 = 2;

/// A bundle control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BundleControl {
    pub bundle_id: u32,
    pub kind: BundleControlType,
    pub flags: u16,
}

/// A flow statistics request: flows whose cookie matches `cookie` under `cookie_mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowStatsRequest {
    pub table: Option<u8>,
    pub cookie: u64,
    pub cookie_mask: u64,
}

/// One flow in a flow statistics reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowStats {
    pub table: u8,
    pub priority: u16,
    pub cookie: u64,
    pub packets: u64,
    pub bytes: u64,
    pub duration: Duration,
    /// `None` when the switch reported match fields the model does not have.
    pub matches: Option<Match>,
    /// `None` when the switch reported instructions or actions the model does not have.
    pub actions: Option<Vec<Action>>,
}

impl FlowStats {
    /// The flow this entry describes, when its match and actions fit the model.
    pub fn flow(&self) -> Option<Flow> {
        Some(Flow {
            table: self.table,
            priority: self.priority,
            cookie: self.cookie,
            matches: self.matches.clone()?,
            actions: self.actions.clone()?,
        })
    }
}

/// The switch's answer to a features request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub datapath_id: u64,
    pub n_buffers: u32,
    pub n_tables: u8,
    pub capabilities: u32,
}

/// A packet sent to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketIn {
    pub table: u8,
    pub cookie: u64,
    pub reason: u8,
    pub in_port: Option<u32>,
    /// The `userdata` of the `controller` action that sent it (Nicira packet-in2 only).
    pub userdata: Vec<u8>,
    /// Length of the whole packet; `packet` may be truncated to the action's `max_len`.
    pub total_len: u32,
    pub packet: Vec<u8>,
}

/// A packet the controller injects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PacketOut {
    pub in_port: u32,
    pub actions: Vec<Action>,
    pub packet: Vec<u8>,
}

/// An error reply, with enough of the failed request to name it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct OfError {
    pub err_type: u16,
    pub code: u16,
    /// For experimenter errors (type 0xffff), the experimenter id.
    pub experimenter: Option<u32>,
    /// The start of the failed request, as the switch echoed it.
    pub data: Vec<u8>,
}

impl OfError {
    /// The header of the failed request, when the switch echoed enough of it.
    pub fn failed_request(&self) -> Option<Header> {
        let mut reader = Reader::new(&self.data, "failed request");
        Some(Header {
            version: reader.u8().ok()?,
            msg_type: reader.u8().ok()?,
            length: reader.u16().ok()?,
            xid: reader.u32().ok()?,
        })
    }
}

impl fmt::Display for OfError {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(out, "OFPET_{}", names::error_type_name(self.err_type))?;
        match (
            self.experimenter,
            names::error_code_name(self.err_type, self.code),
        ) {
            (Some(experimenter), _) => {
                write!(out, " (experimenter {experimenter:#x}, code {})", self.code)?
            }
            (None, Some(code)) => write!(out, "/{code} ({}/{})", self.err_type, self.code)?,
            (None, None) => write!(out, " ({}/{})", self.err_type, self.code)?,
        }
        if let Some(request) = self.failed_request() {
            write!(
                out,
                " for {} xid {:#x}",
                names::message_type_name(request.msg_type),
                request.xid
            )?;
        }
        Ok(())
    }
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `versions` is the sender's version bitmap, when it sent one.
    Hello {
        versions: Option<u32>,
    },
    Error(OfError),
    EchoRequest(Vec<u8>),
    EchoReply(Vec<u8>),
    FeaturesRequest,
    FeaturesReply(Features),
    /// Boxed: a flow mod is much larger than every other message.
    FlowMod(Box<FlowMod>),
    PacketIn(PacketIn),
    PacketOut(PacketOut),
    BarrierRequest,
    BarrierReply,
    FlowStatsRequest(FlowStatsRequest),
    FlowStatsReply {
        more: bool,
        flows: Vec<FlowStats>,
    },
    MeterMod(MeterMod),
    MeterStatsRequest(MeterStatsRequest),
    MeterStatsReply {
        more: bool,
        meters: Vec<MeterStats>,
    },
    BundleControl(BundleControl),
    BundleAdd {
        bundle_id: u32,
        flags: u16,
        message: Box<Decoded>,
    },
    /// A message this codec does not interpret (port status, role replies...).
    Other,
}

/// A decoded message with its header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub version: u8,
    pub xid: u32,
    pub message: Message,
}

const OFPFC_ADD: u8 = 0;
const OFPFC_MODIFY_STRICT: u8 = 2;
const OFPFC_DELETE: u8 = 3;
const OFPFC_DELETE_STRICT: u8 = 4;

mod decode;
mod encode;

pub use decode::decode;
pub use encode::*;
