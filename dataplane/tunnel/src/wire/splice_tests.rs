#![allow(clippy::unwrap_used)]
use bytes::Bytes;
use proptest::prelude::*;
use prost::Message as _;
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, CloseSend, ConnectRequest, ConnectResponse, Header,
    MetadataEntry, RequestInfo, Trailer,
};

use super::*;
use crate::wire::{data_frame, frame};

fn joined(pieces: &[Bytes]) -> Vec<u8> {
    pieces.iter().flat_map(|p| p.iter().copied()).collect()
}

fn to_agent(messages: &[usize]) -> Vec<u8> {
    let mut out = frame(&ConnectResponse {
        msg: Some(connect_response::Msg::RequestInfo(RequestInfo {
            method_name: "/pkg.Service/Method".into(),
            metadata: vec![MetadataEntry {
                key: "x-a".into(),
                values: vec![b"1".to_vec().into()],
            }],
        })),
    })
    .to_vec();
    for size in messages {
        out.extend(joined(&data_frame(
            Bytes::from(vec![7; *size]),
            false,
            false,
        )));
    }
    out.extend_from_slice(&frame(&ConnectResponse {
        msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
    }));
    out
}

fn trailer(status: u32) -> Vec<u8> {
    frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Trailer(Trailer {
            grpc_status: status,
            grpc_message: "done".into(),
            metadata: Vec::new(),
        })),
    })
    .to_vec()
}

fn from_agent(messages: &[usize], status: u32) -> Vec<u8> {
    let mut out = frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Header(Header {
            metadata: Vec::new(),
        })),
    })
    .to_vec();
    for size in messages {
        out.extend(joined(&data_frame(Bytes::from(vec![9; *size]), true, true)));
    }
    out.extend(trailer(status));
    out
}

/// Scans `bytes` in chunks of `step`: the bytes consumed and whether the call ended, or the
/// first error.
fn scan_in(
    direction: Direction,
    bytes: &[u8],
    step: usize,
) -> Result<(usize, bool, CallScanner), SpliceError> {
    let mut scanner = CallScanner::new(direction, 1 << 20);
    let mut consumed = 0;
    for chunk in bytes.chunks(step.max(1)) {
        let scanned = scanner.scan(chunk)?;
        consumed += scanned.consumed;
        if scanned.ended {
            return Ok((consumed, true, scanner));
        }
    }
    Ok((consumed, false, scanner))
}

#[test]
fn a_whole_call_ends_at_its_last_message_in_any_chunking() {
    let calls = [
        (Direction::ToAgent, to_agent(&[0, 3, 20_000, 200_000])),
        (Direction::FromAgent, from_agent(&[1, 70_000], 5)),
    ];
    for (direction, bytes) in calls {
        for step in [1, 2, 5, 6, 7, 13, 1000, 16 * 1024, bytes.len()] {
            let (consumed, ended, scanner) = scan_in(direction, &bytes, step).unwrap();
            assert!(ended, "{direction:?} in chunks of {step}");
            assert_eq!(consumed, bytes.len());
            assert_eq!(scanner.finish(), Ok(()));
        }
    }
}

#[test]
fn the_agents_last_message_is_kept_for_its_status() {
    let bytes = from_agent(&[4], 7);
    let (_, _, scanner) = scan_in(Direction::FromAgent, &bytes, 3).unwrap();
    let last = ConnectRequest::decode(scanner.terminal().unwrap()).unwrap();
    match last.msg {
        Some(connect_request::Msg::Trailer(trailer)) => assert_eq!(trailer.grpc_status, 7),
        other => panic!("not a Trailer: {other:?}"),
    }
    // A trailers-only answer is a whole call too.
    let (_, ended, scanner) = scan_in(Direction::FromAgent, &trailer(0), 1).unwrap();
    assert!(ended);
    assert!(scanner.terminal().is_some());
}

#[test]
fn bytes_after_the_last_message_are_left_and_then_refused() {
    let mut bytes = to_agent(&[5]);
    let call = bytes.len();
    bytes.extend_from_slice(b"more");
    let mut scanner = CallScanner::new(Direction::ToAgent, 1 << 20);
    let scanned = scanner.scan(&bytes).unwrap();
    assert_eq!(
        scanned,
        Scanned {
            consumed: call,
            ended: true
        }
    );
    assert_eq!(scanner.scan(b"x"), Err(SpliceError::AfterEnd));
    assert_eq!(
        scanner.scan(b""),
        Ok(Scanned {
            consumed: 0,
            ended: true
        })
    );
}

