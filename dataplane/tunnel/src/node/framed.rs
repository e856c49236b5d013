//! The private hop's framed calls. Between two nodes that both offer it, a call travels as the
//! tunnel messages the agent will read: the routing node frames the client's call once
//! (RequestInfo from its headers, each message wrapped, CloseSend), and the node holding the
//! agent's tunnel splices those frames into the tunnel and the agent's frames back without
//! decoding them (`wire::splice` only checks where each message ends). The hop's own HTTP/2
//! request carries just the node token, the agent and the deadline, so neither node encodes or
//! decodes the client's metadata a second time, and the holding node answers with one fixed
//! response head and `grpc-status: 0` (both indexed by HPACK after the first call).
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
/// finished cleanly goes back to the registry, as after a local call.
pub(super) async fn relay_spliced(
    node: &Arc<NodeShared>,
    mut tunnel: TunnelStreams,
    started: (&mut Upload, CallScanner),
    call: (&mut CallBody, &mut Responder),
    deadline: Option<Instant>,
    worker: usize,
) -> Result<Code, TunnelError> {
    let (upload, mut scanner) = started;
    let (body, responder) = call;
    let limit = frame_limit(node);
    let outcome = {
        let up = async {
            if !body.ended {
                while let Some(chunk) = recv_data_held(&mut body.body).await {
                    let chunk = chunk.map_err(|_| TunnelError::client_gone())?;
                    upload.record(&chunk);
                    let size = chunk.len();
                    let (chunk, _) = pass(&mut scanner, chunk, from_caller)?;
                    send_data(&mut tunnel.send, chunk, false)
                        .await
                        .map_err(super::pumps::send_failed)?;
                    release(&mut body.body, size);
                }
            }
            upload.body_ended();
            scanner.finish().map_err(from_caller)
        };
        let down = splice_down(&mut tunnel.recv, responder, limit);
        let (up, down) = (std::pin::pin!(up), std::pin::pin!(down));
        run_call(up, down, deadline).await
    };
    super::relay::end_of_call(node, tunnel, outcome, worker)
}

/// Holding node: the agent's frames to the routing node as they arrive, under one fixed
/// response head; after the last one the hop's stream ends OK (a framed call is a gRPC
/// stream whose messages are tunnel messages). Returns the call's status and whether the
/// agent ended it with a Trailer (not an Error).
async fn splice_down(
    recv: &mut RecvStream,
    responder: &mut Responder,
    limit: usize,
) -> Result<(Code, bool), TunnelError> {
    let mut scanner = CallScanner::new(Direction::FromAgent, limit);
    loop {
        let next = monoio::select! {
            chunk = recv_data_held(recv) => Some(chunk),
            _ = responder.reset() => None,
        };
        let chunk = match next {
            None => return Err(TunnelError::client_gone()),
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
            // The hop's own gRPC status: it carried the call (whose status is in the agent's
            // last message).
            let mut trailers = HeaderMap::new();
            status_headers(&mut trailers, Code::Ok, "");
            let _ = stream.send_trailers(trailers);
            return Ok(last_status(scanner.terminal()));
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

/// Routing node: the client's call, framed once, to the holding node, whose stream ends after
/// CloseSend. `upload` keeps what of the client's request was taken, should the holding node
/// not take the call after all.
pub(super) async fn frame_up(
    node: &NodeShared,
    head: &CallHead<'_>,
    client: &mut CallBody,
    upload: &mut Option<Upload>,
    peer: &mut SendStream<Bytes>,
    peer_gone: impl Fn(h2::Error) -> TunnelError,
) -> Result<(), TunnelError> {
    if !client.ended {
        take_ready_chunks(client).await?;
    }
    let (first, started) = first_frame(node, head, client);
    let up = upload.insert(started);
    if up.sent {
        // RequestInfo, the messages and CloseSend in one frame that ends the hop's stream.
        return send_data(peer, first, true).await.map_err(peer_gone);
    }
    send_data(peer, first, false).await.map_err(&peer_gone)?;
    pump_up(up, &mut client.body, peer, node.max_message_bytes)
        .await
        .map_err(|error| match error.kind() {
            // Said of the agent by the pump; here the stream is the holding node's.
            ErrorKind::AgentGone | ErrorKind::StaleTunnel => {
                TunnelError::new(ErrorKind::PeerGone, error.message().to_string())
            }
            _ => error,
        })?;
    send_data(peer, Bytes::new(), true).await.map_err(peer_gone)
}

/// Routing node: the holding node's answer to a framed call, turned into the client's
/// response as a local tunnel's messages are. Its trailers-only answer (no tunnel after all, or
/// a failure before the agent answered) and a failure it reports after its head went out come
/// back with its code and message.
pub(super) async fn framed_answer(
    node: &NodeShared,
    response: h2::client::ResponseFuture,
    responder: &mut Responder,
    peer_gone: impl Fn(h2::Error) -> TunnelError,
) -> Result<Code, TunnelError> {
    let response = monoio::select! {
        response = response => response.map_err(&peer_gone)?,
        _ = responder.reset() => return Err(TunnelError::client_gone()),
    };
    let (head, mut body) = response.into_parts();
    if let Some(code) = status_of(&head.headers) {
        return Err(peer_status(code, &head.headers));
    }
    let mut reader = TunnelReader::with_budget(node.max_message_bytes, node.buffer_budget.clone());
    let relayed = pump_down(
        &mut body,
        &mut reader,
        responder,
        &node.metrics,
        &node.metadata_limits,
    )
    .await;
    match relayed {
        Ok((code, _)) => Ok(code),
        // The holding node ended its stream before the agent's last message: its trailers say
        // why.
        Err(error) if error.kind() == ErrorKind::AgentGone && body.is_end_stream() => {
            let trailers = std::future::poll_fn(|cx| body.poll_trailers(cx)).await;
            match trailers {
                Ok(Some(trailers)) => match status_of(&trailers) {
                    Some(code) => Err(peer_status(code, &trailers)),
                    None => Err(error),
                },
                Ok(None) => Err(error),
                Err(broken) => Err(peer_gone(broken)),
            }
        }
        Err(error) if error.kind() == ErrorKind::AgentGone => Err(TunnelError::new(
            ErrorKind::PeerGone,
            error.message().to_string(),
        )),
        Err(error) => Err(error),
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
