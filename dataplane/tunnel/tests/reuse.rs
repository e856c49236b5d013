//! Tunnel reuse on the wire: an agent that declares `reusable` gets the next call on the same
//! Connect stream after a clean call; one that does not (a kas-style agent), or a call that ends
//! with an Error, gets its tunnel closed by the node.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use h2::{RecvStream, SendStream};
use sluice_grpc::encode_message;
use sluice_grpc::transport::recv_data;
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, Descriptor, Error, Header, Message, Trailer,
};
use sluice_runtime::Driver;
use sluice_tunnel::wire::{frame, TunnelReader};

fn descriptor_reusable(reusable: bool) -> Bytes {
    frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor {
            reusable,
            ..Descriptor::default()
        })),
    })
}

fn agent_frame(message: connect_request::Msg) -> Bytes {
    frame(&ConnectRequest { msg: Some(message) })
}

/// A client's unary call to the node's external endpoint, running in the background.
fn spawn_unary(node: &Node, payload: &[u8]) -> monoio::task::JoinHandle<(String, String)> {
    monoio::spawn(raw_call(
        node.external,
        "/test.Echo/Unary",
        vec![encode_message(false, payload)],
    ))
}

/// Reads one call from the fake agent's side of the tunnel: RequestInfo, the messages, CloseSend.
/// Returns the method and the messages' payloads.
async fn read_call(recv: &mut RecvStream, reader: &mut TunnelReader) -> (String, Vec<Bytes>) {
    let first = next_message(recv, reader).await;
    let Some(connect_response::Msg::RequestInfo(info)) = first else {
        panic!("a call starts with RequestInfo, got {first:?}");
    };
    let mut messages = Vec::new();
    loop {
        match next_message(recv, reader).await {
            Some(connect_response::Msg::Message(message)) => messages.push(message.data),
            Some(connect_response::Msg::CloseSend(_)) => return (info.method_name, messages),
            other => panic!("expected Message or CloseSend, got {other:?}"),
        }
    }
}

async fn next_message(
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
) -> Option<connect_response::Msg> {
    monoio::time::timeout(Duration::from_secs(10), reader.read_response(recv))
        .await
        .expect("the node sends the call within 10s")
        .expect("a readable tunnel")
}

/// Answers a call as a unary backend would, all in one DATA frame.
fn answer(send: &mut SendStream<Bytes>, payload: &[u8]) {
    let mut out = BytesMut::new();
    out.extend_from_slice(&agent_frame(
        connect_request::Msg::Header(Header::default()),
    ));
    out.extend_from_slice(&agent_frame(connect_request::Msg::Message(Message {
        data: encode_message(false, payload),
        compressed: false,
    })));
    out.extend_from_slice(&agent_frame(connect_request::Msg::Trailer(Trailer {
        grpc_status: 0,
        ..Trailer::default()
    })));
    send.send_data(out.freeze(), false).unwrap();
}

/// Whether the node ends the tunnel (end of stream or reset) within `within`.
async fn node_ends_tunnel(recv: &mut RecvStream, within: Duration) -> bool {
    monoio::time::timeout(within, async {
        if let Some(Ok(chunk)) = recv_data(recv).await {
            panic!("unexpected data after the call: {chunk:?}");
        }
    })
    .await
    .is_ok()
}

#[test]
fn a_reusable_tunnel_carries_call_after_call_on_one_stream() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        block_on(async {
            let (mut recv, mut send, refused) =
                fake_tunnel(node.agent, descriptor_reusable(true)).await;
            assert_eq!(refused, None, "{driver}");
            let mut reader = TunnelReader::new(LIMIT);
            for round in 0..3u8 {
                let payload = vec![b'a' + round; 3];
                let call = spawn_unary(&node, &payload);
                let (method, messages) = read_call(&mut recv, &mut reader).await;
                assert_eq!(method, "/test.Echo/Unary", "{driver} round {round}");
                assert_eq!(
                    messages,
                    vec![encode_message(false, &payload).slice(5..)],
                    "{driver} round {round}"
                );
                answer(&mut send, b"pong");
                let (status, message) = call.await;
                assert_eq!(status, "0", "{driver} round {round}: {message}");
            }
        });
        assert_eq!(
            node.shared.metrics.tunnels_reused.sum(),
            3,
            "{driver}: every clean call put the tunnel back"
        );
        still_serves(&node);
    }
}

