//! Meters: `OFPT_METER_MOD` and the `OFPMP_METER` statistics (OpenFlow 1.3 and 1.4 share both
//! layouts). The model covers what the policy engine needs: packets-per-second meters with
//! drop bands, always with a burst and statistics.

use std::time::Duration;

use super::wire::{Put, Reader};
use super::{DecodeError, EncodeError};

/// `OFPMC_*`: what a meter mod does.
const OFPMC_ADD: u16 = 0;
const OFPMC_MODIFY: u16 = 1;
const OFPMC_DELETE: u16 = 2;
/// `OFPMF_*` flags.
const OFPMF_KBPS: u16 = 1;
const OFPMF_PKTPS: u16 = 2;
const OFPMF_BURST: u16 = 4;
const OFPMF_STATS: u16 = 8;
/// The flags every meter of the model carries: rates in packets, a burst, statistics.
const MODEL_FLAGS: u16 = OFPMF_PKTPS | OFPMF_BURST | OFPMF_STATS;
const OFPMBT_DROP: u16 = 1;
const BAND_LEN: usize = 16;
/// `ofp_meter_stats` without its band statistics.
const METER_STATS_LEN: usize = 40;
const BAND_STATS_LEN: usize = 16;

/// `OFPM_ALL`: every meter, in a statistics request.
pub const METER_ALL: u32 = 0xffff_ffff;
/// `OFPET_METER_MOD_FAILED`.
pub const METER_MOD_FAILED: u16 = 12;
/// `OFPMMFC_METER_EXISTS`: an add for a meter id that is already in use.
pub const METER_EXISTS: u16 = 1;

/// What a meter mod does with its meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MeterCommand {
    /// Create the meter; refused with [`METER_EXISTS`] when the id is taken.
    Add,
    /// Replace the bands of an existing meter.
    Modify,
    /// Remove the meter (and, in OVS, the flows using it).
    Delete,
}

/// A band that drops what exceeds `rate` packets per second, after a burst of `burst` packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DropBand {
    pub rate: u32,
    pub burst: u32,
}

/// A meter change: a packets-per-second meter with drop bands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeterMod {
    pub command: MeterCommand,
    pub meter_id: u32,
    pub bands: Vec<DropBand>,
}

/// A meter statistics request for one meter or [`METER_ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MeterStatsRequest {
    pub meter_id: u32,
}

/// What one band of a meter did: the packets and bytes it applied to (for a drop band: dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BandStats {
    pub packets: u64,
    pub bytes: u64,
}

/// One meter in a meter statistics reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterStats {
    pub meter_id: u32,
    /// Flows using the meter.
    pub flow_count: u32,
    /// Packets and bytes that entered the meter.
    pub packets_in: u64,
    pub bytes_in: u64,
    pub duration: Duration,
    /// In the order of the meter's bands.
    pub bands: Vec<BandStats>,
}

/// Writes the body of a meter mod (after the common header).
pub(crate) fn put_meter_mod(out: &mut Vec<u8>, meter: &MeterMod) {
    out.put_u16(match meter.command {
        MeterCommand::Add => OFPMC_ADD,
        MeterCommand::Modify => OFPMC_MODIFY,
        MeterCommand::Delete => OFPMC_DELETE,
    });
    out.put_u16(MODEL_FLAGS);
    out.put_u32(meter.meter_id);
    for band in &meter.bands {
        out.put_u16(OFPMBT_DROP);
        out.put_u16(BAND_LEN as u16);
        out.put_u32(band.rate);
        out.put_u32(band.burst);
        out.put_zeros(4);
    }
}

