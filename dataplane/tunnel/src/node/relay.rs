//! Relaying a routed call: down a local tunnel, or through the node that won the race. Errors
//! come back as [`TunnelError`]s for the endpoint to answer.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use http::{HeaderMap, Response};
use sluice_grpc::transport::{recv_data, recv_data_held, release, send_data};
use sluice_grpc::{encode_timeout, Code};

use super::answer::{status_headers, Responder};
use super::framed::{frame_up, framed_answer, offered};
use super::pumps::{
    pump_down, pump_up, take_ready_chunks, whole_request, CallBody, Replay, Upload,
};
use super::remote::RemoteCall;
use super::route::{Peer, RouteEvent};
use super::tunnel::{give_back, TunnelStreams};
use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};
use crate::protocol::GRPC_TIMEOUT;
use crate::registry::AgentId;
use crate::wire::{request_info_frame_into, HeaderMetadata};

/// What a call sends down a tunnel first: its RequestInfo, encoded from the client's method
/// and headers in place for each tunnel the call tries (nothing is copied beforehand).
pub(super) struct CallHead<'a> {
    method: &'a str,
    headers: &'a HeaderMap,
    pub(super) agent: AgentId,
    pub(super) deadline: Option<Instant>,
}

impl<'a> CallHead<'a> {
    /// `headers`: the client's (hop headers are left out when encoding).
    pub(super) fn new(
        method: &'a str,
        headers: &'a HeaderMap,
        agent: AgentId,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            method,
            headers,
            agent,
            deadline,
        }
    }

    /// The RequestInfo frame as of now: the remaining deadline travels with the call so the
    /// backend sees it too.
    fn frame(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.frame_into(&mut out);
        out.freeze()
    }

    /// [`Self::frame`], appended to `out`.
    fn frame_into(&self, out: &mut BytesMut) {
        let metadata = HeaderMetadata::of(self.headers);
        let Some(deadline) = self.deadline else {
            return request_info_frame_into(out, self.method, &metadata);
        };
        let remaining = encode_timeout(deadline.saturating_duration_since(Instant::now()));
        let metadata = metadata.with_entry(GRPC_TIMEOUT, remaining.as_bytes());
        request_info_frame_into(out, self.method, &metadata);
    }
}

/// Sends the call's RequestInfo (with the request itself when it already arrived whole) down
/// a tunnel. A tunnel that broke while idle fails here with `StaleTunnel`, before the client
/// saw anything; the body read so far stays in `body` for the next tunnel.
pub(super) async fn start_local(
    node: &NodeShared,
    tunnel: &mut TunnelStreams,
    head: &CallHead<'_>,
    body: &mut CallBody,
) -> Result<Upload, TunnelError> {
    // A unary request usually arrived whole with its headers: then RequestInfo, its messages
    // and CloseSend go down the tunnel as one DATA frame.
    if !body.ended {
        take_ready_chunks(body).await?;
    }
    let (first, upload) = first_frame(node, head, body);
    send_data(&mut tunnel.send, first, false)
        .await
        .map_err(|error| TunnelError::new(ErrorKind::StaleTunnel, error.to_string()))?;
    Ok(upload)
}

/// The first bytes of a call's tunnel messages: its RequestInfo, with the whole request and
/// CloseSend when the client's body already ended (then `Upload::sent`, and the body's chunks
/// stay in `body.early`); otherwise the chunks read so far move to the upload.
pub(super) fn first_frame(
    node: &NodeShared,
    head: &CallHead<'_>,
    body: &mut CallBody,
) -> (Bytes, Upload) {
    let whole = body
        .ended
        .then(|| {
            whole_request(
                |out| head.frame_into(out),
                &body.early,
                node.max_message_bytes,
            )
        })
        .flatten();
    let sent = whole.is_some();
    let first = match whole {
        Some(whole) => whole,
        None => head.frame(),
    };
    let (early, replay) = if sent {
        (Vec::new(), Replay::default())
    } else {
        let replay = Replay::of(&body.early);
        (std::mem::take(&mut body.early), replay)
    };
    let upload = Upload {
        early,
        sent,
        replay,
    };
    (first, upload)
}

/// Relays a started call through a local tunnel until the agent's status; a tunnel that
/// finished cleanly goes back to the registry for the next call.
pub(super) async fn relay_local(
    node: &Arc<NodeShared>,
    mut tunnel: TunnelStreams,
    up: &mut Upload,
    call: (&mut RecvStream, &mut Responder),
    deadline: Option<Instant>,
    worker: usize,
) -> Result<Code, TunnelError> {
    let (client_body, responder) = call;
    let outcome = {
        let up = std::pin::pin!(pump_up(
            up,
            client_body,
            &mut tunnel.send,
            node.max_message_bytes
        ));
        let down = std::pin::pin!(pump_down(
            &mut tunnel.recv,
            &mut tunnel.reader,
            responder,
            &node.metrics,
            &node.metadata_limits,
        ));
        run_call(up, down, deadline).await
    };
    end_of_call(node, tunnel, outcome, worker)
}

