//! Tunnel protobuf messages (`sluice.tunnel.v1`, `sluice.agents.v1`) as prost decodes them, and
//! the tunnel's own reader over gRPC frames (`sluice_tunnel::wire::TunnelReader`), with
//! re-encode round trips, `data_frame` read back, and metadata turned into HTTP headers; and the
//! private hop's splice scanner (`sluice_tunnel::wire::splice`) over the same bytes, checked
//! against the reader: a call the scanner passes whole ends where prost sees its last message,
//! and the scanner's verdict does not depend on the chunking.
#![no_main]
use bytes::Bytes;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use sluice_proto::agents::v1::{ListConnectedAgentsRequest, ListConnectedAgentsResponse};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, ConnectResponse,
};
use sluice_tunnel::wire::splice::{CallScanner, Direction};
use sluice_tunnel::wire::{
    data_frame, metadata_into_headers, request_info_frame_into, HeaderMetadata, MetadataLimits,
    TunnelReader,
};

fn round_trip<M: prost::Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) -> Option<M> {
    let message = M::decode(data).ok()?;
    let again = M::decode(message.encode_to_vec().as_slice()).expect("re-encoded message decodes");
    assert_eq!(message, again);
    Some(message)
}

fn metadata(entries: &[sluice_proto::tunnel::v1::MetadataEntry]) {
    let mut headers = HeaderMap::new();
    // Over the metadata limits the call is refused; within them the headers are built, and
    // encoded from the header map again they read back as the same entries.
    if metadata_into_headers(entries, &mut headers, &MetadataLimits::default()).is_ok() {
        let carried = HeaderMetadata::of(&headers);
        let mut frame = bytes::BytesMut::new();
        request_info_frame_into(&mut frame, "/m", &carried);
        let mut reader = TunnelReader::new(1 << 20);
        reader.push(frame.freeze());
        match reader.next_response().expect("an encoded RequestInfo decodes") {
            Some(connect_response::Msg::RequestInfo(info)) => {
                assert_eq!(info.metadata, carried.to_entries());
            }
            other => panic!("not a RequestInfo: {other:?}"),
        }
    }
}

/// Scans `bytes` in chunks of `step`: (bytes consumed, ended) or the error.
fn scan(direction: Direction, bytes: &[u8], step: usize) -> Result<(usize, bool), String> {
    let mut scanner = CallScanner::new(direction, 1024);
    let mut consumed = 0;
    for chunk in bytes.chunks(step) {
        let scanned = scanner.scan(chunk).map_err(|error| error.to_string())?;
        consumed += scanned.consumed;
        if scanned.ended {
            return Ok((consumed, true));
        }
    }
    Ok((consumed, false))
}

/// What the scanner passes as a whole call, prost reads as one: unless the content of a frame
/// is refused by prost (which the receiving end then refuses), the last message is the one
/// that ends a call in that direction.
fn splice_agrees_with_the_reader(rest: &[u8], request_side: bool, step: usize) {
    let direction = if request_side {
        Direction::FromAgent
    } else {
        Direction::ToAgent
    };
    let whole = scan(direction, rest, rest.len().max(1));
    assert_eq!(whole, scan(direction, rest, step), "the verdict depends on the chunking");
    let Ok((consumed, true)) = whole else {
        return;
    };
    let mut reader = TunnelReader::new(1024);
    reader.push(Bytes::copy_from_slice(&rest[..consumed]));
    let mut last_ends = false;
    loop {
        let next = if request_side {
            reader.next_request().map(|message| {
                message.map(|message| {
                    matches!(
                        message,
                        connect_request::Msg::Trailer(_) | connect_request::Msg::Error(_)
                    )
                })
            })
        } else {
            reader.next_response().map(|message| {
                message.map(|message| matches!(message, connect_response::Msg::CloseSend(_)))
            })
        };
        match next {
            Ok(Some(ends)) => last_ends = ends,
            Ok(None) => break,
            // The frame's shape was right and its content is not (the scanner does not look
            // inside): the agent or the routing node, which decode it, refuse it.
            Err(_) => return,
        }
    }
    assert!(last_ends, "the scanner ended the call where prost sees no end");
    assert_eq!(reader.buffered(), 0);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if let Some(request) = round_trip::<ConnectRequest>(rest) {
        match &request.msg {
            Some(connect_request::Msg::Header(header)) => metadata(&header.metadata),
            Some(connect_request::Msg::Trailer(trailer)) => metadata(&trailer.metadata),
            _ => {}
        }
    }
    if let Some(response) = round_trip::<ConnectResponse>(rest) {
        if let Some(connect_response::Msg::RequestInfo(info)) = &response.msg {
            metadata(&info.metadata);
        }
    }
    let _ = round_trip::<ListConnectedAgentsResponse>(rest);
    // What a node decodes from any authenticated client.
    let _ = round_trip::<ListConnectedAgentsRequest>(rest);

    // The same bytes as a tunnel stream, split into chunks of up to 16 bytes.
    let request_side = mode & 0x80 != 0;
    let step = usize::from(mode & 0x0f) + 1;
    splice_agrees_with_the_reader(rest, request_side, step);
    let mut reader = TunnelReader::new(1024);
    let input = Bytes::copy_from_slice(rest);
    'chunks: for at in (0..input.len()).step_by(step) {
        reader.push(input.slice(at..(at + step).min(input.len())));
        loop {
            let next = if request_side {
                reader.next_request().map(|message| message.is_some())
            } else {
                reader.next_response().map(|message| message.is_some())
            };
            match next {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => break 'chunks,
            }
        }
    }
    let _ = reader.finish();

    // data_frame: whatever payload, the reader gets it back unchanged.
    let compressed = mode & 0x40 != 0;
    let mut reader = TunnelReader::new(rest.len());
    for piece in data_frame(input.clone(), compressed, request_side) {
        reader.push(piece);
    }
    let expected = sluice_proto::tunnel::v1::Message {
        data: input,
        compressed,
    };
    if request_side {
        let got = reader.next_request().expect("data_frame output decodes");
        assert_eq!(got, Some(connect_request::Msg::Message(expected)));
    } else {
        let got = reader.next_response().expect("data_frame output decodes");
        assert_eq!(got, Some(connect_response::Msg::Message(expected)));
    }
    assert_eq!(reader.buffered(), 0);
});
