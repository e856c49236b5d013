use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use proptest::prelude::*;
use prost::Message as _;
use sluice_proto::kubernetes::v1::{
    http_request, http_response, HeaderField, HttpRequest, HttpResponse,
};

use super::*;

fn limits() -> ExchangeLimits {
    ExchangeLimits::default()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

/// A request head built field by field, bypassing the encoder's types (as a hostile peer would).
fn raw_head(method: &str, path: &str, fields: Vec<HeaderField>, assertion: &str) -> Vec<u8> {
    HttpRequest {
        message: Some(http_request::Message::Head(http_request::Head {
            method: method.into(),
            path: path.into(),
            headers: fields,
            assertion: assertion.into(),
        })),
    }
    .encode_to_vec()
}

fn field(name: &str, value: &[u8]) -> HeaderField {
    HeaderField {
        name: name.into(),
        value: Bytes::copy_from_slice(value),
    }
}

fn decode_head(bytes: &[u8]) -> Result<RequestHead, CodecError> {
    match decode_request(bytes, &limits())? {
        RequestMessage::Head(head) => Ok(head),
        other => panic!("not a head: {other:?}"),
    }
}

#[test]
fn every_request_message_round_trips() {
    let map = headers(&[("accept", "application/json"), ("x-a", "1"), ("x-a", "2")]);
    let head = encode_request_head(
        &Method::PATCH,
        "/api/v1/namespaces/a/pods?watch=1",
        &map,
        "a.b.c",
    );
    assert_eq!(
        decode_request(&head, &limits()).unwrap(),
        RequestMessage::Head(RequestHead {
            method: Method::PATCH,
            path: "/api/v1/namespaces/a/pods?watch=1".into(),
            headers: map,
            assertion: "a.b.c".into(),
        })
    );
    let data = Bytes::from_static(b"{\"kind\":\"Pod\"}");
    assert_eq!(
        decode_request(&encode_request_data(data.clone()), &limits()).unwrap(),
        RequestMessage::Data(data.clone())
    );
    assert_eq!(
        decode_request(&encode_request_end(), &limits()).unwrap(),
        RequestMessage::End
    );
    assert_eq!(
        decode_request(&encode_request_upgrade_data(data.clone()), &limits()).unwrap(),
        RequestMessage::UpgradeData(data)
    );
}

#[test]
fn every_response_message_round_trips() {
    let map = headers(&[("content-type", "application/json"), ("audit-id", "x")]);
    for status in [
        StatusCode::OK,
        StatusCode::SWITCHING_PROTOCOLS,
        StatusCode::FORBIDDEN,
    ] {
        assert_eq!(
            decode_response(&encode_response_head(status, &map), &limits()).unwrap(),
            ResponseMessage::Head(ResponseHead {
                status,
                headers: map.clone(),
            })
        );
    }
    let data = Bytes::from(vec![0u8, 1, 2, 255]);
    assert_eq!(
        decode_response(&encode_response_data(data.clone()), &limits()).unwrap(),
        ResponseMessage::Data(data.clone())
    );
    assert_eq!(
        decode_response(&encode_response_end(), &limits()).unwrap(),
        ResponseMessage::End
    );
    assert_eq!(
        decode_response(&encode_response_upgrade_data(data.clone()), &limits()).unwrap(),
        ResponseMessage::UpgradeData(data)
    );
}

#[test]
fn empty_and_malformed_messages_are_refused() {
    assert_eq!(decode_request(&[], &limits()), Err(CodecError::Empty));
    assert_eq!(decode_response(&[], &limits()), Err(CodecError::Empty));
    let head = encode_request_head(&Method::GET, "/api", &HeaderMap::new(), "t");
    let truncated = decode_request(&head[..head.len() - 1], &limits()).unwrap_err();
    assert_eq!(truncated.reason(), "malformed");
    assert_eq!(truncated.grpc_code(), crate::grpc_code::INVALID_ARGUMENT);
    // Wire type 3 (a group) is not used by these messages.
    assert_eq!(
        decode_request(&[0x0b], &limits()).unwrap_err().reason(),
        "malformed"
    );
}

#[test]
fn method_is_a_token_of_at_most_16_bytes() {
    let at_limit = "A".repeat(16);
    assert_eq!(
        decode_head(&raw_head(&at_limit, "/", vec![], ""))
            .unwrap()
            .method
            .as_str(),
        at_limit
    );
    assert_eq!(
        decode_head(&raw_head(&"A".repeat(17), "/", vec![], "")),
        Err(CodecError::MethodTooLong { len: 17, limit: 16 })
    );
    for bad in ["", "GE T", "GET\r\n", "G(T"] {
        assert_eq!(
            decode_head(&raw_head(bad, "/", vec![], ""))
                .unwrap_err()
                .reason(),
            "invalid_method",
            "{bad:?}"
        );
    }
}

#[test]
fn path_is_origin_form_of_at_most_8_kib() {
    let at_limit = format!("/{}", "a".repeat(8 * 1024 - 1));
    assert_eq!(
        decode_head(&raw_head("GET", &at_limit, vec![], ""))
            .unwrap()
            .path,
        at_limit
    );
    let over = format!("/{}", "a".repeat(8 * 1024));
    assert_eq!(
        decode_head(&raw_head("GET", &over, vec![], "")),
        Err(CodecError::PathTooLong {
            len: 8 * 1024 + 1,
            limit: 8 * 1024
        })
    );
    for bad in [
        "",
        "http://evil/x",
        "https://evil:443/x",
        "//evil/x",
        "@evil:443/x",
        "evil/x",
        "*",
        "/api v1",
        "/api\tx",
        "/api\r\nHost: evil",
        "/api\n",
        "/api\0",
        "/api/caf\u{e9}",
        "/api#fragment",
        "/\\evil/x",
    ] {
        assert_eq!(
            decode_head(&raw_head("GET", bad, vec![], ""))
                .unwrap_err()
                .reason(),
            "invalid_path",
            "{bad:?}"
        );
        assert!(check_path(bad, &limits()).is_err(), "{bad:?}");
    }
    for good in [
        "/",
        "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb,tier!%3Dx&watch=true",
        "/apis/apps/v1/namespaces/a/deployments/b/scale",
        "/api/v1/namespaces/a/pods/b/exec?command=sh&stdin=true",
        "/@evil:443/x",
    ] {
        check_path(good, &limits()).unwrap();
    }
}

#[test]
fn header_count_is_bounded_at_256() {
    let fields = |count: usize| {
        (0..count)
            .map(|index| field(&format!("x-h{index}"), b"v"))
            .collect()
    };
    assert_eq!(
        decode_head(&raw_head("GET", "/", fields(256), ""))
            .unwrap()
            .headers
            .len(),
        256
    );
    assert_eq!(
        decode_head(&raw_head("GET", "/", fields(257), "")),
        Err(CodecError::TooManyHeaders {
            count: 257,
            limit: 256
        })
    );
    // Counted before decoding, and refused at the first field past the bound, however small.
    let empty: Vec<HeaderField> = (0..5000).map(|_| HeaderField::default()).collect();
    assert_eq!(
        decode_head(&raw_head("GET", "/", empty, "")),
        Err(CodecError::TooManyHeaders {
            count: 257,
            limit: 256
        })
    );
}

#[test]
fn header_bytes_are_bounded_at_64_kib_names_and_values_together() {
    let name = "x-big";
    let at_limit = vec![b'v'; 64 * 1024 - name.len()];
    let head = decode_head(&raw_head("GET", "/", vec![field(name, &at_limit)], "")).unwrap();
    assert_eq!(head.headers[name].len(), at_limit.len());
    let over = vec![b'v'; 64 * 1024 - name.len() + 1];
    assert_eq!(
        decode_head(&raw_head("GET", "/", vec![field(name, &over)], "")),
        Err(CodecError::HeadersTooLarge {
            len: 64 * 1024 + 1,
            limit: 64 * 1024
        })
    );
    // The same bound over many fields.
    let half = vec![b'v'; 32 * 1024 - 3];
    assert!(decode_head(&raw_head(
        "GET",
        "/",
        vec![field("x-a", &half), field("x-b", &half)],
        ""
    ))
    .is_ok());
    let half_over = vec![b'v'; 32 * 1024 - 2];
    assert_eq!(
        decode_head(&raw_head(
            "GET",
            "/",
            vec![field("x-a", &half), field("x-b", &half_over)],
            ""
        ))
        .unwrap_err()
        .reason(),
        "headers_too_large"
    );
}

#[test]
fn header_names_are_lowercase_http_names_and_values_have_no_line_breaks() {
    for bad in ["Accept", "x a", "x:a", ":authority", "", "x\r\ny"] {
        assert_eq!(
            decode_head(&raw_head("GET", "/", vec![field(bad, b"v")], ""))
                .unwrap_err()
                .reason(),
            "invalid_header_name",
            "{bad:?}"
        );
    }
    for bad in [&b"a\r\nhost: evil"[..], b"a\nb", b"a\0b"] {
        assert_eq!(
            decode_head(&raw_head("GET", "/", vec![field("x-a", bad)], "")),
            Err(CodecError::InvalidHeaderValue("x-a".into()))
        );
    }
}

#[test]
fn assertion_is_bounded_at_16_kib() {
    let at_limit = "a".repeat(16 * 1024);
    assert_eq!(
        decode_head(&raw_head("GET", "/", vec![], &at_limit))
            .unwrap()
            .assertion,
        at_limit
    );
    assert_eq!(
        decode_head(&raw_head("GET", "/", vec![], &"a".repeat(16 * 1024 + 1))),
        Err(CodecError::AssertionTooLarge {
            len: 16 * 1024 + 1,
            limit: 16 * 1024
        })
    );
}

#[test]
fn data_chunks_are_bounded_at_1_mib() {
    let at_limit = Bytes::from(vec![7u8; 1024 * 1024]);
    let over = Bytes::from(vec![7u8; 1024 * 1024 + 1]);
    let too_large = CodecError::DataTooLarge {
        len: 1024 * 1024 + 1,
        limit: 1024 * 1024,
    };
    assert_eq!(
        decode_request(&encode_request_data(at_limit.clone()), &limits()),
        Ok(RequestMessage::Data(at_limit.clone()))
    );
    assert_eq!(
        decode_request(&encode_request_data(over.clone()), &limits()),
        Err(too_large.clone())
    );
    assert_eq!(
        decode_request(&encode_request_upgrade_data(over.clone()), &limits()),
        Err(too_large.clone())
    );
    assert_eq!(
        decode_response(&encode_response_upgrade_data(at_limit.clone()), &limits()),
        Ok(ResponseMessage::UpgradeData(at_limit))
    );
    assert_eq!(
        decode_response(&encode_response_data(over.clone()), &limits()),
        Err(too_large.clone())
    );
    assert_eq!(
        decode_response(&encode_response_upgrade_data(over), &limits()),
        Err(too_large.clone())
    );
}

#[test]
fn a_head_at_every_bound_at_once_is_accepted() {
    let limits = limits();
    let value_bytes = limits.max_header_bytes / limits.max_header_fields - 8;
    let fields: Vec<HeaderField> = (0..limits.max_header_fields)
        .map(|index| field(&format!("x-{index:05}"), &vec![b'v'; value_bytes]))
        .collect();
    let path = format!("/{}", "p".repeat(limits.max_path_bytes - 1));
    let assertion = "a".repeat(limits.max_assertion_bytes);
    let bytes = raw_head(
        &"M".repeat(limits.max_method_bytes),
        &path,
        fields,
        &assertion,
    );
    assert!(bytes.len() <= limits.max_head_bytes());
    let head = decode_head(&bytes).unwrap();
    assert_eq!(head.headers.len(), limits.max_header_fields);
}

#[test]
fn messages_and_heads_past_their_size_are_refused_before_decoding() {
    let limits = limits();
    let mut huge = encode_request_data(Bytes::from(vec![0u8; limits.max_data_bytes])).to_vec();
    huge.extend(std::iter::repeat_n(
        0u8,
        limits.max_message_bytes() + 1 - huge.len(),
    ));
    assert_eq!(
        decode_request(&huge, &limits),
        Err(CodecError::MessageTooLarge {
            len: limits.max_message_bytes() + 1,
            limit: limits.max_message_bytes()
        })
    );
    // A head padded with an unknown field past the head bound, within the message bound.
    let mut padded_head = Vec::new();
    prost::encoding::encode_key(
        9,
        prost::encoding::WireType::LengthDelimited,
        &mut padded_head,
    );
    prost::encoding::encode_varint(limits.max_head_bytes() as u64, &mut padded_head);
    padded_head.extend(std::iter::repeat_n(b'x', limits.max_head_bytes()));
    let mut message = Vec::new();
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut message);
    prost::encoding::encode_varint(padded_head.len() as u64, &mut message);
    message.extend(&padded_head);
    assert_eq!(
        decode_request(&message, &limits).unwrap_err().reason(),
        "head_too_large"
    );
    assert_eq!(
        decode_response(&message, &limits).unwrap_err().reason(),
        "head_too_large"
    );
}