/// What a tunnel becomes after its call: back in the registry for the next call when both
/// sides finished cleanly (the agent then waits for the next RequestInfo on this stream),
/// closed properly when the call ended otherwise, reset when the call failed.
pub(super) fn end_of_call(
    node: &Arc<NodeShared>,
    mut tunnel: TunnelStreams,
    outcome: Result<((Code, bool), bool), TunnelError>,
    worker: usize,
) -> Result<Code, TunnelError> {
    let agent = tunnel.agent;
    match outcome {
        Ok(((code, ended_with_trailer), up_finished)) => {
            if tunnel.reusable && ended_with_trailer && up_finished && tunnel.reader.buffered() == 0
            {
                node.metrics.tunnels_reused.inc(worker);
                give_back(node, tunnel);
            } else {
                // Close the tunnel's Connect call properly; the agent opens a fresh tunnel.
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, Code::Ok, "");
                let _ = tunnel.send.send_trailers(trailers);
            }
            Ok(code)
        }
        Err(error) => {
            // Whatever went wrong, the agent's side of this call is cancelled.
            tunnel.send.send_reset(h2::Reason::CANCEL);
            Err(in_call_to(agent, error))
        }
    }
}

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
/// Continue; before it the call is still being routed, and ends as `Unconfirmed`.
pub(super) async fn relay_remote(
    node: &NodeShared,
    head: &CallHead<'_>,
    call: RemoteCall,
    client: &mut CallBody,
    responder: &mut Responder,
    until: Instant,
) -> Result<Result<Code, TunnelError>, Unconfirmed> {
    let RemoteCall {
        node: peer_name,
        address,
        mut response,
        send: mut peer_send,
        confirmed,
        framed,
        offers,
    } = call;
    let (agent, deadline) = (head.agent, head.deadline);
    tracing::trace!(agent, node = %peer_name, confirmed, framed, "relaying through another node");
    let peer_gone = move |error: h2::Error| {
        TunnelError::new(ErrorKind::PeerGone, format!("node {address}: {error}"))
    };
    let forwarded = Cell::new(false);
    let confirmed = Cell::new(confirmed);
    let mut upload = None;
    // Client -> peer: DATA as it arrives (the peer's node checks the framing).
    let up = async {
        if framed {
            return frame_up(node, head, client, &mut upload, &mut peer_send, peer_gone).await;
        }
        // Chunks read before this route (a tunnel that broke before taking them).
        for chunk in std::mem::take(&mut client.early) {
            forwarded.set(true);
            send_data(&mut peer_send, chunk, false)
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
                send_data(&mut peer_send, chunk, false)
                    .await
                    .map_err(peer_gone)?;
                release(&mut client.body, size);
            }
        }
        send_data(&mut peer_send, Bytes::new(), true)
            .await
            .map_err(peer_gone)
    };
    let down = async {
        if !confirmed.get() {
            match confirmation(&mut response, until, responder, &offers).await {
                Ok(()) => confirmed.set(true),
                Err(why) => return Ok(Err(why)),
            }
        }
        let answered = if framed {
            framed_answer(node, response, responder, peer_gone).await
        } else {
            pass_remote_answer(response, responder, peer_gone).await
        };
        answered.map(Ok)
    };
    let outcome = {
        let up = std::pin::pin!(up);
        let down = std::pin::pin!(down);
        run_call(up, down, deadline).await
    };
    // As for a plain call: once any byte of the request went to the node, the call cannot go
    // elsewhere (that node may have passed it on).
    if upload.as_ref().is_some_and(Upload::took_any) {
        forwarded.set(true);
    }
    let unconfirmed = |why: UnconfirmedWhy| match why {
        UnconfirmedWhy::Expired => Unconfirmed::Expired,
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
        Ok((Ok(code), _)) => Ok(Ok(code)),
        Ok((Err(why), _)) => {
            peer_send.send_reset(h2::Reason::CANCEL);
            Err(unconfirmed(why))
        }
        Err(error) if !confirmed.get() => {
            // Before the node confirmed its tunnel the call is still being routed: it ends as
            // a race that found nobody would (the deadline, the client, the node failing).
            peer_send.send_reset(h2::Reason::CANCEL);
            Err(unconfirmed(match error.kind() {
                ErrorKind::DeadlineExceeded => UnconfirmedWhy::Expired,
                ErrorKind::ClientGone => UnconfirmedWhy::ClientReset,
                _ => UnconfirmedWhy::Refused(RefusedWhy::Failed(error.message().to_string())),
            }))
        }
        Err(error) => {
            peer_send.send_reset(h2::Reason::CANCEL);
            Ok(Err(in_call_to(agent, error)))
        }
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

/// Names the agent in the message of a call that failed while relaying.
fn in_call_to(agent: AgentId, error: TunnelError) -> TunnelError {
    let code = error.code();
    let message = match error.kind() {
        ErrorKind::DeadlineExceeded => format!("deadline exceeded in a call to agent {agent}"),
        ErrorKind::AgentGone => format!(
            "agent {agent} went away in the middle of the call: {}",
            error.message()
        ),
        ErrorKind::AgentProtocol => format!(
            "agent {agent} broke the tunnel protocol: {}",
            error.message()
        ),
        ErrorKind::PeerGone => format!("agent {agent} via {}", error.message()),
        _ => return error,
    };
    TunnelError::new(error.kind(), message).with_code(code)
}

/// Runs the request pump and the response pump of one call together. The call ends when the
/// response pump does (a server may answer before the request ends) or when the request pump
/// fails, or at the deadline. `Ok` carries whether the request pump had finished too.
///
/// The pumps are pinned by the caller and the deadline's timer is boxed: a call's future is
/// moved (copied) at every level of `.await`, and a pump held here by value, or a timer (640
/// bytes, 128-byte aligned), would be copied along with it on every call.
pub(super) async fn run_call<T, U, D>(
    mut up: Pin<&mut U>,
    mut down: Pin<&mut D>,
    deadline: Option<Instant>,
) -> Result<(T, bool), TunnelError>
where
    U: Future<Output = Result<(), TunnelError>>,
    D: Future<Output = Result<T, TunnelError>>,
{
    let mut expired = deadline.map(|at| Box::pin(monoio::time::sleep_until(at.into())));
    let expired = poll_fn(|cx| match expired.as_mut() {
        Some(sleep) => sleep.as_mut().poll(cx),
        None => Poll::Pending,
    });
    let mut expired = std::pin::pin!(expired);
    let mut up_done = false;
    loop {
        monoio::select! {
            // The answer wins over a deadline that passed at the same poll.
            biased;
            received = down.as_mut() => {
                // The request pump may be finished without having been polled since (a
                // request sent whole before the relay started): ask it once more.
                if !up_done {
                    let polled = poll_fn(|cx| Poll::Ready(up.as_mut().poll(cx))).await;
                    up_done = matches!(polled, Poll::Ready(Ok(())));
                }
                return received.map(|value| (value, up_done));
            }
            sent = up.as_mut(), if !up_done => match sent {
                Ok(()) => up_done = true,
                Err(error) => return Err(error),
            },
            () = expired.as_mut() => return Err(TunnelError::new(ErrorKind::DeadlineExceeded, "")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::super::test_node::run;
    use super::*;

    #[test]
    fn relay_failures_name_the_agent_and_keep_their_code() {
        let gone = in_call_to(7, TunnelError::new(ErrorKind::AgentGone, "stream reset"));
        assert_eq!(gone.code(), Code::Unavailable);
        assert_eq!(
            gone.message(),
            "agent 7 went away in the middle of the call: stream reset"
        );
        let broke = in_call_to(
            7,
            TunnelError::new(ErrorKind::AgentProtocol, "a second Header"),
        );
        assert_eq!(broke.code(), Code::Internal);
        assert_eq!(
            broke.message(),
            "agent 7 broke the tunnel protocol: a second Header"
        );
        let via = in_call_to(
            7,
            TunnelError::new(ErrorKind::PeerGone, "node 10.0.0.2:2: reset"),
        );
        assert_eq!(via.message(), "agent 7 via node 10.0.0.2:2: reset");
        let late = in_call_to(7, TunnelError::new(ErrorKind::DeadlineExceeded, ""));
        assert_eq!(late.code(), Code::DeadlineExceeded);
        assert_eq!(late.message(), "deadline exceeded in a call to agent 7");
        let framing = TunnelError::new(ErrorKind::ClientProtocol, "request: too big")
            .with_code(Code::ResourceExhausted);
        assert_eq!(
            in_call_to(7, framing.clone()),
            framing,
            "client errors stay as they are"
        );
    }

    #[test]
    fn a_call_ends_with_the_response_even_if_the_request_is_still_open() {
        run(async {
            let up = std::pin::pin!(std::future::pending::<Result<(), TunnelError>>());
            let down = std::pin::pin!(async { Ok::<_, TunnelError>(Code::Ok) });
            let (code, up_finished) = run_call(up, down, None).await.unwrap();
            assert_eq!(code, Code::Ok);
            assert!(!up_finished);
            let up = std::pin::pin!(async { Ok::<(), TunnelError>(()) });
            let down = std::pin::pin!(async { Ok::<_, TunnelError>(Code::NotFound) });
            assert_eq!(
                run_call(up, down, None).await.unwrap(),
                (Code::NotFound, true)
            );
        });
    }

    #[test]
    fn a_failed_request_or_a_passed_deadline_ends_the_call() {
        run(async {
            let up = std::pin::pin!(async { Err::<(), _>(TunnelError::client_gone()) });
            let down = std::pin::pin!(std::future::pending::<Result<Code, TunnelError>>());
            let error = run_call(up, down, None).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::ClientGone);
            let up = std::pin::pin!(std::future::pending::<Result<(), TunnelError>>());
            let down = std::pin::pin!(std::future::pending::<Result<Code, TunnelError>>());
            let deadline = Instant::now() + Duration::from_millis(20);
            let error = run_call(up, down, Some(deadline)).await.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::DeadlineExceeded);
        });
    }
}