#[test]
fn a_one_shot_agent_or_a_failed_call_gets_its_tunnel_closed() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        block_on(async {
            // A kas-style agent (no `reusable`): the node closes the tunnel after the call.
            let (mut recv, mut send, _) = fake_tunnel(node.agent, descriptor_reusable(false)).await;
            let mut reader = TunnelReader::new(LIMIT);
            let call = spawn_unary(&node, b"x");
            read_call(&mut recv, &mut reader).await;
            answer(&mut send, b"y");
            assert_eq!(call.await.0, "0", "{driver}");
            assert!(
                node_ends_tunnel(&mut recv, Duration::from_secs(5)).await,
                "{driver}: a one-shot tunnel is closed after its call"
            );

            // A reusable agent whose call ends with an Error: not reused either.
            let (mut recv, mut send, _) = fake_tunnel(node.agent, descriptor_reusable(true)).await;
            let mut reader = TunnelReader::new(LIMIT);
            let call = spawn_unary(&node, b"x");
            read_call(&mut recv, &mut reader).await;
            send.send_data(
                agent_frame(connect_request::Msg::Error(Error {
                    grpc_status: 14,
                    message: "backend down".to_string(),
                })),
                false,
            )
            .unwrap();
            let (status, message) = call.await;
            assert_eq!(status, "14", "{driver}: {message}");
            assert!(
                node_ends_tunnel(&mut recv, Duration::from_secs(5)).await,
                "{driver}: a tunnel whose call failed is closed"
            );
        });
        assert_eq!(node.shared.metrics.tunnels_reused.sum(), 0, "{driver}");
        still_serves(&node);
    }
}

/// A reusable tunnel that carried one call: parked in the node's registry afterwards.
async fn tunnel_after_one_call(node: &Node) -> (RecvStream, SendStream<Bytes>) {
    let (mut recv, mut send, refused) = fake_tunnel(node.agent, descriptor_reusable(true)).await;
    assert_eq!(refused, None);
    let mut reader = TunnelReader::new(LIMIT);
    let call = spawn_unary(node, b"x");
    read_call(&mut recv, &mut reader).await;
    answer(&mut send, b"y");
    assert_eq!(call.await.0, "0");
    (recv, send)
}

/// The grpc-status of the trailers the node ends a tunnel with.
async fn closing_status(recv: &mut RecvStream) -> Option<String> {
    assert!(node_ends_tunnel(recv, Duration::from_secs(5)).await);
    let trailers = std::future::poll_fn(|cx| recv.poll_trailers(cx)).await;
    let trailers = trailers.ok().flatten()?;
    let status = trailers.get("grpc-status")?;
    Some(status.to_str().unwrap().to_string())
}

#[test]
fn a_parked_tunnel_is_closed_at_once_when_the_node_drains() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let mut node = start_node(driver);
        let running = node.running.take().unwrap();
        block_on(async {
            let (mut recv, _send) = tunnel_after_one_call(&node).await;
            // Nothing owns a parked tunnel: the node must still close it with its answer to a
            // drain, not leave the connection to be cut at the drain deadline.
            let shutdown = std::thread::spawn(move || running.shutdown());
            let status = closing_status(&mut recv).await;
            assert_eq!(status.as_deref(), Some("14"), "{driver}: UNAVAILABLE");
            let report = shutdown.join().unwrap();
            assert_eq!(report.connections_cut, 0, "{driver}: {report:?}");
        });
    }
}

#[test]
fn a_parked_tunnel_of_a_revoked_agent_is_closed() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        block_on(async {
            let (mut recv, _send) = tunnel_after_one_call(&node).await;
            assert_eq!(node.shared.registry.idle_count(), 1, "{driver}");
            node.shared.set_agents(&[]);
            assert!(
                node_ends_tunnel(&mut recv, Duration::from_secs(5)).await,
                "{driver}"
            );
            assert_eq!(node.shared.registry.idle_count(), 0, "{driver}");
        });
    }
}

