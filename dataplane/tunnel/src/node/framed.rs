//! The private hop's framed calls. Between two nodes that both offer it, a call travels as the
//! tunnel messages the agent will read: the routing node frames the client's call once
//! (RequestInfo from its headers, each message wrapped, CloseSend), and the node holding the
//! agent's tunnel splices those frames into the tunnel and the agent's frames back without
//! decoding them (`wire::splice` only checks where each message ends). The hop's own HTTP/2
//! request carries just the node token, the agent and the deadline, so neither node encodes or
//! decodes the client's metadata a second time. A stream outlives its call (`relays.rs`): the
//! next call for the same agent goes down it, and the holding node answers a stream with one
//! response head and, when it ends, `grpc-status: 0`.
//!
//! Offered per connection: the holding node says so on its 100 Continue (`SPLICE_OFFER`), and
//! the routing node frames the calls that follow on that connection. A node that never says so
//! (an older one, or `tunnel.splice_private_hop: false`) gets calls as plain gRPC requests.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Response};
use prost::Message as _;
use sluice_grpc::transport::{recv_data_held, release, send_data};
use sluice_grpc::Code;
use sluice_proto::tunnel::v1::{connect_request, ConnectRequest};

use super::answer::{grpc_headers, status_headers, Responder};
use super::pumps::{pump_down, pump_up, take_ready_chunks, CallBody, Upload};
use super::relay::{first_frame, run_call, CallHead};
use super::tunnel::TunnelStreams;
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::wire::splice::{CallScanner, Direction, SpliceError};
use crate::wire::TunnelReader;

/// The `:path` of a framed call on the private endpoint.
pub(crate) const SPLICE_PATH: &str = "/sluice.tunnel.v1.Private/Spliced";
/// Set on a holding node's 100 Continue: it takes framed calls on this connection.
pub(crate) const SPLICE_OFFER: http::HeaderName =
    http::HeaderName::from_static("sluice-private-hop");
pub(crate) const SPLICE_OFFER_VALUE: &str = "spliced";

/// The largest tunnel frame passed on: the largest payload plus its wrapper.
fn frame_limit(node: &NodeShared) -> usize {
    node.max_message_bytes.saturating_add(64)
}

fn from_caller(error: SpliceError) -> TunnelError {
    TunnelError::new(ErrorKind::ClientProtocol, format!("framed call: {error}"))
}

fn from_agent(error: SpliceError) -> TunnelError {
    TunnelError::new(ErrorKind::AgentProtocol, error.to_string())
}

/// Holding node: what the routing node sent before the tunnel was used (its first chunk, and
/// often the whole call) goes down the tunnel. A tunnel that broke while idle fails here with
/// `StaleTunnel`, the call unread, as [`super::relay::start_local`] does.
pub(super) async fn start_spliced(
    node: &NodeShared,
    tunnel: &mut TunnelStreams,
    body: &mut CallBody,
) -> Result<(Upload, CallScanner), TunnelError> {
    let mut scanner = CallScanner::new(Direction::ToAgent, frame_limit(node));
    if tunnel.reader.buffered() != 0 {
        // The agent sends nothing before a call's RequestInfo.
        return Err(TunnelError::new(
            ErrorKind::AgentProtocol,
            "bytes before the call",
        ));
    }
    let early = std::mem::take(&mut body.early);
    let upload = Upload::spliced(&early, body.ended);
    for chunk in early {
        let chunk = pass(&mut scanner, chunk, from_caller)?.0;
        send_data(&mut tunnel.send, chunk, false)
            .await
            .map_err(|error| TunnelError::new(ErrorKind::StaleTunnel, error.to_string()))?;
    }
    Ok((upload, scanner))
}

/// `chunk` if all of it belongs to the call, and whether the call ended with it.
fn pass(
    scanner: &mut CallScanner,
    chunk: Bytes,
    error: fn(SpliceError) -> TunnelError,
) -> Result<(Bytes, bool), TunnelError> {
    let scanned = scanner.scan(&chunk).map_err(error)?;
    if scanned.consumed != chunk.len() {
        return Err(error(SpliceError::AfterEnd));
    }
    Ok((chunk, scanned.ended))
}

