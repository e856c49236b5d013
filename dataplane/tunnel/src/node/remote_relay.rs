//! Relaying a call another node took: the client's request to it and its answer back, as a
//! plain gRPC request or framed (`framed.rs`); and why a node called directly did not take it.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::time::Instant;

use bytes::Bytes;
use h2::RecvStream;
use http::{HeaderMap, Response};
use sluice_grpc::transport::{recv_data, recv_data_held, release, send_data};
use sluice_grpc::Code;

use super::answer::Responder;
use super::framed::{frame_up, framed_down, framed_head, offered};
use super::pumps::{CallBody, Upload};
use super::relay::{in_call_to, run_call, CallHead};
use super::relays::RelayStream;
use super::remote::{PeerAnswer, RemoteCall, RemoteRouting};
use super::route::{Peer, RouteEvent};
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::registry::AgentId;
use crate::wire::TunnelReader;

/// Why a call sent directly to one node ended before that node confirmed a tunnel: routing
/// decides what follows (`RouteEvent::Unconfirmed`, `Expired`, `ClientReset`).
pub(super) enum Unconfirmed {
    /// The call's wait for a tunnel ended first.
    Expired,
    /// The client reset the call.
    ClientReset,
    /// The node answered without a tunnel, or its stream broke; `forwarded`: whether any byte
    /// of the client's request was taken for it (then the call cannot go elsewhere).
    Refused {
        peer: Peer,
        error: TunnelError,
        forwarded: bool,
    },
}

impl Unconfirmed {
    pub(super) fn event(&self) -> RouteEvent<'_> {
        match self {
            Unconfirmed::Expired => RouteEvent::Expired,
            Unconfirmed::ClientReset => RouteEvent::ClientReset,
            Unconfirmed::Refused {
                peer,
                error,
                forwarded,
            } => RouteEvent::Unconfirmed {
                peer,
                error: error.clone(),
                forwarded: *forwarded,
            },
        }
    }
}

/// Relays a call another node took: client request to it, its answer back, as a plain gRPC
/// request or framed (`framed.rs`) when that node offered it. A call sent directly (not
/// confirmed yet) streams its body at once and waits, until `until`, for the node's 100
/// Continue; before it the call is still being routed, and ends as `Unconfirmed`. A framed
/// call that ends cleanly leaves its stream in `remote`'s pool for the agent's next call.
pub(super) async fn relay_remote(
    node: &NodeShared,
    remote: Option<&RemoteRouting>,
    head: &CallHead<'_>,
    call: RemoteCall,
    client: &mut CallBody,
    responder: &mut Responder,
    until: Instant,
) -> Result<Result<Code, TunnelError>, Unconfirmed> {
    let RemoteCall {
        node: peer_name,
        address,
        answer,
        send: mut peer_send,
        confirmed,
        framed,
        offers,
    } = call;
    let (agent, deadline) = (head.agent, head.deadline);
    let on_kept = matches!(answer, PeerAnswer::Kept(..));
    tracing::trace!(agent, node = %peer_name, confirmed, framed, on_kept, "relaying through another node");
    let peer_gone = move |error: h2::Error| {
        TunnelError::new(ErrorKind::PeerGone, format!("node {address}: {error}"))
    };
    let forwarded = Cell::new(false);
    let confirmed = Cell::new(confirmed);
    let mut upload = None;
    let mut kept = None;
    let outcome = {
        let up = async {
            if framed {
                let up = (&mut upload, &mut peer_send);
                return frame_up(node, head, client, up, on_kept, peer_gone).await;
            }
            plain_up(client, &mut peer_send, &forwarded, peer_gone).await
        };
        let hop = Hop {
            framed,
            on_kept,
            until,
            confirmed: &confirmed,
            offers: &offers,
        };
        let down = remote_answer(node, hop, answer, responder, &mut kept, peer_gone);
        let up = std::pin::pin!(up);
        let down = std::pin::pin!(down);
        run_call(up, down, deadline).await
    };
    // On a kept stream the node had already ended, none of the call was read.
    let stale = matches!(&outcome, Err(error) if on_kept
        && error.kind() == ErrorKind::StaleTunnel
        && !responder.replied());
    if let Some(upload) = upload {
        forwarded.set(framed_request_taken(upload, stale, client));
    }
    let unconfirmed = |why: UnconfirmedWhy| match why {
        UnconfirmedWhy::Expired => Unconfirmed::Expired,
        UnconfirmedWhy::Refused(why) if ends_the_wait(&why, forwarded.get()) => {
            Unconfirmed::Expired
        }
        UnconfirmedWhy::ClientReset => Unconfirmed::ClientReset,
        UnconfirmedWhy::Refused(why) => Unconfirmed::Refused {
            error: TunnelError::new(
                ErrorKind::PeerUnavailable,
                format!("node {peer_name} ({address}): {why}"),
            )
            .with_code(why.code()),
            peer: (peer_name.clone(), address),
            forwarded: forwarded.get(),
        },
    };
    match outcome {
        Ok((Ok(code), up_done)) => {
            if framed {
                let stream = kept.map(|(recv, reader)| RelayStream {
                    node: peer_name.clone(),
                    address,
                    send: peer_send,
                    recv,
                    reader,
                    offers,
                });
                keep_or_end(remote, agent, stream, up_done);
            }
            Ok(Ok(code))
        }
        Ok((Err(why), _)) => {
            peer_send.send_reset(h2::Reason::CANCEL);
            Err(unconfirmed(why))
        }
        Err(error) => {
            peer_send.send_reset(h2::Reason::CANCEL);
            if stale || !confirmed.get() {
                // Before the node confirmed its tunnel (or on a kept stream it had ended) the
                // call is still being routed: it ends as a race that found nobody would (the
                // deadline, the client, the node failing).
                Err(unconfirmed(UnconfirmedWhy::of(&error)))
            } else {
                Ok(Err(in_call_to(agent, error)))
            }
        }
    }
}

