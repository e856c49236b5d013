//! Whole OpenFlow messages: encoders that append to a reusable buffer and one decoder that turns
//! a framed message into a typed [`Message`].

use std::fmt;
use std::time::Duration;

use super::actions::{
    is_instruction, put_action, put_instructions, read_actions_into, read_instructions,
    NX_VENDOR_ID,
};
use super::meter::{
    put_meter_mod, put_meter_stats, put_meter_stats_request, read_meter_mod, read_meter_stats,
    read_meter_stats_request, MeterMod, MeterStats, MeterStatsRequest,
};
use super::oxm::{put_match, read_match, read_tlv};
use super::wire::{round_up_8, Put, Reader};
use super::{names, DecodeError, EncodeError, HEADER_LEN, OFP13, OFP14};
use crate::flow::{Action, Flow, FlowKey, Match};

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

/// A message that is only a header.
fn put_header_only(out: &mut Vec<u8>, version: u8, msg_type: u8, xid: u32) {
    out.put_u8(version);
    out.put_u8(msg_type);
    out.put_u16(HEADER_LEN as u16);
    out.put_u32(xid);
}

fn start_message(out: &mut Vec<u8>, version: u8, msg_type: u8, xid: u32) -> usize {
    let start = out.len();
    out.put_u8(version);
    out.put_u8(msg_type);
    out.put_u16(0);
    out.put_u32(xid);
    start
}

fn finish_message(out: &mut Vec<u8>, start: usize) -> Result<(), EncodeError> {
    let len = u16::try_from(out.len() - start).map_err(|_| EncodeError::TooLong("message"))?;
    out.set_u16(start + 2, len);
    Ok(())
}

/// A hello offering OpenFlow 1.3 and 1.4.
pub fn encode_hello(out: &mut Vec<u8>, xid: u32) {
    let start = start_message(out, OFP14, OFPT_HELLO, xid);
    out.put_u16(OFPHET_VERSIONBITMAP);
    out.put_u16(8);
    out.put_u32(SUPPORTED_VERSIONS);
    // A hello of 16 bytes never exceeds the length limit.
    let len = (out.len() - start) as u16;
    out.set_u16(start + 2, len);
}

/// Picks the version to speak after exchanging hellos (OpenFlow 1.3.1 section 6.3.1): the
/// highest version in both bitmaps, or without a peer bitmap the lower of both highest versions.
pub fn negotiate_version(peer_header_version: u8, peer_versions: Option<u32>) -> Option<u8> {
    let common = match peer_versions {
        Some(bitmap) => bitmap & SUPPORTED_VERSIONS,
        None => {
            let version = peer_header_version.min(OFP14);
            if version >= 32 {
                return None;
            }
            (1u32 << version) & SUPPORTED_VERSIONS
        }
    };
    (common != 0).then(|| (31 - common.leading_zeros()) as u8)
}

/// An echo request or reply carrying `payload`.
pub fn encode_echo(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    reply: bool,
    payload: &[u8],
) -> Result<(), EncodeError> {
    let msg_type = if reply {
        OFPT_ECHO_REPLY
    } else {
        OFPT_ECHO_REQUEST
    };
    let start = start_message(out, version, msg_type, xid);
    out.extend_from_slice(payload);
    finish_message(out, start)
}

/// A features request.
pub fn encode_features_request(out: &mut Vec<u8>, version: u8, xid: u32) {
    put_header_only(out, version, OFPT_FEATURES_REQUEST, xid);
}

/// A barrier request.
pub fn encode_barrier_request(out: &mut Vec<u8>, version: u8, xid: u32) {
    put_header_only(out, version, OFPT_BARRIER_REQUEST, xid);
}

const OFPFC_ADD: u8 = 0;
const OFPFC_MODIFY_STRICT: u8 = 2;
const OFPFC_DELETE: u8 = 3;
const OFPFC_DELETE_STRICT: u8 = 4;