#[test]
fn messages_out_of_order_are_refused() {
    let message = joined(&data_frame(Bytes::from_static(b"m"), false, false));
    let first_message = scan_in(Direction::ToAgent, &message, 100).unwrap_err();
    assert!(matches!(first_message, SpliceError::Order(_)));
    let mut two_infos = to_agent(&[]);
    let info_len = two_infos.len() - 7;
    let info = two_infos[..info_len].to_vec();
    two_infos.splice(0..0, info);
    assert_eq!(
        scan_in(Direction::ToAgent, &two_infos, 9).unwrap_err(),
        SpliceError::Order("a second RequestInfo")
    );
    let before_header = joined(&data_frame(Bytes::from_static(b"m"), false, true));
    assert_eq!(
        scan_in(Direction::FromAgent, &before_header, 4).unwrap_err(),
        SpliceError::Order("a Message before the Header")
    );
    let descriptor = [0, 0, 0, 0, 2, 0x0a, 0];
    assert_eq!(
        scan_in(Direction::FromAgent, &descriptor, 1).unwrap_err(),
        SpliceError::Shape
    );
}

#[test]
fn frames_that_are_not_exactly_one_message_are_refused() {
    // CloseSend followed by a second field in the same frame: prost would read the second.
    let two_fields = [0, 0, 0, 0, 4, 0x1a, 0, 0x12, 0];
    let mut call = to_agent(&[]);
    call.truncate(call.len() - 7);
    call.extend_from_slice(&two_fields);
    assert_eq!(
        scan_in(Direction::ToAgent, &call, 1).unwrap_err(),
        SpliceError::Shape
    );
    // A field longer than its frame, an empty frame, a varint running past the frame.
    for bad in [
        &[0, 0, 0, 0, 3, 0x0a, 5, 1][..],
        &[0, 0, 0, 0, 0][..],
        &[0, 0, 0, 0, 3, 0x0a, 0x80, 0x80][..],
        &[
            0, 0, 0, 0, 12, 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ][..],
    ] {
        assert_eq!(
            scan_in(Direction::ToAgent, bad, 1).unwrap_err(),
            SpliceError::Shape,
            "{bad:?}"
        );
    }
    assert_eq!(
        scan_in(Direction::ToAgent, &[1, 0, 0, 0, 2, 0x1a, 0], 1).unwrap_err(),
        SpliceError::Compressed
    );
    let mut small = CallScanner::new(Direction::ToAgent, 16);
    assert_eq!(
        small.scan(&[0, 0, 0, 0, 17]),
        Err(SpliceError::Frame(FrameError::TooLarge {
            size: 17,
            limit: 16
        }))
    );
}

#[test]
fn a_stream_that_stops_early_is_not_a_call() {
    let bytes = to_agent(&[10]);
    let (_, ended, scanner) = scan_in(Direction::ToAgent, &bytes[..bytes.len() - 3], 4).unwrap();
    assert!(!ended);
    assert!(matches!(
        scanner.finish(),
        Err(SpliceError::Frame(FrameError::Truncated { .. }))
    ));
    let (_, _, scanner) = scan_in(Direction::ToAgent, &bytes[..bytes.len() - 7], 4).unwrap();
    assert!(matches!(scanner.finish(), Err(SpliceError::Order(_))));
}

proptest! {
    /// Any bytes in any chunking: no panic, and the same verdict as scanning them whole.
    #[test]
    fn any_chunking_gives_the_verdict_of_the_whole(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        step in 1usize..40,
        to in any::<bool>(),
    ) {
        let direction = if to { Direction::ToAgent } else { Direction::FromAgent };
        let whole = scan_in(direction, &bytes, bytes.len().max(1)).map(|(c, e, _)| (c, e));
        let chunked = scan_in(direction, &bytes, step).map(|(c, e, _)| (c, e));
        prop_assert_eq!(whole, chunked);
    }

    /// A real call with random message sizes, cut anywhere, always scans to its end.
    #[test]
    fn real_calls_scan_whole(sizes in prop::collection::vec(0usize..3000, 0..5), step in 1usize..5000) {
        let bytes = to_agent(&sizes);
        let (consumed, ended, _) = scan_in(Direction::ToAgent, &bytes, step).unwrap();
        prop_assert!(ended);
        prop_assert_eq!(consumed, bytes.len());
        let bytes = from_agent(&sizes, 3);
        let (consumed, ended, _) = scan_in(Direction::FromAgent, &bytes, step).unwrap();
        prop_assert!(ended);
        prop_assert_eq!(consumed, bytes.len());
    }
}