/// How a remote call's answer is awaited.
struct Hop<'a> {
    framed: bool,
    /// On a stream kept from an earlier call: no head to wait for.
    on_kept: bool,
    /// When an unconfirmed call's wait for the node's 100 Continue ends.
    until: Instant,
    confirmed: &'a Cell<bool>,
    /// The connection's flag, set when the 100 Continue offers framed calls.
    offers: &'a Cell<bool>,
}

/// Peer -> client: the node's 100 Continue when still due, then its answer, plain or framed. A
/// framed stream's receiving half and reader are left in `kept`, for the stream's next call.
async fn remote_answer(
    node: &NodeShared,
    hop: Hop<'_>,
    answer: PeerAnswer,
    responder: &mut Responder,
    kept: &mut Option<(RecvStream, TunnelReader)>,
    peer_gone: impl Fn(h2::Error) -> TunnelError + Copy,
) -> Result<Result<Code, UnconfirmedWhy>, TunnelError> {
    let (recv, reader) = match answer {
        PeerAnswer::Kept(recv, reader) => kept.insert((recv, reader)),
        PeerAnswer::Pending(mut response) => {
            if !hop.confirmed.get() {
                match confirmation(&mut response, hop.until, responder, hop.offers).await {
                    Ok(()) => hop.confirmed.set(true),
                    Err(why) => return Ok(Err(why)),
                }
            }
            if !hop.framed {
                return pass_remote_answer(response, responder, peer_gone)
                    .await
                    .map(Ok);
            }
            let recv = framed_head(response, responder, peer_gone).await?;
            let reader =
                TunnelReader::with_budget(node.max_message_bytes, node.buffer_budget.clone());
            kept.insert((recv, reader))
        }
    };
    framed_down(node, recv, reader, responder, hop.on_kept, peer_gone)
        .await
        .map(Ok)
}

/// Whether a framed call's request is the node's now. As for a plain call, once any byte of
/// it went to the node the call cannot go elsewhere (that node may have passed it on), unless
/// it went down a kept stream the node had already ended (`stale`): then it is put back in
/// `client` when it was kept whole.
fn framed_request_taken(upload: Upload, stale: bool, client: &mut CallBody) -> bool {
    if stale && upload.replayable() {
        upload.restore(&mut client.early, &mut client.ended);
        return false;
    }
    upload.took_any()
}