/// Holding node: relays a started framed call until the agent's last message, both ways as
/// the bytes arrive (credit goes back to each sender once its bytes went on). A tunnel that
/// finished cleanly goes back to the registry, as after a local call. The call's request ends
/// at its CloseSend, not at the end of the stream: the routing node may keep the stream for its
/// next call. `Ok` carries whether both directions ended at a message boundary (the stream can
/// carry another call).
pub(super) async fn relay_spliced(
    node: &Arc<NodeShared>,
    mut tunnel: TunnelStreams,
    started: (&mut Upload, CallScanner),
    call: (&mut CallBody, &mut Responder),
    deadline: Option<Instant>,
    worker: usize,
) -> Result<(Code, bool), TunnelError> {
    let (upload, mut scanner) = started;
    let (body, responder) = call;
    let limit = frame_limit(node);
    let outcome = {
        let up = async {
            while !scanner.ended() && !body.ended {
                let Some(chunk) = recv_data_held(&mut body.body).await else {
                    body.ended = true;
                    break;
                };
                let chunk = chunk.map_err(|_| TunnelError::client_gone())?;
                upload.record(&chunk);
                let size = chunk.len();
                let (chunk, _) = pass(&mut scanner, chunk, from_caller)?;
                send_data(&mut tunnel.send, chunk, false)
                    .await
                    .map_err(super::pumps::send_failed)?;
                release(&mut body.body, size);
            }
            if body.ended {
                // The replay's `ended` is the stream's: a call put back for another tunnel
                // must not end a stream that carries more calls.
                upload.body_ended();
            }
            scanner.finish().map_err(from_caller)
        };
        let down = splice_down(&mut tunnel.recv, responder, limit);
        let (mut up, mut down) = (std::pin::pin!(up), std::pin::pin!(down));
        let outcome = run_call(up.as_mut(), down.as_mut(), deadline).await;
        // The agent answered before the call's CloseSend passed (the tunnel then ends, as the
        // agent ends it): the stream carries a next call only once that CloseSend has come.
        let aligned = match &outcome {
            Ok((_, up_done)) if *up_done => true,
            Ok(_) => {
                let rest = Box::pin(monoio::time::timeout(REQUEST_END_GRACE, up.as_mut()));
                matches!(rest.await, Ok(Ok(())))
            }
            Err(_) => false,
        };
        (outcome, aligned)
    };
    let (outcome, aligned) = outcome;
    super::relay::end_of_call(node, tunnel, outcome, worker).map(|code| (code, aligned))
}

/// Holding node: the agent's frames to the routing node as they arrive, under one fixed
/// response head (sent with the stream's first call). The stream itself ends OK when the relay
/// ends (`end_relay`): a framed stream is a gRPC stream whose messages are tunnel messages.
/// Returns the call's status and whether the agent ended it with a Trailer (not an Error).
async fn splice_down(
    recv: &mut RecvStream,
    responder: &mut Responder,
    limit: usize,
) -> Result<(Code, bool), TunnelError> {
    let mut scanner = CallScanner::new(Direction::FromAgent, limit);
    let mut answered = false;
    loop {
        let next = monoio::select! {
            chunk = recv_data_held(recv) => Some(chunk),
            _ = responder.reset() => None,
        };
        let chunk = match next {
            None => return Err(TunnelError::client_gone()),
            // As in `pump_down`: ended before any answer, the call was never read.
            Some(None) if !answered => return Err(super::pumps::stale_ended()),
            Some(None) => {
                return Err(TunnelError::new(
                    ErrorKind::AgentGone,
                    "the tunnel closed before the call ended",
                ))
            }
            Some(Some(Err(error))) if error.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                return Err(TunnelError::new(ErrorKind::StaleTunnel, error.to_string()))
            }
            Some(Some(Err(error))) => {
                return Err(TunnelError::new(ErrorKind::AgentGone, error.to_string()))
            }
            Some(Some(Ok(chunk))) => chunk,
        };
        let size = chunk.len();
        answered |= size > 0;
        let (chunk, ended) = pass(&mut scanner, chunk, from_agent)?;
        let stream = match responder.stream.as_mut() {
            Some(stream) => stream,
            None => {
                let stream = responder
                    .respond
                    .send_response(grpc_headers(), false)
                    .map_err(|_| TunnelError::client_gone())?;
                responder.stream.insert(stream)
            }
        };
        send_data(stream, chunk, false)
            .await
            .map_err(|_| TunnelError::client_gone())?;
        release(recv, size);
        if ended {
            return Ok(last_status(scanner.terminal()));
        }
    }
}

