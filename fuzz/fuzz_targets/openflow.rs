//! OpenFlow messages from ovs-vswitchd: `sluice_openflow::decode` (and `parse_header`). The
//! harness also decodes a copy whose header length is set to the input's length, so the fuzzer
//! is not stuck on the length check; messages this codec can encode are re-encoded and must
//! decode to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_openflow::{
    decode, encode_bundle_control, encode_echo, encode_flow_mod, encode_flow_stats_request,
    encode_meter_mod, encode_meter_stats_reply, encode_meter_stats_request, encode_packet_out,
    parse_header, Decoded, Message,
};

fn round_trip(decoded: &Decoded) {
    let mut out = Vec::new();
    let (version, xid) = (decoded.version, decoded.xid);
    let encoded = match &decoded.message {
        Message::FlowMod(flow_mod) => encode_flow_mod(&mut out, version, xid, flow_mod),
        Message::EchoRequest(payload) => encode_echo(&mut out, version, xid, false, payload),
        Message::EchoReply(payload) => encode_echo(&mut out, version, xid, true, payload),
        Message::PacketOut(packet_out) => encode_packet_out(&mut out, version, xid, packet_out),
        Message::FlowStatsRequest(request) => {
            encode_flow_stats_request(&mut out, version, xid, request)
        }
        Message::BundleControl(control) => encode_bundle_control(&mut out, version, xid, control),
        Message::MeterMod(meter) => encode_meter_mod(&mut out, version, xid, meter),
        Message::MeterStatsRequest(request) => {
            encode_meter_stats_request(&mut out, version, xid, request)
        }
        Message::MeterStatsReply { more, meters } => {
            encode_meter_stats_reply(&mut out, version, xid, *more, meters)
        }
        _ => return,
    };
    if encoded.is_err() {
        return;
    }
    let again = decode(&out).unwrap_or_else(|error| {
        panic!("re-encoded {decoded:?} does not decode: {error}\n{out:02x?}")
    });
    assert_eq!(&again, decoded, "re-encoded bytes {out:02x?}");
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_header(data);
    if let Ok(decoded) = decode(data) {
        round_trip(&decoded);
    }
    if data.len() >= 8 && data.len() <= usize::from(u16::MAX) {
        let mut fixed = data.to_vec();
        fixed[2..4].copy_from_slice(&(data.len() as u16).to_be_bytes());
        if let Ok(decoded) = decode(&fixed) {
            round_trip(&decoded);
        }
    }
});
