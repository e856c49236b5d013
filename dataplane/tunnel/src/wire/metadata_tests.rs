#![allow(clippy::unwrap_used)]
use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, ConnectResponse, Header, MetadataEntry,
    RequestInfo, Trailer,
};

use super::*;
use crate::wire::frame;

#[test]
fn hop_headers_and_credentials_are_not_carried() {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Bearer secret"));
    headers.insert("sluice-agent-id", HeaderValue::from_static("7"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    headers.insert("x-trace", HeaderValue::from_static("a"));
    headers.append("x-trace", HeaderValue::from_static("b"));
    headers.insert("trace-bin", HeaderValue::from_static("AAEC"));
    let entries = HeaderMetadata::of(&headers).to_entries();
    let keys: Vec<&str> = entries.iter().map(|entry| entry.key.as_str()).collect();
    assert_eq!(keys, vec!["x-trace", "trace-bin"]);
    let mut back = HeaderMap::new();
    assert_eq!(
        metadata_into_headers(&entries, &mut back, &MetadataLimits::default()),
        Ok(0)
    );
    assert_eq!(back.get_all("x-trace").iter().count(), 2);
    let bad = [MetadataEntry {
        key: "bad key".into(),
        values: vec![Bytes::from_static(b"v")],
    }];
    assert_eq!(
        metadata_into_headers(&bad, &mut back, &MetadataLimits::default()),
        Ok(1)
    );
}

#[test]
fn metadata_over_the_limits_is_refused_without_touching_the_headers() {
    // 30,000 distinct names made HeaderMap::append panic (its capacity is 24,576 names).
    let many: Vec<MetadataEntry> = (0..30_000)
        .map(|index| MetadataEntry {
            key: format!("x-k{index}"),
            values: vec![Bytes::from_static(b"v")],
        })
        .collect();
    let mut headers = HeaderMap::new();
    let limits = MetadataLimits::default();
    let refused = metadata_into_headers(&many, &mut headers, &limits).unwrap_err();
    assert_eq!(refused.entries, 30_000);
    assert!(
        refused.to_string().contains("limit of 512 entries"),
        "{refused}"
    );
    assert!(headers.is_empty());
    let big = [MetadataEntry {
        key: "x-big".into(),
        values: vec![Bytes::from(vec![b'a'; limits.bytes + 1])],
    }];
    assert!(metadata_into_headers(&big, &mut headers, &limits).is_err());
    let at_limit: Vec<MetadataEntry> = many[..limits.entries].to_vec();
    assert_eq!(
        metadata_into_headers(&at_limit, &mut headers, &limits),
        Ok(0)
    );
    // The highest limits configuration may set still stay below HeaderMap's capacity.
    let ceiling = MetadataLimits::CEILING;
    assert!(metadata_into_headers(&many, &mut HeaderMap::new(), &ceiling).is_err());
    let under_ceiling = &many[..ceiling.entries];
    assert_eq!(
        metadata_into_headers(under_ceiling, &mut HeaderMap::new(), &ceiling),
        Ok(0)
    );
}

/// The entries prost would be given: carried names in the map's order, all values in order.
fn reference_entries(headers: &HeaderMap, also_dropped: &[&str]) -> Vec<MetadataEntry> {
    headers
        .keys()
        .filter(|name| !is_hop_header(name) && !also_dropped.contains(&name.as_str()))
        .map(|name| MetadataEntry {
            key: name.as_str().to_string(),
            values: headers
                .get_all(name)
                .iter()
                .map(|value| Bytes::copy_from_slice(value.as_bytes()))
                .collect(),
        })
        .collect()
}

const TRAILER_FIELDS: [&str; 3] = ["grpc-status", "grpc-message", "content-type"];

/// Names a client, a backend or an attacker might send, hop headers and trailer fields among
/// them.
const NAMES: [&str; 12] = [
    "content-type",
    "user-agent",
    "authorization",
    "te",
    "grpc-timeout",
    "sluice-agent-id",
    "grpc-status",
    "grpc-message",
    "x-trace",
    "trace-bin",
    "x-a-rather-long-custom-metadata-name-that-needs-no-short-length-prefix",
    "grpc-accept-encoding",
];

fn header_map() -> impl Strategy<Value = HeaderMap> {
    let value = prop::collection::vec(0x20u8..0x7f, 0..200);
    prop::collection::vec((0..NAMES.len(), value), 0..24).prop_map(|pairs| {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_static(NAMES[name]),
                HeaderValue::from_bytes(&value).unwrap(),
            );
        }
        headers
    })
}