/// The fields of a flow mod, borrowed from whichever form the caller has.
#[derive(Clone, Copy)]
struct FlowModView<'a> {
    command: u8,
    table: u8,
    priority: u16,
    cookie: u64,
    cookie_mask: u64,
    matches: Option<&'a Match>,
    actions: &'a [Action],
}

impl<'a> FlowModView<'a> {
    fn add(flow: &'a Flow) -> Self {
        FlowModView {
            command: OFPFC_ADD,
            table: flow.table,
            priority: flow.priority,
            cookie: flow.cookie,
            cookie_mask: 0,
            matches: Some(&flow.matches),
            actions: &flow.actions,
        }
    }

    fn of(flow_mod: &'a FlowMod) -> Self {
        match flow_mod {
            FlowMod::Add(flow) => Self::add(flow),
            FlowMod::ModifyStrict(flow) => FlowModView {
                command: OFPFC_MODIFY_STRICT,
                ..Self::add(flow)
            },
            FlowMod::DeleteStrict(key) => FlowModView {
                command: OFPFC_DELETE_STRICT,
                table: key.table,
                priority: key.priority,
                cookie: 0,
                cookie_mask: 0,
                matches: Some(&key.matches),
                actions: &[],
            },
            FlowMod::DeleteByCookie {
                table,
                cookie,
                cookie_mask,
            } => FlowModView {
                command: OFPFC_DELETE,
                table: table.unwrap_or(OFPTT_ALL),
                priority: 0,
                cookie: *cookie,
                cookie_mask: *cookie_mask,
                matches: None,
                actions: &[],
            },
        }
    }
}

/// A flow mod.
pub fn encode_flow_mod(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    flow_mod: &FlowMod,
) -> Result<(), EncodeError> {
    encode_view(out, version, xid, &FlowModView::of(flow_mod))
}

/// A flow mod adding `flow` (the same bytes as `FlowMod::Add`, without cloning the flow).
pub fn encode_flow_add(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    flow: &Flow,
) -> Result<(), EncodeError> {
    encode_view(out, version, xid, &FlowModView::add(flow))
}

fn encode_view(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    view: &FlowModView<'_>,
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_FLOW_MOD, xid);
    let FlowModView {
        command,
        table,
        priority,
        cookie,
        cookie_mask,
        matches,
        actions,
    } = *view;
    if command != OFPFC_DELETE && table == OFPTT_ALL {
        return Err(EncodeError::Invalid("table 255 is not a flow table"));
    }
    out.put_u64(cookie);
    out.put_u64(cookie_mask);
    out.put_u8(table);
    out.put_u8(command);
    out.put_u16(0); // idle timeout
    out.put_u16(0); // hard timeout
    out.put_u16(priority);
    out.put_u32(OFP_NO_BUFFER);
    out.put_u32(OFPP_ANY);
    out.put_u32(OFPG_ANY);
    out.put_u16(0); // flags
    out.put_u16(0); // pad (1.3) or importance (1.4)
    put_match(out, matches.unwrap_or(&Match::default()))?;
    put_instructions(out, actions)?;
    finish_message(out, start)
}

/// Encodes `flows` the way `sluice_ovs::OpenFlowClient::add_flows` sends them: OpenFlow 1.4
/// bundle-add messages (bundle 1, atomic and ordered) each carrying a flow-mod add, xids from 1.
/// Pure, so a benchmark can measure the encoding cost of a large bundle.
pub fn encode_flow_mods(flows: &[Flow]) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(flows.len() * 136);
    for (index, flow) in flows.iter().enumerate() {
        let xid = index as u32 + 1;
        encode_bundle_add_flow(
            &mut out,
            OFP14,
            xid,
            1,
            BUNDLE_ATOMIC | BUNDLE_ORDERED,
            flow,
        )?;
    }
    Ok(out)
}

