//! The answer's body as the client receives it: each Data message is one DATA frame (a watch
//! event reaches the client as the apiserver sent it), End ends the body.

use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use sluice_gateway::flow_control::FlowPermit;
use sluice_kube_tunnel::ResponseMessage;

use super::call::AnswerStream;
use crate::body::InFlight;
use crate::turns::ShareHeld;

/// An agent server's answer body, holding the request's flow-control permit and in-flight
/// count until its last byte is relayed or the client goes away.
#[derive(Debug)]
pub struct AgentBody {
    answer: AnswerStream,
    finished: bool,
    /// A watch (long-running request) that breaks off ends cleanly, as an apiserver ends a
    /// watch at its timeout: clients watch again from the last event they saw. Any other
    /// answer that breaks off is reset, so a truncated body never looks complete.
    ends_cleanly: bool,
    _held: (FlowPermit, ShareHeld, InFlight),
}

impl AgentBody {
    pub fn new(
        answer: AnswerStream,
        ends_cleanly: bool,
        held: (FlowPermit, ShareHeld, InFlight),
    ) -> Self {
        Self {
            answer,
            finished: false,
            ends_cleanly,
            _held: held,
        }
    }

    /// A broken-off answer resets the client's stream, as when an apiserver's stream fails.
    fn next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            let next = match self.answer.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(next) => next,
            };
            match next {
                Ok(Some(ResponseMessage::Data(data))) if data.is_empty() => continue,
                Ok(Some(ResponseMessage::Data(data))) => {
                    return Poll::Ready(Some(Ok(Frame::data(data))))
                }
                // End: the rest is the call's OK status, nothing the client needs to wait for.
                Ok(Some(ResponseMessage::End)) | Ok(None) => {
                    self.finished = true;
                    return Poll::Ready(None);
                }
                Ok(Some(other)) => {
                    let unexpected = format!("{:?} after the head", other.kind());
                    return self.broke(crate::error::AgentFailure::Protocol(unexpected));
                }
                Err(failure) => return self.broke(failure),
            }
        }
    }

    fn broke(
        &mut self,
        failure: crate::error::AgentFailure,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        self.finished = true;
        tracing::debug!(%failure, watch = self.ends_cleanly, "an answer through the tunnel broke off");
        if self.ends_cleanly {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Err(h2::Error::from(h2::Reason::INTERNAL_ERROR))))
    }

    fn ended(&self) -> bool {
        self.finished
    }
}

impl http_body::Body for AgentBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        self.get_mut().next_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended()
    }
}