/// Ends a framed stream whose calls all ended (the routing node ended it or went quiet, the
/// node drains): its own status is OK, each call's is in its agent's last message.
pub(super) fn end_relay(responder: &mut Responder) {
    match responder.stream.as_mut() {
        Some(stream) => {
            let mut trailers = HeaderMap::new();
            status_headers(&mut trailers, Code::Ok, "");
            let _ = stream.send_trailers(trailers);
        }
        None => responder.finish(Code::Ok, ""),
    }
}

/// How long a holding node waits, after the agent's last message, for the routing node's
/// CloseSend of the same call before it gives up carrying further calls on the stream.
const REQUEST_END_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a holding node keeps a framed stream open waiting for the routing node's next call
/// (a routing node keeps one for `RELAY_KEPT`, far less: this only bounds one it forgot).
const RELAY_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Holding node: waits on a kept framed stream for the next call's first bytes (then in
/// `body.early`). `false`: the relay is over (the routing node ended or reset the stream, it
/// stayed quiet for `RELAY_IDLE`, or the connection is closing).
pub(super) async fn next_call(
    body: &mut CallBody,
    responder: &mut Responder,
    closing: &sluice_runtime::Closing,
) -> bool {
    // Boxed: a monoio timer is 640 bytes, 128-byte aligned.
    let mut idle = Box::pin(monoio::time::sleep(RELAY_IDLE));
    loop {
        let next = monoio::select! {
            biased;
            chunk = sluice_grpc::transport::recv_data(&mut body.body) => Some(chunk),
            _ = responder.reset() => None,
            _ = closing.wait() => None,
            _ = &mut idle => None,
        };
        match next {
            // An empty DATA frame (one that only ends the stream, say) starts no call.
            Some(Some(Ok(chunk))) if chunk.is_empty() => {}
            Some(Some(Ok(chunk))) => {
                body.early.push(chunk);
                return true;
            }
            Some(None) => {
                body.ended = true;
                return false;
            }
            Some(Some(Err(_))) | None => return false,
        }
    }
}

/// The status of the agent's last message, and whether it was a Trailer. A last message too
/// large to have been kept counts as UNKNOWN (it still went through whole).
fn last_status(terminal: Option<&[u8]>) -> (Code, bool) {
    let message = terminal.and_then(|bytes| ConnectRequest::decode(bytes).ok());
    match message.and_then(|message| message.msg) {
        Some(connect_request::Msg::Trailer(trailer)) => (Code::from_u32(trailer.grpc_status), true),
        Some(connect_request::Msg::Error(error)) => (Code::from_u32(error.grpc_status), false),
        _ => (Code::Unknown, true),
    }
}

/// Routing node: the client's call, framed once, to the holding node. The stream stays open
/// after CloseSend, for the agent's next call (`relays.rs`). `upload` keeps what of the
/// client's request was taken, should the holding node not take the call after all. On a kept
/// stream (`on_kept`), a first send that fails finds the stream already gone: `StaleTunnel`,
/// nothing sent.
pub(super) async fn frame_up(
    node: &NodeShared,
    head: &CallHead<'_>,
    client: &mut CallBody,
    (upload, peer): (&mut Option<Upload>, &mut SendStream<Bytes>),
    on_kept: bool,
    peer_gone: impl Fn(h2::Error) -> TunnelError + Copy,
) -> Result<(), TunnelError> {
    if !client.ended {
        take_ready_chunks(client).await?;
    }
    let (first, started) = first_frame(node, head, client);
    let up = upload.insert(started);
    send_data(peer, first, false).await.map_err(|error| {
        if on_kept {
            TunnelError::new(ErrorKind::StaleTunnel, error.to_string())
        } else {
            peer_gone(error)
        }
    })?;
    pump_up(up, &mut client.body, peer, node.max_message_bytes)
        .await
        .map_err(|error| match error.kind() {
            // Said of the agent by the pump; here the stream is the holding node's.
            ErrorKind::AgentGone | ErrorKind::StaleTunnel => {
                TunnelError::new(ErrorKind::PeerGone, error.message().to_string())
            }
            _ => error,
        })
}