/// Starts a bundle message: the OpenFlow 1.4 type, or the ONF experimenter framing in 1.3.
fn start_bundle_message(out: &mut Vec<u8>, version: u8, xid: u32, add: bool) -> usize {
    if version >= OFP14 {
        let msg_type = if add {
            OFPT_BUNDLE_ADD_MESSAGE
        } else {
            OFPT_BUNDLE_CONTROL
        };
        start_message(out, version, msg_type, xid)
    } else {
        let start = start_message(out, version, OFPT_EXPERIMENTER, xid);
        out.put_u32(ONF_EXPERIMENTER_ID);
        out.put_u32(if add {
            ONFT_BUNDLE_ADD_MESSAGE
        } else {
            ONFT_BUNDLE_CONTROL
        });
        start
    }
}

/// A bundle control message.
pub fn encode_bundle_control(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    control: &BundleControl,
) -> Result<(), EncodeError> {
    let start = start_bundle_message(out, version, xid, false);
    out.put_u32(control.bundle_id);
    out.put_u16(control.kind.code());
    out.put_u16(control.flags);
    finish_message(out, start)
}

/// A bundle add message carrying a flow mod. The inner message gets the same xid (OVS requires
/// it), which is also how the switch's error for it is matched to the flow.
pub fn encode_bundle_add_flow_mod(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    bundle_id: u32,
    flags: u16,
    flow_mod: &FlowMod,
) -> Result<(), EncodeError> {
    encode_bundle_add(
        out,
        version,
        xid,
        bundle_id,
        flags,
        &FlowModView::of(flow_mod),
    )
}

/// A bundle add message carrying a flow mod that adds `flow`.
pub fn encode_bundle_add_flow(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    bundle_id: u32,
    flags: u16,
    flow: &Flow,
) -> Result<(), EncodeError> {
    encode_bundle_add(out, version, xid, bundle_id, flags, &FlowModView::add(flow))
}

fn encode_bundle_add(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    bundle_id: u32,
    flags: u16,
    view: &FlowModView<'_>,
) -> Result<(), EncodeError> {
    let start = start_bundle_message(out, version, xid, true);
    out.put_u32(bundle_id);
    out.put_u16(0);
    out.put_u16(flags);
    encode_view(out, version, xid, view)?;
    finish_message(out, start)
}

/// A multipart flow statistics request.
pub fn encode_flow_stats_request(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    request: &FlowStatsRequest,
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_MULTIPART_REQUEST, xid);
    out.put_u16(OFPMP_FLOW);
    out.put_u16(0);
    out.put_zeros(4);
    out.put_u8(request.table.unwrap_or(OFPTT_ALL));
    out.put_zeros(3);
    out.put_u32(OFPP_ANY);
    out.put_u32(OFPG_ANY);
    out.put_zeros(4);
    out.put_u64(request.cookie);
    out.put_u64(request.cookie_mask);
    put_match(out, &Match::default())?;
    finish_message(out, start)
}

/// A meter mod.
pub fn encode_meter_mod(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    meter: &MeterMod,
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_METER_MOD, xid);
    put_meter_mod(out, meter);
    finish_message(out, start)
}

/// A multipart meter statistics request.
pub fn encode_meter_stats_request(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    request: &MeterStatsRequest,
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_MULTIPART_REQUEST, xid);
    out.put_u16(OFPMP_METER);
    out.put_u16(0);
    out.put_zeros(4);
    put_meter_stats_request(out, request);
    finish_message(out, start)
}

/// A meter statistics reply, as the switch sends it (for tests, fakes and the fuzz round trip).
pub fn encode_meter_stats_reply(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    more: bool,
    meters: &[MeterStats],
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_MULTIPART_REPLY, xid);
    out.put_u16(OFPMP_METER);
    out.put_u16(if more { OFPMPF_MORE } else { 0 });
    out.put_zeros(4);
    for meter in meters {
        put_meter_stats(out, meter)?;
    }
    finish_message(out, start)
}