#[test]
fn response_status_is_101_or_final() {
    let response = |status: u32| {
        HttpResponse {
            message: Some(http_response::Message::Head(http_response::Head {
                status,
                headers: vec![],
            })),
        }
        .encode_to_vec()
    };
    for bad in [0, 99, 100, 102, 103, 1000, 70_000] {
        assert_eq!(
            decode_response(&response(bad), &limits()),
            Err(CodecError::InvalidStatus(bad))
        );
    }
    for good in [101, 200, 404, 599, 999] {
        assert!(
            decode_response(&response(good), &limits()).is_ok(),
            "{good}"
        );
    }
}

#[test]
fn every_error_has_a_distinct_reason() {
    let errors = [
        CodecError::MessageTooLarge { len: 0, limit: 0 },
        CodecError::HeadTooLarge { len: 0, limit: 0 },
        CodecError::Malformed(String::new()),
        CodecError::Empty,
        CodecError::InvalidMethod(String::new()),
        CodecError::MethodTooLong { len: 0, limit: 0 },
        CodecError::PathTooLong { len: 0, limit: 0 },
        CodecError::InvalidPath(""),
        CodecError::TooManyHeaders { count: 0, limit: 0 },
        CodecError::HeadersTooLarge { len: 0, limit: 0 },
        CodecError::InvalidHeaderName(String::new()),
        CodecError::InvalidHeaderValue(String::new()),
        CodecError::AssertionTooLarge { len: 0, limit: 0 },
        CodecError::DataTooLarge { len: 0, limit: 0 },
        CodecError::InvalidStatus(0),
        CodecError::OutOfOrder {
            side: "",
            message: "",
            when: "",
        },
    ];
    let reasons: std::collections::BTreeSet<&str> = errors.iter().map(CodecError::reason).collect();
    assert_eq!(reasons.len(), errors.len());
}

