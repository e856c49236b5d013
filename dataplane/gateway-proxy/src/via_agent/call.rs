//! One `MakeRequest` call on the link: the request head (and a body that arrived with it) in
//! one DATA frame, the rest of the body pumped as Data messages, then the answer's messages
//! read until its head.

use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_grpc::transport::send_data;
use sluice_grpc::{Code, FrameDecoder};
use sluice_kube_tunnel::{
    decode_response, encode_request_data, encode_request_end, ExchangeLimits, ExchangeOrder,
    ResponseHead, ResponseMessage, MAKE_REQUEST_PATH,
};

use crate::error::AgentFailure;

const AGENT_ID_HEADER: &str = "sluice-agent-id";

/// The answer's messages after its head, read from the call's response stream.
#[derive(Debug)]
pub struct AnswerStream {
    recv: h2::RecvStream,
    decoder: FrameDecoder,
    order: ExchangeOrder,
    limits: ExchangeLimits,
    data_done: bool,
}

/// Sends the request (`head`: the encoded request head, `body`: the client's) and waits for
/// the answer's head.
pub async fn exchange(
    send: h2::client::SendRequest<Bytes>,
    agent: u64,
    head: Bytes,
    body: Incoming,
    limits: &ExchangeLimits,
) -> Result<(ResponseHead, AnswerStream), AgentFailure> {
    let empty = http_body::Body::is_end_stream(&body);
    let after = if empty { After::Nothing } else { After::Body };
    let (response, stream) = start(send, agent, head, after).await?;
    if !empty {
        let pump = pump_request(body, stream, limits.max_data_bytes);
        sluice_runtime::spawn_contained("gateway-agent-request-pump", pump);
    }
    answer(response, limits).await
}

/// What follows the request head on the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// The body, pumped as Data messages.
    Body,
    /// Nothing: the empty body's End, and the call's send side closes.
    Nothing,
    /// An upgrade: the empty body's End (sent before the 101 is known, as the agent expects),
    /// then, once upgraded, the stream's bytes on the send side left open.
    Upgrade,
}

/// Opens the call and sends the request head (and End, unless a body follows) in one DATA
/// frame.
pub async fn start(
    mut send: h2::client::SendRequest<Bytes>,
    agent: u64,
    head: Bytes,
    after: After,
) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), AgentFailure> {
    let request = Request::post(format!("http://sluice-node{MAKE_REQUEST_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(AGENT_ID_HEADER, agent)
        .body(())
        .map_err(|error| AgentFailure::Protocol(error.to_string()))?;
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(AgentFailure::Send)?;
    let mut first = BytesMut::from(&sluice_grpc::encode_message(false, &head)[..]);
    if after != After::Body {
        first.extend_from_slice(&sluice_grpc::encode_message(false, &encode_request_end()));
    }
    send_data(&mut stream, first.freeze(), after == After::Nothing)
        .await
        .map_err(AgentFailure::Send)?;
    Ok((response, stream))
}

/// Waits for the answer's head.
pub async fn answer(
    response: h2::client::ResponseFuture,
    limits: &ExchangeLimits,
) -> Result<(ResponseHead, AnswerStream), AgentFailure> {
    let response = response.await.map_err(AgentFailure::Response)?;
    if let Some(code) = response.headers().get("grpc-status") {
        // Trailers only: the node or the agent refused the call outright.
        return Err(AgentFailure::from_status(
            Code::from_header(code.as_bytes()),
            grpc_message(response.headers()),
        ));
    }
    let mut answer = AnswerStream {
        recv: response.into_body(),
        decoder: FrameDecoder::new(limits.max_message_bytes()),
        order: ExchangeOrder::new(),
        limits: *limits,
        data_done: false,
    };
    match std::future::poll_fn(|cx| answer.poll_next(cx)).await? {
        Some(ResponseMessage::Head(head)) => Ok((head, answer)),
        Some(other) => Err(AgentFailure::Protocol(format!(
            "the answer starts with {:?}, not its head",
            other.kind()
        ))),
        None => Err(AgentFailure::Protocol(
            "the answer ended without a head".into(),
        )),
    }
}

fn grpc_message(headers: &http::HeaderMap) -> String {
    headers
        .get("grpc-message")
        .map(|message| sluice_grpc::status::decode_message(message.as_bytes()))
        .unwrap_or_default()
}

impl AnswerStream {
    /// The next message of the answer; `None` once the call ended with OK. A call that ends
    /// with another status, or breaks the exchange's framing or order, is an error.
    pub fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<ResponseMessage>, AgentFailure>> {
        loop {
            let framed = self
                .decoder
                .next_message()
                .map_err(|error| AgentFailure::Protocol(error.to_string()))?;
            if let Some(framed) = framed {
                if framed.compressed {
                    return Poll::Ready(Err(AgentFailure::Protocol(
                        "a compressed message (the exchange is never compressed)".into(),
                    )));
                }
                let message = decode_response(&framed.data, &self.limits)?;
                self.order.on_response(&message)?;
                return Poll::Ready(Ok(Some(message)));
            }
            if self.data_done {
                return self.poll_status(cx);
            }
            match ready!(self.recv.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    self.decoder.push(chunk);
                }
                Some(Err(error)) => return Poll::Ready(Err(AgentFailure::Response(error))),
                None => {
                    self.decoder
                        .finish()
                        .map_err(|error| AgentFailure::Protocol(error.to_string()))?;
                    self.data_done = true;
                }
            }
        }
    }

    /// The call's trailers: OK ends the answer, anything else fails it.
    fn poll_status(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<ResponseMessage>, AgentFailure>> {
        let trailers = ready!(self.recv.poll_trailers(cx)).map_err(AgentFailure::Response)?;
        let code = trailers
            .as_ref()
            .and_then(|trailers| trailers.get("grpc-status"))
            .map_or(Code::Unknown, |code| Code::from_header(code.as_bytes()));
        if code == Code::Ok {
            return Poll::Ready(Ok(None));
        }
        let message = trailers.as_ref().map(grpc_message).unwrap_or_default();
        Poll::Ready(Err(AgentFailure::from_status(code, message)))
    }
}

/// `body` as Data messages (each at most `max_data` bytes), then End.
pub async fn send_body(
    stream: &mut h2::SendStream<Bytes>,
    mut body: Bytes,
    max_data: usize,
) -> Result<(), AgentFailure> {
    while !body.is_empty() {
        let piece = body.split_to(body.len().min(max_data.max(1)));
        let message = sluice_grpc::encode_message(false, &encode_request_data(piece));
        send_data(stream, message, false)
            .await
            .map_err(AgentFailure::Send)?;
    }
    let end = sluice_grpc::encode_message(false, &encode_request_end());
    send_data(stream, end, true)
        .await
        .map_err(AgentFailure::Send)
}

/// Client request body -> Data messages (each at most `max_data` bytes), then End, with the
/// link's flow control.
async fn pump_request(mut body: Incoming, mut stream: h2::SendStream<Bytes>, max_data: usize) {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            stream.send_reset(h2::Reason::CANCEL);
            return;
        };
        let Ok(mut data) = frame.into_data() else {
            continue; // Trailers of a request have no place in the exchange.
        };
        while !data.is_empty() {
            let piece = data.split_to(data.len().min(max_data));
            let message = sluice_grpc::encode_message(false, &encode_request_data(piece));
            if send_data(&mut stream, message, false).await.is_err() {
                return;
            }
        }
    }
    let end = sluice_grpc::encode_message(false, &encode_request_end());
    let _ = send_data(&mut stream, end, true).await;
}
