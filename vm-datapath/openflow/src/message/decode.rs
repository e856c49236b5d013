//! The decoder: one framed message in, a typed [`Message`] out.

use std::time::Duration;

use crate::actions::{read_actions_into, read_instructions, NX_VENDOR_ID};
use crate::flow::{Flow, FlowKey, Match};
use crate::meter::{read_meter_mod, read_meter_stats, read_meter_stats_request};
use crate::oxm::{read_match, read_tlv};
use crate::wire::{round_up_8, Reader};
use crate::{DecodeError, HEADER_LEN, OFP13, OFP14};

use super::{
    parse_header, BundleControl, BundleControlType, Decoded, Features, FlowMod, FlowStats,
    FlowStatsRequest, Message, OfError, PacketIn, PacketOut, NXT_PACKET_IN2, OFPFC_ADD,
    OFPFC_DELETE, OFPFC_DELETE_STRICT, OFPFC_MODIFY_STRICT, OFPHET_VERSIONBITMAP, OFPMPF_MORE,
    OFPMP_FLOW, OFPMP_METER, OFPTT_ALL, OFPT_BARRIER_REPLY, OFPT_BARRIER_REQUEST,
    OFPT_BUNDLE_ADD_MESSAGE, OFPT_BUNDLE_CONTROL, OFPT_ECHO_REPLY, OFPT_ECHO_REQUEST, OFPT_ERROR,
    OFPT_EXPERIMENTER, OFPT_FEATURES_REPLY, OFPT_FEATURES_REQUEST, OFPT_FLOW_MOD, OFPT_HELLO,
    OFPT_METER_MOD, OFPT_MULTIPART_REPLY, OFPT_MULTIPART_REQUEST, OFPT_PACKET_IN, OFPT_PACKET_OUT,
    ONFT_BUNDLE_ADD_MESSAGE, ONFT_BUNDLE_CONTROL, ONF_EXPERIMENTER_ID,
};

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