/// A packet-out.
pub fn encode_packet_out(
    out: &mut Vec<u8>,
    version: u8,
    xid: u32,
    packet_out: &PacketOut,
) -> Result<(), EncodeError> {
    let start = start_message(out, version, OFPT_PACKET_OUT, xid);
    out.put_u32(OFP_NO_BUFFER);
    out.put_u32(packet_out.in_port);
    let actions_len_at = out.len();
    out.put_u16(0);
    out.put_zeros(6);
    let actions_start = out.len();
    for action in &packet_out.actions {
        if is_instruction(action) {
            return Err(EncodeError::Invalid(
                "goto_table or meter (instructions) in a packet-out",
            ));
        }
        put_action(out, action)?;
    }
    let actions_len = u16::try_from(out.len() - actions_start)
        .map_err(|_| EncodeError::TooLong("packet-out actions"))?;
    out.set_u16(actions_len_at, actions_len);
    out.extend_from_slice(&packet_out.packet);
    finish_message(out, start)
}

fn start_nicira_message(out: &mut Vec<u8>, version: u8, xid: u32, subtype: u32) -> usize {
    let start = start_message(out, version, OFPT_EXPERIMENTER, xid);
    out.put_u32(NX_VENDOR_ID);
    out.put_u32(subtype);
    start
}

/// Asks for packet-ins in the Nicira packet-in2 format, the one that carries the `controller`
/// action's userdata.
pub fn encode_set_packet_in_format(out: &mut Vec<u8>, version: u8, xid: u32) {
    let start = start_nicira_message(out, version, xid, NXT_SET_PACKET_IN_FORMAT);
    out.put_u32(NXPIF_NXT_PACKET_IN2);
    out.set_u16(start + 2, (out.len() - start) as u16);
}

/// Enables packet-ins sent by `controller` actions and table misses on this connection. OVS
/// sends no asynchronous messages to management-socket connections unless asked.
pub fn encode_enable_packet_in(out: &mut Vec<u8>, version: u8, xid: u32) {
    // Bits are reasons: no-match (0) and action (1); slots are [master/equal, slave].
    const NO_MATCH_AND_ACTION: u32 = 0b11;
    let start = start_nicira_message(out, version, xid, NXT_SET_ASYNC_CONFIG);
    out.put_u32(NO_MATCH_AND_ACTION);
    out.put_u32(NO_MATCH_AND_ACTION);
    out.put_zeros(16); // port-status and flow-removed masks: none
    out.set_u16(start + 2, (out.len() - start) as u16);
}

/// Decodes one complete message (exactly `header.length` bytes).
pub fn decode(buf: &[u8]) -> Result<Decoded, DecodeError> {
    decode_nested(buf, true)
}

fn decode_nested(buf: &[u8], allow_bundle_add: bool) -> Result<Decoded, DecodeError> {
    let header = parse_header(buf)?;
    if usize::from(header.length) != buf.len() {
        return Err(DecodeError::BadLength {
            what: "OpenFlow message (header length differs from the frame)",
            length: usize::from(header.length),
        });
    }
    if header.msg_type != OFPT_HELLO
        && header.msg_type != OFPT_ERROR
        && header.version != OFP13
        && header.version != OFP14
    {
        return Err(DecodeError::UnsupportedVersion(header.version));
    }
    let mut body = Reader::new(&buf[HEADER_LEN..], "message body");
    let message = match header.msg_type {
        OFPT_HELLO => decode_hello(&mut body)?,
        OFPT_ERROR => Message::Error(decode_error(&mut body)?),
        OFPT_ECHO_REQUEST => Message::EchoRequest(body.rest().to_vec()),
        OFPT_ECHO_REPLY => Message::EchoReply(body.rest().to_vec()),
        OFPT_FEATURES_REQUEST => Message::FeaturesRequest,
        OFPT_FEATURES_REPLY => Message::FeaturesReply(decode_features(&mut body)?),
        OFPT_FLOW_MOD => Message::FlowMod(Box::new(decode_flow_mod(&mut body)?)),
        OFPT_PACKET_IN => Message::PacketIn(decode_packet_in(&mut body)?),
        OFPT_PACKET_OUT => Message::PacketOut(decode_packet_out(&mut body)?),
        OFPT_BARRIER_REQUEST => Message::BarrierRequest,
        OFPT_BARRIER_REPLY => Message::BarrierReply,
        OFPT_METER_MOD => Message::MeterMod(read_meter_mod(&mut body)?),
        OFPT_MULTIPART_REQUEST => decode_multipart_request(&mut body)?,
        OFPT_MULTIPART_REPLY => decode_multipart_reply(&mut body, header.version)?,
        OFPT_BUNDLE_CONTROL if header.version >= OFP14 => decode_bundle_control(&mut body)?,
        OFPT_BUNDLE_ADD_MESSAGE if header.version >= OFP14 => {
            decode_bundle_add(&mut body, allow_bundle_add)?
        }
        OFPT_EXPERIMENTER => decode_experimenter(&mut body, allow_bundle_add)?,
        _ => Message::Other,
    };
    Ok(Decoded {
        version: header.version,
        xid: header.xid,
        message,
    })
}