pub(crate) fn read_meter_mod(body: &mut Reader<'_>) -> Result<MeterMod, DecodeError> {
    let command = match body.u16()? {
        OFPMC_ADD => MeterCommand::Add,
        OFPMC_MODIFY => MeterCommand::Modify,
        OFPMC_DELETE => MeterCommand::Delete,
        other => {
            return Err(DecodeError::Unsupported {
                what: "meter mod command",
                value: u64::from(other),
            })
        }
    };
    let flags = body.u16()?;
    // Kilobit meters and meters without burst or statistics are not part of the model.
    if flags & OFPMF_KBPS != 0 || flags & MODEL_FLAGS != MODEL_FLAGS {
        return Err(DecodeError::Unsupported {
            what: "meter flags",
            value: u64::from(flags),
        });
    }
    let meter_id = body.u32()?;
    let mut bands = Vec::new();
    while !body.is_empty() {
        let kind = body.u16()?;
        let len = usize::from(body.u16()?);
        if len != BAND_LEN {
            return Err(DecodeError::BadLength {
                what: "meter band",
                length: len,
            });
        }
        let mut band = body.sub(len - 4, "meter band")?;
        if kind != OFPMBT_DROP {
            return Err(DecodeError::Unsupported {
                what: "meter band type",
                value: u64::from(kind),
            });
        }
        bands.push(DropBand {
            rate: band.u32()?,
            burst: band.u32()?,
        });
    }
    Ok(MeterMod {
        command,
        meter_id,
        bands,
    })
}

/// Writes the body of a meter statistics request (after the multipart header).
pub(crate) fn put_meter_stats_request(out: &mut Vec<u8>, request: &MeterStatsRequest) {
    out.put_u32(request.meter_id);
    out.put_zeros(4);
}

pub(crate) fn read_meter_stats_request(
    body: &mut Reader<'_>,
) -> Result<MeterStatsRequest, DecodeError> {
    let meter_id = body.u32()?;
    body.skip(4)?;
    Ok(MeterStatsRequest { meter_id })
}

/// Writes one meter's statistics as the switch would (for tests and the fuzz round trip).
pub(crate) fn put_meter_stats(out: &mut Vec<u8>, stats: &MeterStats) -> Result<(), EncodeError> {
    let len = u16::try_from(METER_STATS_LEN + BAND_STATS_LEN * stats.bands.len())
        .map_err(|_| EncodeError::TooLong("meter stats entry"))?;
    out.put_u32(stats.meter_id);
    out.put_u16(len);
    out.put_zeros(6);
    out.put_u32(stats.flow_count);
    out.put_u64(stats.packets_in);
    out.put_u64(stats.bytes_in);
    out.put_u32(u32::try_from(stats.duration.as_secs()).unwrap_or(u32::MAX));
    out.put_u32(stats.duration.subsec_nanos());
    for band in &stats.bands {
        out.put_u64(band.packets);
        out.put_u64(band.bytes);
    }
    Ok(())
}

