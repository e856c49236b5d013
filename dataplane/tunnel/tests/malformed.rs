//! Malformed gRPC frames, oversize messages and undecodable protobuf from a client or from an
//! agent end that call with an error status; the node keeps serving. The node runs in-process on
//! real sockets; the misbehaving peers are raw HTTP/2 clients.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use bytes::Bytes;
use common::{block_on, descriptor, fake_tunnel, raw_call, start_node, still_serves, LIMIT};
use sluice_grpc::transport::recv_data;
use sluice_grpc::{encode_message, message_header};
use sluice_runtime::Driver;

#[test]
fn malformed_client_frames_get_error_statuses() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        let cases: Vec<(&str, Vec<Bytes>, &str)> = vec![
            (
                "bad compressed flag",
                vec![Bytes::from_static(&[7, 0, 0, 0, 1, 42])],
                "13",
            ),
            (
                "oversize message",
                vec![Bytes::copy_from_slice(&message_header(false, LIMIT + 1))],
                "8",
            ),
            (
                "truncated message",
                vec![
                    Bytes::copy_from_slice(&message_header(false, 100)),
                    Bytes::from_static(b"only ten b"),
                ],
                "13",
            ),
        ];
        for (name, body, expected) in cases {
            let status = block_on(async {
                // A tunnel must be there: the node checks the body while relaying it.
                let (_agent_recv, _agent_send, refused) =
                    fake_tunnel(node.agent, descriptor()).await;
                assert_eq!(refused, None);
                raw_call(node.external, "/test.Echo/Unary", body).await
            });
            assert_eq!(status.0, expected, "{driver} {name}: {status:?}");
            assert!(
                status.1.starts_with("request: "),
                "{driver} {name}: {status:?}"
            );
        }
        assert!(node.shared.metrics.protocol_errors.sum() >= 3);
        still_serves(&node);
    }
}

#[test]
fn malformed_agent_messages_end_the_call_and_are_refused_at_connect() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        // Garbage instead of a Descriptor: refused with INVALID_ARGUMENT.
        // The tunnel's streams are dropped inside the runtime: dropped after it, an h2 stream
        // wakes its connection's task, whose last reference then drops the connection under the
        // lock the stream holds (a deadlock in h2, not in the node).
        let refused = block_on(async {
            let (_, _, refused) =
                fake_tunnel(node.agent, encode_message(false, &[0xff, 0xff, 0x01])).await;
            refused
        });
        assert_eq!(refused.as_deref(), Some("3"), "{driver}");

        // Undecodable protobuf, then an oversize frame, in the middle of a call.
        for (name, garbage) in [
            (
                "garbage protobuf",
                encode_message(false, &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            ),
            (
                "oversize frame",
                Bytes::copy_from_slice(&message_header(false, LIMIT * 4)),
            ),
        ] {
            let (status, message) = block_on(async {
                let (mut agent_recv, mut agent_send, _) =
                    fake_tunnel(node.agent, descriptor()).await;
                let call = monoio::spawn(raw_call(
                    node.external,
                    "/test.Echo/Unary",
                    vec![encode_message(false, b"hi")],
                ));
                // Wait for the RequestInfo, then answer with garbage.
                let first = recv_data(&mut agent_recv).await;
                assert!(
                    matches!(first, Some(Ok(_))),
                    "{driver} {name}: the call reached the fake agent"
                );
                agent_send.send_data(garbage, false).unwrap();
                call.await
            });
            assert_eq!(status, "13", "{driver} {name}: {message}");
            assert!(
                message.contains("agent 7 broke the tunnel protocol"),
                "{driver} {name}: {message}"
            );
        }
        still_serves(&node);
    }
}