/// The sweep beside an agent connection sleeps while nothing is parked on it: a tunnel parked
/// again after the sweep took the first one over (and went back to sleep) must still wake it.
/// One driver: the sweep does not depend on it.
#[test]
fn a_tunnel_parked_again_after_the_sweep_went_to_sleep_is_still_taken_over() {
    let node = start_node(Driver::IoUring);
    block_on(async {
        let (mut recv, mut send) = tunnel_after_one_call(&node).await;
        // Past two sweep periods: the sweep has handed the tunnel to an owner task and found
        // nothing else parked on the connection.
        monoio::time::sleep(Duration::from_millis(2_200)).await;
        let mut reader = TunnelReader::new(LIMIT);
        let call = spawn_unary(&node, b"again");
        read_call(&mut recv, &mut reader).await;
        answer(&mut send, b"pong");
        assert_eq!(call.await.0, "0");
        // Parked again; the agent sends a stray byte with no call coming: only an owner task
        // reads it, and only the sweep hands a parked tunnel to one. (A reset would not do:
        // the agent's connection ends with its last stream, and with it the tunnel.)
        send.send_data(Bytes::from_static(b"x"), false).unwrap();
        let forgotten = monoio::time::timeout(Duration::from_secs(5), async {
            while node.shared.registry.idle_count() > 0 {
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(forgotten.is_ok(), "the tunnel is still parked");
    });
    still_serves(&node);
}

#[test]
fn a_tunnel_the_agent_reset_while_parked_is_skipped_and_then_forgotten() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        block_on(async {
            let (_recv, mut parked) = tunnel_after_one_call(&node).await;
            parked.send_reset(h2::Reason::CANCEL);
            monoio::time::sleep(Duration::from_millis(100)).await;
            // The next call takes the parked tunnel first, finds it gone before the client saw
            // anything, and goes down a live one.
            let (mut recv, mut send, _) = fake_tunnel(node.agent, descriptor_reusable(true)).await;
            let mut reader = TunnelReader::new(LIMIT);
            let call = spawn_unary(&node, b"again");
            read_call(&mut recv, &mut reader).await;
            answer(&mut send, b"pong");
            assert_eq!(call.await.0, "0", "{driver}");

            // Parked again, then reset by the agent with no call coming: an owner task takes it
            // over within two seconds and sees the reset.
            send.send_reset(h2::Reason::CANCEL);
            let forgotten = monoio::time::timeout(Duration::from_secs(5), async {
                while node.shared.registry.idle_count() > 0 {
                    monoio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
            assert!(
                forgotten.is_ok(),
                "{driver}: the reset tunnel is still counted idle"
            );
        });
        still_serves(&node);
    }
}

/// An agent withdrawing an idle tunnel (stopping, or its idle timeout) resets it with
/// REFUSED_STREAM; a call the node sent down it at that moment was never read, so the node
/// routes it to another tunnel and the client sees no error. A CANCEL after the agent read the
/// call says nothing of the kind: that call fails (the agent may have started it).
#[test]
fn a_call_on_a_tunnel_the_agent_refused_goes_to_another_tunnel() {
    // A node per case: the first case's second tunnel, parked and then dropped, could take the
    // next case's first call before the node saw it reset.
    for (driver, reason, retried) in
        [Driver::IoUring, Driver::Legacy]
            .into_iter()
            .flat_map(|driver| {
                [
                    (driver, h2::Reason::REFUSED_STREAM, true),
                    (driver, h2::Reason::CANCEL, false),
                ]
            })
    {
        let node = start_node(driver);
        block_on(async {
            {
                let (mut first_recv, mut first_send) = tunnel_after_one_call(&node).await;
                let call = spawn_unary(&node, b"routed again");
                // The node sent the call down the one parked tunnel...
                let mut reader = TunnelReader::new(LIMIT);
                read_call(&mut first_recv, &mut reader).await;
                // ...a second tunnel arrives, and the agent resets the first.
                let (mut recv, mut send, refused) =
                    fake_tunnel(node.agent, descriptor_reusable(true)).await;
                assert_eq!(refused, None);
                first_send.send_reset(reason);
                if retried {
                    let mut reader = TunnelReader::new(LIMIT);
                    let (method, messages) = read_call(&mut recv, &mut reader).await;
                    assert_eq!(method, "/test.Echo/Unary", "{driver}");
                    assert_eq!(messages, [Bytes::from_static(b"routed again")], "{driver}");
                    answer(&mut send, b"pong");
                    assert_eq!(
                        call.await.0,
                        "0",
                        "{driver}: a refused tunnel failed the call"
                    );
                } else {
                    let (code, _) = call.await;
                    assert_eq!(code, "14", "{driver}: a call the agent cancelled");
                    send.send_reset(h2::Reason::CANCEL);
                }
            }
        });
        still_serves(&node);
    }
}

/// A client's unary call whose body the test sends later (`send` then `grpc_outcome`).
async fn call_without_body(node: &Node) -> (h2::client::ResponseFuture, SendStream<Bytes>) {
    let connection = sluice_grpc::transport::connect(
        node.external,
        None,
        &sluice_grpc::transport::H2Settings::default(),
    )
    .await
    .unwrap();
    let mut ready = connection.send_request.ready().await.unwrap();
    ready
        .send_request(call_head("/test.Echo/Unary"), false)
        .unwrap()
}

/// A call that went down a tunnel before its body arrived (its request was not sent whole with
/// the RequestInfo) is routed again just the same when the agent refuses the tunnel unread,
/// whether its body went down the refused tunnel too or arrives only afterwards: what the node
/// read of the request is kept until the agent answers.
#[test]
fn a_call_streamed_down_a_refused_tunnel_goes_to_another_tunnel() {
    // A node per case: a tunnel of the last case, parked and then dropped, could take the next
    // case's first call before the node saw it reset.
    for (driver, body_first) in [Driver::IoUring, Driver::Legacy]
        .into_iter()
        .flat_map(|driver| [(driver, true), (driver, false)])
    {
        let node = start_node(driver);
        block_on(async {
            {
                let (mut first_recv, mut first_send) = tunnel_after_one_call(&node).await;
                let (response, mut client) = call_without_body(&node).await;
                let mut reader = TunnelReader::new(LIMIT);
                let first = next_message(&mut first_recv, &mut reader).await;
                assert!(
                    matches!(first, Some(connect_response::Msg::RequestInfo(_))),
                    "{driver}: the call starts before its body: {first:?}"
                );
                let body = encode_message(false, b"streamed");
                if body_first {
                    client.send_data(body.clone(), true).unwrap();
                    let message = next_message(&mut first_recv, &mut reader).await;
                    assert!(matches!(message, Some(connect_response::Msg::Message(_))));
                }
                let (mut recv, mut send, refused) =
                    fake_tunnel(node.agent, descriptor_reusable(true)).await;
                assert_eq!(refused, None);
                first_send.send_reset(h2::Reason::REFUSED_STREAM);
                if !body_first {
                    client.send_data(body, true).unwrap();
                }
                let mut reader = TunnelReader::new(LIMIT);
                let (method, messages) = read_call(&mut recv, &mut reader).await;
                assert_eq!(method, "/test.Echo/Unary", "{driver}");
                assert_eq!(
                    messages,
                    [Bytes::from_static(b"streamed")],
                    "{driver}, body first: {body_first}"
                );
                answer(&mut send, b"pong");
                let (status, message) = grpc_outcome(response).await;
                assert_eq!(status, "0", "{driver}, body first: {body_first}: {message}");
                send.send_reset(h2::Reason::CANCEL);
            }
        });
        still_serves(&node);
    }
}

/// An agent whose call was answered before the call's CloseSend reached it ends the tunnel
/// after its Trailer and reads nothing more (`forward.rs`: `CallEnd::EndTunnel`). A tunnel the
/// node gave back before that end arrived is stale: the next call on it was never read, so it
/// goes to another tunnel instead of failing.
#[test]
fn a_tunnel_the_agent_ended_after_its_call_sends_the_next_call_elsewhere() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let node = start_node(driver);
        block_on(async {
            let (mut first_recv, mut first_send) = tunnel_after_one_call(&node).await;
            // The agent ends the tunnel after the node parked it.
            first_send.send_data(Bytes::new(), true).unwrap();
            monoio::time::sleep(Duration::from_millis(100)).await;
            let call = spawn_unary(&node, b"again");
            // The call went down the ended tunnel first (its RequestInfo, then a reset once the
            // node read the end); nothing reads it there.
            let tried = monoio::time::timeout(Duration::from_secs(5), recv_data(&mut first_recv))
                .await
                .expect("the node tries the parked tunnel");
            assert!(tried.is_some(), "{driver}: {tried:?}");
            let (mut recv, mut send, refused) =
                fake_tunnel(node.agent, descriptor_reusable(true)).await;
            assert_eq!(refused, None, "{driver}");
            let mut reader = TunnelReader::new(LIMIT);
            let (_, messages) = read_call(&mut recv, &mut reader).await;
            assert_eq!(messages, vec![encode_message(false, b"again").slice(5..)]);
            answer(&mut send, b"pong");
            let (status, message) = call.await;
            assert_eq!(status, "0", "{driver}: {message}");
        });
        assert!(node.shared.metrics.routes("retried") >= 1, "{driver}");
        still_serves(&node);
    }
}
