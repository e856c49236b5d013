#![allow(clippy::unwrap_used)]

use sluice_proto::tunnel::v1::{CloseSend, Message, MetadataEntry};

use super::*;

fn info(metadata: Vec<MetadataEntry>) -> RequestInfo {
    RequestInfo {
        method_name: "/echo.Echo/Say".into(),
        metadata,
    }
}

fn backend() -> Endpoint {
    Endpoint {
        url: "http://127.0.0.1:9000".into(),
        host: "127.0.0.1".into(),
        port: 9000,
        tls: false,
    }
}

#[test]
fn a_clean_call_keeps_the_tunnel_only_after_the_node_closed_its_side() {
    assert_eq!(call_end(Ok(()), true), CallEnd::Reuse);
    assert_eq!(call_end(Ok(()), false), CallEnd::EndTunnel);
}

#[test]
fn the_node_is_told_why_a_call_failed_unless_it_ended_the_call_itself() {
    let backend = TunnelError::new(ErrorKind::BackendUnavailable, "backend: refused");
    assert_eq!(
        call_end(Err(backend.clone()), false),
        CallEnd::Answer(backend)
    );
    let reset = TunnelError::new(ErrorKind::NodeGone, "the node closed the tunnel");
    assert_eq!(call_end(Err(reset), true), CallEnd::Drop);
    let confused = TunnelError::new(ErrorKind::NodeProtocol, "a second RequestInfo");
    assert_eq!(call_end(Err(confused), false), CallEnd::Drop);
}

#[test]
fn request_messages_are_classified_by_variant() {
    let message = connect_response::Msg::Message(Message {
        data: Bytes::from_static(b"hi"),
        compressed: false,
    });
    assert!(matches!(
        classify_request(Ok(Some(message))),
        Ok(FromNode::Message(message)) if message.data == "hi"
    ));
    assert!(matches!(
        classify_request(Ok(Some(connect_response::Msg::CloseSend(CloseSend {})))),
        Ok(FromNode::CloseSend)
    ));
    let second = classify_request(Ok(Some(connect_response::Msg::RequestInfo(info(
        Vec::new(),
    )))));
    assert_eq!(second.unwrap_err().kind(), ErrorKind::NodeProtocol);
    let closed = classify_request(Ok(None)).unwrap_err();
    assert_eq!(closed.kind(), ErrorKind::NodeGone);
    assert_eq!(closed.side(), Side::Node);
    let reset = classify_request(Err(ReadError::Gone("stream reset".into()))).unwrap_err();
    assert_eq!(reset.kind(), ErrorKind::NodeGone);
}

#[test]
fn the_backend_request_carries_the_method_metadata_and_deadline() {
    let request = backend_request(
        &info(vec![
            MetadataEntry {
                key: "x-trace".into(),
                values: vec![Bytes::from_static(b"abc")],
            },
            MetadataEntry {
                key: GRPC_TIMEOUT.into(),
                values: vec![Bytes::from_static(b"1500m")],
            },
        ]),
        &backend_authority(&backend()).unwrap(),
    )
    .expect("within the limits");
    assert_eq!(request.uri(), "http://127.0.0.1:9000/echo.Echo/Say");
    let headers = request.headers();
    assert_eq!(headers["x-trace"], "abc");
    assert_eq!(headers[GRPC_TIMEOUT], "1500m");
    assert_eq!(headers[http::header::TE], "trailers");
    assert_eq!(headers[http::header::CONTENT_TYPE], "application/grpc");
}

fn decoded_trailer(headers: &HeaderMap) -> sluice_proto::tunnel::v1::Trailer {
    let mut out = bytes::BytesMut::new();
    trailer_into(&mut out, headers);
    let mut reader = crate::wire::TunnelReader::new(1 << 16);
    reader.push(out.freeze());
    match reader.next_request().unwrap() {
        Some(connect_request::Msg::Trailer(trailer)) => trailer,
        other => panic!("not a Trailer: {other:?}"),
    }
}

#[test]
fn a_trailer_carries_status_message_and_the_other_trailers() {
    let mut headers = HeaderMap::new();
    headers.insert("grpc-status", HeaderValue::from_static("5"));
    headers.insert("grpc-message", HeaderValue::from_static("not%20found"));
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("x-extra", HeaderValue::from_static("1"));
    let trailer = decoded_trailer(&headers);
    assert_eq!(trailer.grpc_status, Code::NotFound.as_u32());
    assert_eq!(trailer.grpc_message, "not found");
    assert_eq!(trailer.metadata.len(), 1);
    assert_eq!(trailer.metadata[0].key, "x-extra");
    assert_eq!(
        decoded_trailer(&HeaderMap::new()).grpc_status,
        Code::Unknown.as_u32()
    );
}

#[test]
fn a_method_without_a_leading_slash_cannot_choose_the_backend_authority() {
    // What the agent would dial if it built the URI from such a method: shown so the guard in
    // `open_backend_call` has a reason.
    let uri: http::Uri = "http://127.0.0.1:9000@evil.example:443/x".parse().unwrap();
    assert_eq!(uri.host(), Some("evil.example"));
}

#[test]
fn metadata_past_the_ceiling_is_refused_not_dropped() {
    let entries = (0..sluice_config::METADATA_ENTRIES_CEILING + 1)
        .map(|index| MetadataEntry {
            key: format!("x-k{index}"),
            values: vec![Bytes::from_static(b"v")],
        })
        .collect();
    let authority = backend_authority(&backend()).unwrap();
    let refused = backend_request(&info(entries), &authority).expect_err("over the ceiling");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let count = (sluice_config::METADATA_ENTRIES_CEILING + 1).to_string();
    assert!(refused.message().contains(&count), "{}", refused.message());
}

#[test]
fn a_method_that_is_not_a_grpc_path_is_refused_not_sent_elsewhere() {
    let authority = backend_authority(&backend()).unwrap();
    for method in [
        "echo.Echo/Say",
        "@evil.example:443/x",
        "/echo Echo/Say",
        "/a\nb",
    ] {
        let mut call = info(Vec::new());
        call.method_name = method.into();
        let refused = backend_request(&call, &authority).expect_err(method);
        assert_eq!(refused.kind(), ErrorKind::Unimplemented, "{method}");
    }
}

#[test]
fn an_ipv6_backend_keeps_its_brackets() {
    let mut v6 = backend();
    v6.host = "::1".into();
    let request = backend_request(&info(Vec::new()), &backend_authority(&v6).unwrap()).unwrap();
    assert_eq!(request.uri(), "http://[::1]:9000/echo.Echo/Say");
}