/// Client -> peer for a plain call: DATA as it arrives (the peer's node checks the framing).
async fn plain_up(
    client: &mut CallBody,
    peer_send: &mut h2::SendStream<Bytes>,
    forwarded: &Cell<bool>,
    peer_gone: impl Fn(h2::Error) -> TunnelError + Copy,
) -> Result<(), TunnelError> {
    // Chunks read before this route (a tunnel that broke before taking them).
    for chunk in std::mem::take(&mut client.early) {
        forwarded.set(true);
        send_data(peer_send, chunk, false)
            .await
            .map_err(peer_gone)?;
    }
    if !client.ended {
        // Credit goes back to the client only once its bytes went on to the peer node.
        while let Some(chunk) = recv_data_held(&mut client.body).await {
            let chunk = chunk.map_err(|_| TunnelError::client_gone())?;
            let size = chunk.len();
            // Counted as soon as it left the client's stream: a chunk taken but not sent
            // is lost to any other route as well.
            forwarded.set(true);
            send_data(peer_send, chunk, false)
                .await
                .map_err(peer_gone)?;
            release(&mut client.body, size);
        }
    }
    send_data(peer_send, Bytes::new(), true)
        .await
        .map_err(peer_gone)
}

/// After a framed call that ended well: its stream is kept for the agent's next call when it
/// ended at a message boundary both ways, else reset (the holding node then resets the
/// agent's side); a clean one the pool has no room for is ended.
fn keep_or_end(
    remote: Option<&RemoteRouting>,
    agent: AgentId,
    stream: Option<RelayStream>,
    up_done: bool,
) {
    let Some(mut stream) = stream else {
        return;
    };
    let clean = up_done && stream.reader.buffered() == 0 && !stream.recv.is_end_stream();
    if !clean {
        stream.send.send_reset(h2::Reason::CANCEL);
        return;
    }
    let refused = match remote {
        Some(remote) => remote.relays.keep(agent, stream),
        None => Some(stream),
    };
    if let Some(mut stream) = refused {
        let _ = stream.send.send_data(Bytes::new(), true);
    }
}

/// `Unconfirmed` before the call's peer and progress are added.
enum UnconfirmedWhy {
    Expired,
    ClientReset,
    Refused(RefusedWhy),
}

/// Why a node did not confirm a tunnel.
#[derive(Debug, thiserror::Error)]
enum RefusedWhy {
    #[error("answered {0} {1:?} without a tunnel")]
    Answered(Code, String),
    #[error("unexpected {0}")]
    Unexpected(http::StatusCode),
    #[error("{0}")]
    Failed(String),
}

impl UnconfirmedWhy {
    /// A failure before the node confirmed: the deadline, the client, or the node.
    fn of(error: &TunnelError) -> Self {
        match error.kind() {
            ErrorKind::DeadlineExceeded => UnconfirmedWhy::Expired,
            ErrorKind::ClientGone => UnconfirmedWhy::ClientReset,
            _ => UnconfirmedWhy::Refused(RefusedWhy::Failed(error.message().to_string())),
        }
    }
}

/// Whether a node's answer without a tunnel ends the call as this node's own wait running out
/// would. A node answers DEADLINE_EXCEEDED when its wait for a tunnel ran out; sent the call
/// directly, it started that wait as this node's wait went on, so the two end together and
/// either timer may fire first (a busy node's later). A call whose request went to it cannot go
/// elsewhere, so it ends the same way both times: as a wait that ran out (`RouteEvent::Expired`),
/// not with the other node's words. One that sent nothing is routed again as any refusal is.
fn ends_the_wait(why: &RefusedWhy, forwarded: bool) -> bool {
    forwarded && matches!(why, RefusedWhy::Answered(Code::DeadlineExceeded, _))
}

impl RefusedWhy {
    /// The code a client gets when the call cannot be routed again: the node's own answer,
    /// UNAVAILABLE otherwise.
    fn code(&self) -> Code {
        match self {
            RefusedWhy::Answered(code, _) => *code,
            _ => Code::Unavailable,
        }
    }
}