fn header_map() -> impl Strategy<Value = HeaderMap> {
    prop::collection::vec(("x-[a-z]{1,8}", "[ -~]{0,32}"), 0..8).prop_map(|pairs| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(&value).unwrap(),
            );
        }
        map
    })
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode_request(&bytes, &limits());
        let _ = decode_response(&bytes, &limits());
    }

    #[test]
    fn valid_requests_round_trip(
        method in "[A-Z]{1,16}",
        path in "/[!$&'()*+,;=:@/?%a-zA-Z0-9._~-]{0,64}",
        headers in header_map(),
        assertion in "[A-Za-z0-9._-]{0,128}",
        data in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let path = path.replace("//", "/x/");
        let decoded = decode_request(&encode_request_head(&method, &path, &headers, &assertion), &limits());
        prop_assert_eq!(decoded, Ok(RequestMessage::Head(RequestHead { method, path, headers, assertion })));
        let data = Bytes::from(data);
        prop_assert_eq!(decode_request(&encode_request_data(data.clone()), &limits()), Ok(RequestMessage::Data(data.clone())));
        prop_assert_eq!(decode_request(&encode_request_upgrade_data(data.clone()), &limits()), Ok(RequestMessage::UpgradeData(data)));
    }

    #[test]
    fn valid_responses_round_trip(
        status in prop::sample::select(vec![101u16, 200, 201, 204, 301, 400, 403, 404, 409, 410, 429, 500, 503]),
        headers in header_map(),
        data in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let status = StatusCode::from_u16(status).unwrap();
        let decoded = decode_response(&encode_response_head(status, &headers), &limits());
        prop_assert_eq!(decoded, Ok(ResponseMessage::Head(ResponseHead { status, headers })));
        let data = Bytes::from(data);
        prop_assert_eq!(decode_response(&encode_response_data(data.clone()), &limits()), Ok(ResponseMessage::Data(data)));
    }
}