fn decode_hello(body: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let mut versions = None;
    while body.remaining() >= 4 {
        let kind = body.u16()?;
        let len = usize::from(body.u16()?);
        if len < 4 {
            return Err(DecodeError::BadLength {
                what: "hello element",
                length: len,
            });
        }
        let mut element = body.sub(len - 4, "hello element")?;
        body.skip((round_up_8(len) - len).min(body.remaining()))?;
        if kind == OFPHET_VERSIONBITMAP {
            // Versions above 31 cannot be ours; only the first bitmap word matters.
            versions = Some(element.u32()?);
        }
    }
    Ok(Message::Hello { versions })
}

fn decode_error(body: &mut Reader<'_>) -> Result<OfError, DecodeError> {
    let err_type = body.u16()?;
    let code = body.u16()?;
    let experimenter = if err_type == 0xffff {
        Some(body.u32()?)
    } else {
        None
    };
    Ok(OfError {
        err_type,
        code,
        experimenter,
        data: body.rest().to_vec(),
    })
}

fn decode_features(body: &mut Reader<'_>) -> Result<Features, DecodeError> {
    let datapath_id = body.u64()?;
    let n_buffers = body.u32()?;
    let n_tables = body.u8()?;
    body.skip(3)?; // auxiliary id, pad
    let capabilities = body.u32()?;
    Ok(Features {
        datapath_id,
        n_buffers,
        n_tables,
        capabilities,
    })
}

fn decode_flow_mod(body: &mut Reader<'_>) -> Result<FlowMod, DecodeError> {
    let cookie = body.u64()?;
    let cookie_mask = body.u64()?;
    let table = body.u8()?;
    let command = body.u8()?;
    body.skip(4)?; // timeouts
    let priority = body.u16()?;
    body.skip(16)?; // buffer id, out port, out group, flags, pad/importance
    let matches = read_match(body)?;
    let actions = read_instructions(body)?;
    let flow = || Flow {
        table,
        priority,
        cookie,
        matches: matches.clone(),
        actions: actions.clone(),
    };
    match command {
        OFPFC_ADD => Ok(FlowMod::Add(flow())),
        OFPFC_MODIFY_STRICT => Ok(FlowMod::ModifyStrict(flow())),
        OFPFC_DELETE_STRICT => Ok(FlowMod::DeleteStrict(FlowKey {
            table,
            priority,
            matches,
        })),
        OFPFC_DELETE if matches == Match::default() => Ok(FlowMod::DeleteByCookie {
            table: (table != OFPTT_ALL).then_some(table),
            cookie,
            cookie_mask,
        }),
        other => Err(DecodeError::Unsupported {
            what: "flow mod command",
            value: u64::from(other),
        }),
    }
}