/// Reads the entries of a meter statistics reply body (after the multipart header).
pub(crate) fn read_meter_stats(body: &mut Reader<'_>) -> Result<Vec<MeterStats>, DecodeError> {
    let mut meters = Vec::new();
    while !body.is_empty() {
        let meter_id = body.u32()?;
        let len = usize::from(body.u16()?);
        // The length covers the entry's fixed part and whole band statistics, nothing else.
        if len < METER_STATS_LEN || !(len - METER_STATS_LEN).is_multiple_of(BAND_STATS_LEN) {
            return Err(DecodeError::BadLength {
                what: "meter stats entry",
                length: len,
            });
        }
        let mut entry = body.sub(len - 6, "meter stats entry")?;
        entry.skip(6)?;
        let flow_count = entry.u32()?;
        let packets_in = entry.u64()?;
        let bytes_in = entry.u64()?;
        let seconds = entry.u32()?;
        let nanos = entry.u32()?;
        let mut bands = Vec::with_capacity((len - METER_STATS_LEN) / BAND_STATS_LEN);
        while !entry.is_empty() {
            bands.push(BandStats {
                packets: entry.u64()?,
                bytes: entry.u64()?,
            });
        }
        meters.push(MeterStats {
            meter_id,
            flow_count,
            packets_in,
            bytes_in,
            duration: Duration::from_secs(u64::from(seconds))
                + Duration::from_nanos(u64::from(nanos.min(999_999_999))),
            bands,
        });
    }
    Ok(meters)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        decode, encode_meter_mod, encode_meter_stats_reply, encode_meter_stats_request, Message,
        OFP13, OFP14,
    };

    fn arb_meter_mod() -> impl Strategy<Value = MeterMod> {
        (
            prop_oneof![
                Just(MeterCommand::Add),
                Just(MeterCommand::Modify),
                Just(MeterCommand::Delete)
            ],
            any::<u32>(),
            proptest::collection::vec(
                (any::<u32>(), any::<u32>()).prop_map(|(rate, burst)| DropBand { rate, burst }),
                0..4,
            ),
        )
            .prop_map(|(command, meter_id, bands)| MeterMod {
                command,
                meter_id,
                bands,
            })
    }

    fn arb_meter_stats() -> impl Strategy<Value = MeterStats> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            (any::<u32>(), 0u32..1_000_000_000),
            proptest::collection::vec(
                (any::<u64>(), any::<u64>())
                    .prop_map(|(packets, bytes)| BandStats { packets, bytes }),
                0..4,
            ),
        )
            .prop_map(
                |(meter_id, flow_count, packets_in, bytes_in, (secs, nanos), bands)| MeterStats {
                    meter_id,
                    flow_count,
                    packets_in,
                    bytes_in,
                    duration: std::time::Duration::new(u64::from(secs), nanos),
                    bands,
                },
            )
    }

    proptest! {
        #[test]
        fn meter_mods_round_trip(meter in arb_meter_mod(), xid in any::<u32>(), v14 in any::<bool>()) {
            let version = if v14 { OFP14 } else { OFP13 };
            let mut out = Vec::new();
            encode_meter_mod(&mut out, version, xid, &meter).unwrap();
            prop_assert_eq!(out.len(), 16 + 16 * meter.bands.len());
            let decoded = decode(&out).expect("decodes");
            prop_assert_eq!((decoded.version, decoded.xid), (version, xid));
            prop_assert_eq!(decoded.message, Message::MeterMod(meter));
        }

        #[test]
        fn meter_stats_round_trip(
            meter_id in any::<u32>(),
            meters in proptest::collection::vec(arb_meter_stats(), 0..4),
            more in any::<bool>(),
            xid in any::<u32>(),
        ) {
            let request = MeterStatsRequest { meter_id };
            let mut out = Vec::new();
            encode_meter_stats_request(&mut out, OFP14, xid, &request).unwrap();
            prop_assert_eq!(decode(&out).expect("decodes").message, Message::MeterStatsRequest(request));
            out.clear();
            encode_meter_stats_reply(&mut out, OFP13, xid, more, &meters).unwrap();
            prop_assert_eq!(decode(&out).expect("decodes").message, Message::MeterStatsReply { more, meters });
        }

        #[test]
        fn hostile_meter_stats_replies_are_errors_not_panics(
            meters in proptest::collection::vec(arb_meter_stats(), 1..3),
            cut in any::<proptest::sample::Index>(),
            garbage in proptest::collection::vec(any::<u8>(), 0..200),
            at in any::<proptest::sample::Index>(),
        ) {
            let mut out = Vec::new();
            encode_meter_stats_reply(&mut out, OFP14, 1, false, &meters).unwrap();
            // Cut inside the first entry: its fields or its length then overrun the message.
            let first_len = 40 + 16 * meters[0].bands.len();
            let cut = 17 + cut.index(first_len - 1);
            let mut short = out[..cut].to_vec();
            let len = short.len() as u16;
            short[2..4].copy_from_slice(&len.to_be_bytes());
            prop_assert!(decode(&short).is_err());
            // Random bytes spliced into the entries must never panic.
            let at = 16 + at.index(out.len() - 16);
            let mut garbled = out[..at].to_vec();
            garbled.extend_from_slice(&garbage);
            garbled.truncate(0xffff);
            let len = garbled.len() as u16;
            garbled[2..4].copy_from_slice(&len.to_be_bytes());
            let _ = decode(&garbled);
        }
    }

    #[test]
    fn meter_stats_entries_with_a_bad_length_are_refused() {
        let stats = MeterStats {
            meter_id: 1,
            flow_count: 2,
            packets_in: 300,
            bytes_in: 30_000,
            duration: std::time::Duration::from_secs(3),
            bands: vec![BandStats {
                packets: 100,
                bytes: 10_000,
            }],
        };
        let mut out = Vec::new();
        encode_meter_stats_reply(&mut out, OFP14, 1, false, &[stats]).unwrap();
        // 16 bytes of headers, then the entry: meter id (4), length (2).
        for bad_len in [0u16, 39, 48, 200] {
            let mut bad = out.clone();
            bad[20..22].copy_from_slice(&bad_len.to_be_bytes());
            assert!(
                matches!(
                    decode(&bad),
                    Err(DecodeError::BadLength { .. } | DecodeError::Truncated { .. })
                ),
                "length {bad_len}"
            );
        }
    }
}
