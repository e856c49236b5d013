//! Encoders: each appends one whole message to a reusable buffer.

use crate::actions::{is_instruction, put_action, put_instructions, NX_VENDOR_ID};
use crate::flow::{Action, Flow, Match};
use crate::meter::{put_meter_mod, put_meter_stats, put_meter_stats_request};
use crate::meter::{MeterMod, MeterStats, MeterStatsRequest};
use crate::oxm::put_match;
use crate::wire::Put;
use crate::{EncodeError, HEADER_LEN, OFP14};

use super::{
    BundleControl, FlowMod, FlowStatsRequest, PacketOut, BUNDLE_ATOMIC, BUNDLE_ORDERED,
    NXPIF_NXT_PACKET_IN2, NXT_SET_ASYNC_CONFIG, NXT_SET_PACKET_IN_FORMAT, OFPFC_ADD, OFPFC_DELETE,
    OFPFC_DELETE_STRICT, OFPFC_MODIFY_STRICT, OFPG_ANY, OFPHET_VERSIONBITMAP, OFPMPF_MORE,
    OFPMP_FLOW, OFPMP_METER, OFPP_ANY, OFPTT_ALL, OFPT_BARRIER_REQUEST, OFPT_BUNDLE_ADD_MESSAGE,
    OFPT_BUNDLE_CONTROL, OFPT_ECHO_REPLY, OFPT_ECHO_REQUEST, OFPT_EXPERIMENTER,
    OFPT_FEATURES_REQUEST, OFPT_FLOW_MOD, OFPT_HELLO, OFPT_METER_MOD, OFPT_MULTIPART_REPLY,
    OFPT_MULTIPART_REQUEST, OFPT_PACKET_OUT, OFP_NO_BUFFER, ONFT_BUNDLE_ADD_MESSAGE,
    ONFT_BUNDLE_CONTROL, ONF_EXPERIMENTER_ID, SUPPORTED_VERSIONS,
};

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