fn decode_packet_in(body: &mut Reader<'_>) -> Result<PacketIn, DecodeError> {
    body.skip(4)?; // buffer id
    let total_len = u32::from(body.u16()?);
    let reason = body.u8()?;
    let table = body.u8()?;
    let cookie = body.u64()?;
    let match_type = body.u16()?;
    let match_len = usize::from(body.u16()?);
    if match_type != 1 || match_len < 4 {
        return Err(DecodeError::BadLength {
            what: "packet-in match",
            length: match_len,
        });
    }
    let mut fields = body.sub(match_len - 4, "packet-in match")?;
    body.skip(round_up_8(match_len) - match_len)?;
    body.skip(2)?;
    Ok(PacketIn {
        table,
        cookie,
        reason,
        in_port: in_port_of(&mut fields)?,
        userdata: Vec::new(),
        total_len,
        packet: body.rest().to_vec(),
    })
}

/// The in_port among packet metadata fields; other metadata (registers, tunnel fields) is
/// skipped rather than refused, since the switch chooses what it reports.
fn in_port_of(fields: &mut Reader<'_>) -> Result<Option<u32>, DecodeError> {
    let mut in_port = None;
    while !fields.is_empty() {
        let tlv = read_tlv(fields)?;
        if tlv.class == 0x8000 && tlv.field == 0 && tlv.payload.len() == 4 && !tlv.has_mask {
            in_port = Some(Reader::new(tlv.payload, "in_port").u32()?);
        }
    }
    Ok(in_port)
}

fn decode_packet_out(body: &mut Reader<'_>) -> Result<PacketOut, DecodeError> {
    body.skip(4)?; // buffer id
    let in_port = body.u32()?;
    let actions_len = usize::from(body.u16()?);
    body.skip(6)?;
    let mut actions_reader = body.sub(actions_len, "packet-out actions")?;
    let mut actions = Vec::new();
    read_actions_into(&mut actions_reader, &mut actions)?;
    Ok(PacketOut {
        in_port,
        actions,
        packet: body.rest().to_vec(),
    })
}

fn decode_multipart_request(body: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let kind = body.u16()?;
    if kind == OFPMP_METER {
        body.skip(6)?;
        return Ok(Message::MeterStatsRequest(read_meter_stats_request(body)?));
    }
    if kind != OFPMP_FLOW {
        return Ok(Message::Other);
    }
    body.skip(6)?;
    let table = body.u8()?;
    body.skip(15)?; // pad, out port, out group, pad
    let cookie = body.u64()?;
    let cookie_mask = body.u64()?;
    read_match(body)?;
    Ok(Message::FlowStatsRequest(FlowStatsRequest {
        table: (table != OFPTT_ALL).then_some(table),
        cookie,
        cookie_mask,
    }))
}

fn decode_multipart_reply(body: &mut Reader<'_>, version: u8) -> Result<Message, DecodeError> {
    let kind = body.u16()?;
    let flags = body.u16()?;
    body.skip(4)?;
    if kind == OFPMP_METER {
        return Ok(Message::MeterStatsReply {
            more: flags & OFPMPF_MORE != 0,
            meters: read_meter_stats(body)?,
        });
    }
    if kind != OFPMP_FLOW {
        return Ok(Message::Other);
    }
    let mut flows = Vec::new();
    while !body.is_empty() {
        let len = usize::from(body.u16()?);
        if len < 48 {
            return Err(DecodeError::BadLength {
                what: "flow stats entry",
                length: len,
            });
        }
        let mut entry = body.sub(len - 2, "flow stats entry")?;
        flows.push(decode_flow_stats(&mut entry, version)?);
    }
    Ok(Message::FlowStatsReply {
        more: flags & OFPMPF_MORE != 0,
        flows,
    })
}

fn decode_flow_stats(entry: &mut Reader<'_>, _version: u8) -> Result<FlowStats, DecodeError> {
    let table = entry.u8()?;
    entry.skip(1)?;
    let seconds = entry.u32()?;
    let nanos = entry.u32()?;
    let priority = entry.u16()?;
    entry.skip(10)?; // timeouts, flags, pad/importance
    let cookie = entry.u64()?;
    let packets = entry.u64()?;
    let bytes = entry.u64()?;
    let matches = read_match(entry).ok();
    // Instructions follow the match only when the match (and its padding) decoded.
    let actions = match matches {
        Some(_) => read_instructions(entry).ok(),
        None => None,
    };
    Ok(FlowStats {
        table,
        priority,
        cookie,
        packets,
        bytes,
        duration: Duration::from_secs(u64::from(seconds))
            + Duration::from_nanos(u64::from(nanos.min(999_999_999))),
        matches,
        actions,
    })
}