/// Routing node: the holding node's response head to a framed call on a new stream. Its
/// trailers-only answer (no tunnel after all, or a failure before the agent answered) comes
/// back with its code and message.
pub(super) async fn framed_head(
    response: h2::client::ResponseFuture,
    responder: &mut Responder,
    peer_gone: impl Fn(h2::Error) -> TunnelError,
) -> Result<RecvStream, TunnelError> {
    let response = monoio::select! {
        response = response => response.map_err(&peer_gone)?,
        _ = responder.reset() => return Err(TunnelError::client_gone()),
    };
    let (head, body) = response.into_parts();
    match status_of(&head.headers) {
        Some(code) => Err(peer_status(code, &head.headers)),
        None => Ok(body),
    }
}

/// Routing node: the agent's messages on a framed stream, turned into the client's response as
/// a local tunnel's are. A failure the holding node reports after its head went out comes back
/// with its code and message; a kept stream (`on_kept`) that node ended before this call
/// (its status OK, nothing of the call answered) is `StaleTunnel`: it read none of the call.
pub(super) async fn framed_down(
    node: &NodeShared,
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
    responder: &mut Responder,
    on_kept: bool,
    peer_gone: impl Fn(h2::Error) -> TunnelError,
) -> Result<Code, TunnelError> {
    let relayed = pump_down(
        recv,
        reader,
        responder,
        &node.metrics,
        &node.metadata_limits,
    )
    .await;
    let error = match relayed {
        Ok((code, _)) => return Ok(code),
        Err(error) if matches!(error.kind(), ErrorKind::AgentGone | ErrorKind::StaleTunnel) => {
            // Said of a tunnel by the pump; here the stream is the holding node's.
            TunnelError::new(ErrorKind::PeerGone, error.message().to_string())
        }
        Err(error) => return Err(error),
    };
    if !recv.is_end_stream() {
        // Reset or broken.
        return Err(error);
    }
    // The holding node ended the stream before the agent's last message: its trailers say why.
    let trailers = match std::future::poll_fn(|cx| recv.poll_trailers(cx)).await {
        Ok(Some(trailers)) => trailers,
        Ok(None) => return Err(error),
        Err(broken) => return Err(peer_gone(broken)),
    };
    match status_of(&trailers) {
        Some(Code::Ok) if on_kept && !responder.replied() => Err(TunnelError::new(
            ErrorKind::StaleTunnel,
            "the kept stream was ended before the call",
        )),
        Some(code) => Err(peer_status(code, &trailers)),
        None => Err(error),
    }
}

fn status_of(headers: &HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|value| Code::from_header(value.as_bytes()))
}

/// The holding node's own status for the call, passed to the client as it is.
fn peer_status(code: Code, headers: &HeaderMap) -> TunnelError {
    let message = headers
        .get("grpc-message")
        .map(|value| sluice_grpc::status::decode_message(value.as_bytes()))
        .unwrap_or_default();
    TunnelError::new(ErrorKind::PeerGone, message).with_code(code)
}

/// The response head a holding node's 100 Continue carries when it takes framed calls.
pub(super) fn offer(continue_head: &mut Response<()>) {
    continue_head
        .headers_mut()
        .insert(SPLICE_OFFER, HeaderValue::from_static(SPLICE_OFFER_VALUE));
}

/// Whether a 100 Continue offers framed calls.
pub(super) fn offered(continue_head: &Response<()>) -> bool {
    continue_head
        .headers()
        .get(SPLICE_OFFER)
        .is_some_and(|value| value.as_bytes() == SPLICE_OFFER_VALUE.as_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use sluice_proto::tunnel::v1::{Error, Trailer};

    use super::*;

    #[test]
    fn the_agents_last_message_gives_the_calls_status() {
        let trailer = ConnectRequest {
            msg: Some(connect_request::Msg::Trailer(Trailer {
                grpc_status: 5,
                grpc_message: String::new(),
                metadata: Vec::new(),
            })),
        }
        .encode_to_vec();
        assert_eq!(last_status(Some(&trailer)), (Code::NotFound, true));
        let error = ConnectRequest {
            msg: Some(connect_request::Msg::Error(Error {
                grpc_status: 14,
                message: "down".into(),
            })),
        }
        .encode_to_vec();
        assert_eq!(last_status(Some(&error)), (Code::Unavailable, false));
        assert_eq!(last_status(None), (Code::Unknown, true));
    }

    #[test]
    fn an_offer_is_read_back_only_as_written() {
        let mut head = Response::new(());
        assert!(!offered(&head));
        offer(&mut head);
        assert!(offered(&head));
        head.headers_mut()
            .insert(SPLICE_OFFER, HeaderValue::from_static("other"));
        assert!(!offered(&head));
    }
}