fn added_entry() -> impl Strategy<Value = Option<(String, Vec<u8>)>> {
    prop::option::of(("[a-z-]{0,20}", prop::collection::vec(any::<u8>(), 0..300)))
}

fn with_added<'a>(
    metadata: HeaderMetadata<'a>,
    added: &'a Option<(String, Vec<u8>)>,
) -> HeaderMetadata<'a> {
    match added {
        Some((key, value)) => metadata.with_entry(key, value),
        None => metadata,
    }
}

fn push_added(entries: &mut Vec<MetadataEntry>, added: &Option<(String, Vec<u8>)>) {
    if let Some((key, value)) = added {
        entries.push(MetadataEntry {
            key: key.clone(),
            values: vec![Bytes::copy_from_slice(value)],
        });
    }
}

proptest! {
    #[test]
    fn a_request_info_frame_is_what_prost_encodes(
        headers in header_map(),
        method in "(/[a-zA-Z0-9.]{0,300}){0,2}",
        added in added_entry(),
    ) {
        let mut out = BytesMut::from(&b"before"[..]);
        request_info_frame_into(&mut out, &method, &with_added(HeaderMetadata::of(&headers), &added));
        let mut metadata = reference_entries(&headers, &[]);
        push_added(&mut metadata, &added);
        let reference = frame(&ConnectResponse {
            msg: Some(connect_response::Msg::RequestInfo(RequestInfo {
                method_name: method.clone(),
                metadata,
            })),
        });
        prop_assert_eq!(&out[..6], b"before");
        prop_assert_eq!(&out[6..], &reference[..]);
    }

    #[test]
    fn header_and_trailer_frames_are_what_prost_encodes(
        headers in header_map(),
        status in prop_oneof![Just(0u32), 0u32..20, any::<u32>()],
        message in ".{0,40}",
    ) {
        let mut out = BytesMut::new();
        header_frame_into(&mut out, &HeaderMetadata::of(&headers));
        let reference = frame(&ConnectRequest {
            msg: Some(connect_request::Msg::Header(Header {
                metadata: reference_entries(&headers, &[]),
            })),
        });
        prop_assert_eq!(&out[..], &reference[..]);

        let mut out = BytesMut::new();
        trailer_frame_into(&mut out, status, &message, &HeaderMetadata::of_trailers(&headers));
        let reference = frame(&ConnectRequest {
            msg: Some(connect_request::Msg::Trailer(Trailer {
                grpc_status: status,
                grpc_message: message.clone(),
                metadata: reference_entries(&headers, &TRAILER_FIELDS),
            })),
        });
        prop_assert_eq!(&out[..], &reference[..]);
    }

    #[test]
    fn metadata_is_measured_as_the_entries_are_checked(
        headers in header_map(),
        added in added_entry(),
        entries_limit in 0usize..30,
        bytes_limit in 0usize..3000,
    ) {
        let metadata = with_added(HeaderMetadata::of(&headers), &added);
        let mut entries = reference_entries(&headers, &[]);
        push_added(&mut entries, &added);
        prop_assert_eq!(metadata.to_entries(), entries.clone());
        let limits = MetadataLimits { entries: entries_limit, bytes: bytes_limit };
        prop_assert_eq!(metadata.check(&limits), check_metadata(&entries, &limits));
    }

    #[test]
    fn arbitrary_metadata_never_panics(key in ".{0,20}", value in prop::collection::vec(any::<u8>(), 0..40)) {
        let entries = [MetadataEntry { key, values: vec![Bytes::from(value)] }];
        let _ = metadata_into_headers(&entries, &mut HeaderMap::new(), &MetadataLimits::default());
    }
}