fn decode_bundle_control(body: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let bundle_id = body.u32()?;
    let kind = BundleControlType::from_code(body.u16()?)?;
    let flags = body.u16()?;
    Ok(Message::BundleControl(BundleControl {
        bundle_id,
        kind,
        flags,
    }))
}

fn decode_bundle_add(body: &mut Reader<'_>, allowed: bool) -> Result<Message, DecodeError> {
    if !allowed {
        return Err(DecodeError::Invalid("bundle add nested in a bundle add"));
    }
    let bundle_id = body.u32()?;
    body.skip(2)?;
    let flags = body.u16()?;
    let rest = body.rest();
    let inner = parse_header(rest)?;
    let inner_len = usize::from(inner.length);
    if inner_len > rest.len() {
        return Err(DecodeError::Truncated {
            what: "bundled message",
            needed: inner_len,
            available: rest.len(),
        });
    }
    Ok(Message::BundleAdd {
        bundle_id,
        flags,
        message: Box::new(decode_nested(&rest[..inner_len], false)?),
    })
}

fn decode_experimenter(
    body: &mut Reader<'_>,
    allow_bundle_add: bool,
) -> Result<Message, DecodeError> {
    let experimenter = body.u32()?;
    let subtype = body.u32()?;
    match (experimenter, subtype) {
        (ONF_EXPERIMENTER_ID, ONFT_BUNDLE_CONTROL) => decode_bundle_control(body),
        (ONF_EXPERIMENTER_ID, ONFT_BUNDLE_ADD_MESSAGE) => decode_bundle_add(body, allow_bundle_add),
        (NX_VENDOR_ID, NXT_PACKET_IN2) => Ok(Message::PacketIn(decode_packet_in2(body)?)),
        _ => Ok(Message::Other),
    }
}

const NXPINT_PACKET: u16 = 0;
const NXPINT_FULL_LEN: u16 = 1;
const NXPINT_TABLE_ID: u16 = 3;
const NXPINT_COOKIE: u16 = 4;
const NXPINT_REASON: u16 = 5;
const NXPINT_METADATA: u16 = 6;
const NXPINT_USERDATA: u16 = 7;

fn decode_packet_in2(body: &mut Reader<'_>) -> Result<PacketIn, DecodeError> {
    let mut packet_in = PacketIn {
        table: 0,
        cookie: 0,
        reason: 0,
        in_port: None,
        userdata: Vec::new(),
        total_len: 0,
        packet: Vec::new(),
    };
    let mut full_len = None;
    while !body.is_empty() {
        let kind = body.u16()?;
        let len = usize::from(body.u16()?);
        if len < 4 {
            return Err(DecodeError::BadLength {
                what: "packet-in2 property",
                length: len,
            });
        }
        let mut value = body.sub(len - 4, "packet-in2 property")?;
        body.skip((round_up_8(len) - len).min(body.remaining()))?;
        match kind {
            NXPINT_PACKET => packet_in.packet = value.rest().to_vec(),
            NXPINT_FULL_LEN => full_len = Some(value.u32()?),
            NXPINT_TABLE_ID => packet_in.table = value.u8()?,
            NXPINT_COOKIE => {
                // 64-bit properties carry 4 bytes of padding to align the value.
                if value.remaining() == 12 {
                    value.skip(4)?;
                }
                packet_in.cookie = value.u64()?;
            }
            NXPINT_REASON => packet_in.reason = value.u8()?,
            NXPINT_METADATA => packet_in.in_port = in_port_of(&mut value)?,
            NXPINT_USERDATA => packet_in.userdata = value.rest().to_vec(),
            _ => {}
        }
    }
    packet_in.total_len = full_len.unwrap_or(packet_in.packet.len() as u32);
    Ok(packet_in)
}