/// Waits until the node a call was sent to directly reports its tunnel (100 Continue; the
/// private endpoint sends it before it uses a tunnel), answers without one, or `until`.
async fn confirmation(
    response: &mut h2::client::ResponseFuture,
    until: Instant,
    responder: &mut Responder,
    offers: &Cell<bool>,
) -> Result<(), UnconfirmedWhy> {
    let informational = monoio::select! {
        informational = poll_fn(|cx| response.poll_informational(cx)) => informational,
        _ = Box::pin(monoio::time::sleep_until(until.into())) => return Err(UnconfirmedWhy::Expired),
        _ = responder.reset() => return Err(UnconfirmedWhy::ClientReset),
    };
    let refused = |why| Err(UnconfirmedWhy::Refused(why));
    match informational {
        Some(Ok(info)) if info.status() == http::StatusCode::CONTINUE => {
            if offered(&info) {
                offers.set(true);
            }
            Ok(())
        }
        Some(Ok(info)) => refused(RefusedWhy::Unexpected(info.status())),
        Some(Err(error)) => refused(RefusedWhy::Failed(error.to_string())),
        // A final answer without a tunnel (none in time, refused, shutting down, ...).
        None => match poll_fn(|cx| Pin::new(&mut *response).poll(cx)).await {
            Ok(answer) => {
                let headers = answer.headers();
                let code = headers
                    .get("grpc-status")
                    .map_or(Code::Unknown, |value| Code::from_header(value.as_bytes()));
                let message = headers
                    .get("grpc-message")
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                refused(RefusedWhy::Answered(code, message))
            }
            Err(error) => refused(RefusedWhy::Failed(error.to_string())),
        },
    }
}

/// The answering node's response, headers to trailers, to the client.
async fn pass_remote_answer(
    response: h2::client::ResponseFuture,
    responder: &mut Responder,
    peer_gone: impl Fn(h2::Error) -> TunnelError,
) -> Result<Code, TunnelError> {
    let response = monoio::select! {
        response = response => response.map_err(&peer_gone)?,
        _ = responder.reset() => return Err(TunnelError::client_gone()),
    };
    let (head, mut body) = response.into_parts();
    let code_of = |headers: &HeaderMap| {
        headers
            .get("grpc-status")
            .map_or(Code::Unknown, |value| Code::from_header(value.as_bytes()))
    };
    let trailers_only = head.headers.contains_key("grpc-status");
    let mut forwarded = Response::new(());
    *forwarded.headers_mut() = head.headers.clone();
    if trailers_only {
        let _ = responder.respond.send_response(forwarded, true);
        return Ok(code_of(&head.headers));
    }
    let stream = responder
        .respond
        .send_response(forwarded, false)
        .map_err(|_| TunnelError::client_gone())?;
    let stream = responder.stream.insert(stream);
    loop {
        let next = monoio::select! {
            chunk = recv_data(&mut body) => Some(chunk),
            _ = poll_fn(|cx| stream.poll_reset(cx)) => None,
        };
        match next {
            None => return Err(TunnelError::client_gone()),
            Some(None) => break,
            Some(Some(Ok(chunk))) => send_data(stream, chunk, false)
                .await
                .map_err(|_| TunnelError::client_gone())?,
            Some(Some(Err(error))) => return Err(peer_gone(error)),
        }
    }
    let trailers = poll_fn(|cx| body.poll_trailers(cx))
        .await
        .map_err(&peer_gone)?
        .unwrap_or_default();
    let code = code_of(&trailers);
    let _ = stream.send_trailers(trailers);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_forwarded_call_whose_node_ran_out_of_wait_ends_as_its_own_wait() {
        let ran_out = RefusedWhy::Answered(Code::DeadlineExceeded, "no free tunnel".into());
        assert!(ends_the_wait(&ran_out, true));
        // Nothing of the request went there: routed again, within this node's wait.
        assert!(!ends_the_wait(&ran_out, false));
        let draining = RefusedWhy::Answered(Code::Unavailable, "shutting down".into());
        assert!(!ends_the_wait(&draining, true));
        let broke = RefusedWhy::Failed("stream reset".into());
        assert!(!ends_the_wait(&broke, true));
    }
}
