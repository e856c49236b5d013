//! Relaying a routed call: down a local tunnel, or through the node that won the race. Errors
//! come back as [`TunnelError`]s for the endpoint to answer.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use http::HeaderMap;
use sluice_grpc::transport::send_data;
use sluice_grpc::{encode_timeout, Code};

use super::answer::{status_headers, Responder};
use super::pumps::{
    pump_down, pump_up, take_ready_chunks, whole_request, CallBody, Replay, Upload,
};
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
            // An agent that ends the tunnel after its call (it answered before the call's
            // CloseSend reached it) may have said so already.
            if tunnel.reusable
                && ended_with_trailer
                && up_finished
                && tunnel.reader.buffered() == 0
                && !tunnel.recv.is_end_stream()
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

/// Names the agent in the message of a call that failed while relaying.
pub(super) fn in_call_to(agent: AgentId, error: TunnelError) -> TunnelError {
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
