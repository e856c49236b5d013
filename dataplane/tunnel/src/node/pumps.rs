//! The two directions of a local relay: client messages down the tunnel, agent messages back
//! to the client. Errors name the side that failed; the relay adds the agent and answers.

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Response};
use sluice_grpc::transport::{recv_data_held, recv_data_now, release, send_data};
use sluice_grpc::{message_pieces, Code, FrameDecoder, FrameError, MESSAGE_HEADER_LEN};
use sluice_proto::tunnel::v1::{connect_request, connect_response, CloseSend, ConnectResponse};

use super::answer::{grpc_headers, status_headers, Responder};
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::TunnelMetrics;
use crate::wire::{
    data_frame, data_frame_head, data_frame_into, data_frame_tail, frame, frame_into,
    metadata_into_headers, MetadataLimits, MetadataTooLarge, ReadError, TunnelReader, WireError,
};

/// Requests up to this size (all messages) are copied into the RequestInfo's DATA frame.
const WHOLE_REQUEST_LIMIT: usize = 16 * 1024;

/// The client's request body and what of it was read before a tunnel took the call (kept
/// across routing attempts).
pub(super) struct CallBody {
    pub(super) body: RecvStream,
    /// Chunks read early, not yet sent.
    pub(super) early: Vec<Bytes>,
    /// The body ended.
    pub(super) ended: bool,
}

impl CallBody {
    pub(super) fn new(body: RecvStream) -> Self {
        Self {
            body,
            early: Vec::new(),
            ended: false,
        }
    }
}

/// What of the client's request went down the tunnel before the relay started.
pub(super) struct Upload {
    /// Body chunks read early, not yet sent.
    pub(super) early: Vec<Bytes>,
    /// The whole request (messages and CloseSend) went out with the RequestInfo.
    pub(super) sent: bool,
    /// Unless `sent`: the body read so far, for another tunnel.
    pub(super) replay: Replay,
}

impl Upload {
    /// Whether the call can go down another tunnel: the agent refusing the tunnel unread
    /// leaves the request with the node (whole in `CallBody::early`, or in `replay`).
    pub(super) fn replayable(&self) -> bool {
        self.sent || !self.replay.overflowed
    }

    /// A framed call's upload on the holding node: the routing node's chunks read before the
    /// tunnel took the call, kept for another tunnel like a client's.
    pub(super) fn spliced(early: &[Bytes], ended: bool) -> Self {
        let mut replay = Replay::of(early);
        replay.ended = ended;
        Self {
            early: Vec::new(),
            sent: false,
            replay,
        }
    }

    /// Keeps a chunk taken from the caller's body (see [`Replay`]).
    pub(super) fn record(&mut self, chunk: &Bytes) {
        self.replay.record(chunk);
    }

    /// The caller's body ended: the replay holds all of it (unless it overflowed).
    pub(super) fn body_ended(&mut self) {
        self.replay.ended = true;
    }

    /// Whether any byte of the caller's request went out with this upload (or was taken for
    /// it): a node that received them may have passed them on, so the call must not go to
    /// another route, which could run it twice.
    pub(super) fn took_any(&self) -> bool {
        self.sent || self.replay.size > 0
    }

    /// Puts the request read so far back in the call's `early` chunks (and `ended` flag, see
    /// [`CallBody`]) for the next tunnel; a request sent whole is still there.
    pub(super) fn restore(self, early: &mut Vec<Bytes>, ended: &mut bool) {
        if !self.sent {
            *early = self.replay.chunks;
            *ended = self.replay.ended;
        }
    }
}

/// The client's body chunks a call streamed down a tunnel (its request was not sent whole),
/// kept until the call ends: a tunnel the agent withdraws (REFUSED_STREAM) may be refused after
/// the node sent the RequestInfo and any part of the body, and the call goes to another tunnel
/// only if the node still has every byte it read. Bounded like a whole request: a larger body
/// stops being kept, and its call is not routed again.
#[derive(Debug, Default)]
pub(super) struct Replay {
    chunks: Vec<Bytes>,
    size: usize,
    /// The client's body ended: `chunks` is all of it.
    ended: bool,
    overflowed: bool,
}

impl Replay {
    /// A replay that starts with the chunks read before the call took its tunnel.
    pub(super) fn of(early: &[Bytes]) -> Self {
        let mut replay = Self::default();
        for chunk in early {
            replay.record(chunk);
        }
        replay
    }

    fn record(&mut self, chunk: &Bytes) {
        if self.overflowed {
            return;
        }
        self.size += chunk.len();
        if self.size > WHOLE_REQUEST_LIMIT {
            self.overflowed = true;
            self.chunks = Vec::new();
        } else {
            self.chunks.push(chunk.clone());
        }
    }
}

fn agent_gone(why: impl ToString) -> TunnelError {
    TunnelError::new(ErrorKind::AgentGone, why.to_string())
}

/// A send down a tunnel failed. REFUSED_STREAM: the agent withdrew the tunnel unread (see
/// `ReadError::Refused`), so the call may go down another one; anything else: the agent is gone.
pub(super) fn send_failed(error: h2::Error) -> TunnelError {
    if error.reason() == Some(h2::Reason::REFUSED_STREAM) {
        return TunnelError::new(ErrorKind::StaleTunnel, error.to_string());
    }
    agent_gone(error)
}

/// A tunnel the agent ended before any answer to the call on it (see `pump_down`).
pub(super) fn stale_ended() -> TunnelError {
    TunnelError::new(
        ErrorKind::StaleTunnel,
        "the agent ended the tunnel before reading the call",
    )
}

fn agent_protocol(why: impl ToString) -> TunnelError {
    TunnelError::new(ErrorKind::AgentProtocol, why.to_string())
}

/// An agent's Header or Trailer with more metadata than a node forwards: counted, and the
/// client gets RESOURCE_EXHAUSTED naming the limit.
fn agent_metadata(metrics: &TunnelMetrics, error: &MetadataTooLarge) -> TunnelError {
    metrics.metadata_refused("agent");
    TunnelError::new(ErrorKind::AgentProtocol, format!("agent response {error}"))
        .with_code(Code::ResourceExhausted)
}

fn client_protocol(error: &sluice_grpc::FrameError) -> TunnelError {
    TunnelError::new(ErrorKind::ClientProtocol, format!("request: {error}")).with_code(error.code())
}

/// Reads the request body chunks that already arrived, without waiting.
pub(super) async fn take_ready_chunks(call: &mut CallBody) -> Result<(), TunnelError> {
    // A request too big to copy into one frame is streamed by the pump instead.
    while call.early.iter().map(Bytes::len).sum::<usize>() <= WHOLE_REQUEST_LIMIT {
        match recv_data_now(&mut call.body).await {
            Some(Some(Ok(chunk))) => call.early.push(chunk),
            Some(Some(Err(_))) => return Err(TunnelError::client_gone()),
            Some(None) => {
                call.ended = true;
                return Ok(());
            }
            None => return Ok(()),
        }
    }
    Ok(())
}

/// The frame `info` writes followed by every message of a complete request body and
/// CloseSend, as one buffer; `None` if the body is not well-formed gRPC framing (the pump then
/// reports it the usual way) or too big to copy.
pub(super) fn whole_request(
    info: impl FnOnce(&mut BytesMut),
    chunks: &[Bytes],
    limit: usize,
) -> Option<Bytes> {
    let size: usize = chunks.iter().map(Bytes::len).sum();
    if size > WHOLE_REQUEST_LIMIT {
        return None;
    }
    let mut frames = FrameDecoder::new(limit);
    for chunk in chunks {
        frames.push(chunk.clone());
    }
    // One buffer for the whole request: RequestInfo (~100 bytes) and per message a frame head
    // and tail around its payload.
    let mut out = BytesMut::with_capacity(256 + size + 32);
    info(&mut out);
    while let Some(message) = frames.next_message().ok()? {
        data_frame_into(&mut out, &message.data, message.compressed, false);
    }
    frames.finish().ok()?;
    frame_into(
        &mut out,
        &ConnectResponse {
            msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
        },
    );
    Some(out.freeze())
}

/// Client -> agent: each gRPC message of the client becomes a tunnel Message, then CloseSend.
///
/// A message is forwarded as its bytes arrive (the tunnel Message's size is known from the
/// gRPC prefix), and the client's flow-control credit is returned only once its bytes went
/// down the tunnel: a client announcing a large message and trickling its bytes pins at most
/// the windows the node advertised, never the message (backpressure end to end).
///
/// Every chunk read from the client is also kept in `up.replay` (see [`Replay`]).
pub(super) async fn pump_up(
    up: &mut Upload,
    client_body: &mut RecvStream,
    tunnel: &mut SendStream<Bytes>,
    limit: usize,
) -> Result<(), TunnelError> {
    if up.sent {
        return Ok(());
    }
    // Chunks read early are in the replay already.
    let mut early = std::mem::take(&mut up.early).into_iter();
    let mut messages = MessageStream::new(limit);
    loop {
        // Chunks read early had their credit returned already (at most 16 KiB).
        let (chunk, held) = match early.next() {
            Some(chunk) => (chunk, 0),
            None => match recv_data_held(client_body).await {
                Some(chunk) => {
                    let chunk = chunk.map_err(|_| TunnelError::client_gone())?;
                    up.replay.record(&chunk);
                    let size = chunk.len();
                    (chunk, size)
                }
                None => break,
            },
        };
        for piece in messages
            .push(chunk)
            .map_err(|error| client_protocol(&error))?
        {
            send_data(tunnel, piece, false).await.map_err(send_failed)?;
        }
        release(client_body, held);
    }
    up.replay.ended = true;
    messages.finish().map_err(|error| client_protocol(&error))?;
    let close = frame(&ConnectResponse {
        msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
    });
    send_data(tunnel, close, false).await.map_err(send_failed)
}

/// Turns a client's gRPC byte stream into tunnel Message pieces as the bytes arrive: a message
/// wholly inside a chunk goes as one frame (as [`data_frame`] builds it), one split across
/// chunks goes as its head, then each part as it arrives, then its tail.
struct MessageStream {
    limit: usize,
    /// The gRPC prefix of the next message, while incomplete.
    prefix: Vec<u8>,
    /// The message being forwarded: its payload bytes still to come, and its compressed flag.
    open: Option<(usize, bool)>,
}

impl MessageStream {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            prefix: Vec::with_capacity(MESSAGE_HEADER_LEN),
            open: None,
        }
    }

    /// The pieces to send for `chunk`, in order.
    fn push(&mut self, mut chunk: Bytes) -> Result<Vec<Bytes>, FrameError> {
        let mut out = Vec::new();
        while !chunk.is_empty() {
            if let Some((remaining, compressed)) = self.open {
                let part = chunk.split_to(remaining.min(chunk.len()));
                let remaining = remaining - part.len();
                out.push(part);
                self.open = (remaining > 0).then_some((remaining, compressed));
                if remaining == 0 {
                    let tail = data_frame_tail(compressed);
                    if !tail.is_empty() {
                        out.push(Bytes::from_static(tail));
                    }
                }
                continue;
            }
            let wanted = MESSAGE_HEADER_LEN - self.prefix.len();
            let taken = chunk.split_to(wanted.min(chunk.len()));
            self.prefix.extend_from_slice(&taken);
            if self.prefix.len() < MESSAGE_HEADER_LEN {
                break;
            }
            let compressed = match self.prefix[0] {
                0 => false,
                1 => true,
                flag => return Err(FrameError::BadFlag(flag)),
            };
            let size = u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]) as usize;
            self.prefix.clear();
            if size > self.limit {
                return Err(FrameError::TooLarge {
                    size,
                    limit: self.limit,
                });
            }
            if size <= chunk.len() {
                // The whole message is here: one frame, as before.
                out.extend(data_frame(chunk.split_to(size), compressed, false));
                continue;
            }
            out.push(data_frame_head(size, compressed, false).freeze());
            self.open = Some((size, compressed));
        }
        Ok(out)
    }

    /// At end of stream: an error if a message is incomplete.
    fn finish(&self) -> Result<(), FrameError> {
        let buffered = self.prefix.len() + self.open.map_or(0, |_| 1);
        if buffered == 0 {
            Ok(())
        } else {
            Err(FrameError::Truncated { buffered })
        }
    }
}

/// Agent -> client: Header, Message*, then Trailer or Error. Returns the call's status code
/// and whether the agent ended it with a Trailer (not an Error).
pub(super) async fn pump_down(
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
    responder: &mut Responder,
    metrics: &TunnelMetrics,
    limits: &MetadataLimits,
) -> Result<(Code, bool), TunnelError> {
    let mut answered = false;
    loop {
        let next = monoio::select! {
            message = reader.read_request(recv) => Some(message),
            _ = responder.reset() => None,
        };
        let message = match next {
            None => return Err(TunnelError::client_gone()),
            Some(Err(ReadError::Gone(why))) => return Err(agent_gone(why)),
            // The agent withdrew the tunnel without reading the call (see `ReadError::Refused`):
            // stale, as if it had broken while idle; the driver may route the call again.
            Some(Err(ReadError::Refused(why))) => {
                return Err(TunnelError::new(ErrorKind::StaleTunnel, why))
            }
            Some(Err(ReadError::Protocol(error @ WireError::OverBudget { .. }))) => {
                metrics.buffer_refused();
                return Err(
                    TunnelError::new(ErrorKind::AgentProtocol, error.to_string())
                        .with_code(Code::ResourceExhausted),
                );
            }
            Some(Err(ReadError::Protocol(error))) => return Err(agent_protocol(error)),
            // An agent that ended its call before this one's CloseSend reached it ends the
            // tunnel after its Trailer and reads nothing more: a tunnel given back just before
            // that end arrived is stale, and the call it carried was never read.
            Some(Ok(None)) if !answered => return Err(stale_ended()),
            Some(Ok(None)) => return Err(agent_gone("the tunnel closed before the call ended")),
            Some(Ok(Some(message))) => message,
        };
        answered = true;
        if let Some(end) = pass_down(message, responder, metrics, limits).await? {
            return Ok(end);
        }
    }
}

/// Passes one agent message to the client; `Some` when it ended the call.
async fn pass_down(
    message: connect_request::Msg,
    responder: &mut Responder,
    metrics: &TunnelMetrics,
    limits: &MetadataLimits,
) -> Result<Option<(Code, bool)>, TunnelError> {
    match message {
        connect_request::Msg::Header(header) => {
            if responder.stream.is_some() {
                return Err(agent_protocol("a second Header"));
            }
            let mut response = Response::new(());
            metadata_into_headers(&header.metadata, response.headers_mut(), limits)
                .map_err(|error| agent_metadata(metrics, &error))?;
            response
                .headers_mut()
                .entry(http::header::CONTENT_TYPE)
                .or_insert(HeaderValue::from_static("application/grpc"));
            let stream = responder
                .respond
                .send_response(response, false)
                .map_err(|_| TunnelError::client_gone())?;
            responder.stream = Some(stream);
            Ok(None)
        }
        connect_request::Msg::Message(message) => {
            let Some(stream) = responder.stream.as_mut() else {
                return Err(agent_protocol("a Message before the Header"));
            };
            let (first, rest) = message_pieces(message.compressed, message.data);
            let gone = |_| TunnelError::client_gone();
            send_data(stream, first, false).await.map_err(gone)?;
            if let Some(rest) = rest {
                send_data(stream, rest, false).await.map_err(gone)?;
            }
            Ok(None)
        }
        connect_request::Msg::Trailer(trailer) => {
            let code = Code::from_u32(trailer.grpc_status);
            let mut trailers = HeaderMap::new();
            metadata_into_headers(&trailer.metadata, &mut trailers, limits)
                .map_err(|error| agent_metadata(metrics, &error))?;
            status_headers(&mut trailers, code, &trailer.grpc_message);
            match responder.stream.as_mut() {
                Some(stream) => {
                    let _ = stream.send_trailers(trailers);
                }
                None => {
                    let mut response = grpc_headers();
                    response.headers_mut().extend(trailers);
                    let _ = responder.respond.send_response(response, true);
                }
            }
            Ok(Some((code, true)))
        }
        connect_request::Msg::Error(error) => {
            // The agent's own answer. UNAVAILABLE means its backend failed, and an agent built
            // before it kept that detail to itself sent the backend's address: the client gets
            // the fixed text, the operator the agent's words at debug.
            let code = Code::from_u32(error.grpc_status);
            if code == Code::Unavailable {
                tracing::debug!(agent_said = %error.message, "the agent's backend failed a call");
                responder.finish(code, crate::agent::BACKEND_UNAVAILABLE);
            } else {
                responder.finish(code, &error.message);
            }
            Ok(Some((code, false)))
        }
        connect_request::Msg::Descriptor(_) => {
            Err(agent_protocol("a Descriptor in the middle of a call"))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn joined(pieces: &[Bytes]) -> Vec<u8> {
        pieces
            .iter()
            .flat_map(|piece| piece.iter().copied())
            .collect()
    }

    #[test]
    fn a_replay_keeps_a_streamed_request_up_to_the_whole_request_limit() {
        let early = [Bytes::from_static(b"ab"), Bytes::from_static(b"c")];
        let mut replay = Replay::of(&early);
        replay.record(&Bytes::from_static(b"d"));
        replay.ended = true;
        let upload = |replay| Upload {
            early: Vec::new(),
            sent: false,
            replay,
        };
        let streamed = upload(replay);
        assert!(streamed.replayable());
        let (mut chunks, mut ended) = (Vec::new(), false);
        streamed.restore(&mut chunks, &mut ended);
        assert_eq!(joined(&chunks), b"abcd");
        assert!(ended, "the next tunnel gets the request whole");

        let mut large = Replay::of(&early);
        large.record(&Bytes::from(vec![0; WHOLE_REQUEST_LIMIT]));
        large.record(&Bytes::from_static(b"e"));
        assert!(large.chunks.is_empty(), "nothing is kept past the limit");
        assert!(!upload(large).replayable());
        let whole = Upload {
            early: Vec::new(),
            sent: true,
            replay: Replay::default(),
        };
        assert!(
            whole.replayable(),
            "a whole request stays in CallBody::early"
        );
    }

    #[test]
    fn messages_forwarded_as_they_arrive_are_the_frames_of_whole_messages() {
        let messages = [
            (vec![1u8; 3], false),
            (vec![2u8; 40_000], true),
            (Vec::new(), false),
            (vec![3u8; 700], true),
        ];
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for (data, compressed) in &messages {
            stream.extend_from_slice(&sluice_grpc::message_header(*compressed, data.len()));
            stream.extend_from_slice(data);
            expected.extend(joined(&data_frame(
                Bytes::from(data.clone()),
                *compressed,
                false,
            )));
        }
        for chunk_size in [1, 2, 5, 7, 1000, 16 * 1024, stream.len()] {
            let mut forward = MessageStream::new(1 << 20);
            let mut out = Vec::new();
            for chunk in stream.chunks(chunk_size) {
                out.extend(joined(
                    &forward.push(Bytes::copy_from_slice(chunk)).unwrap(),
                ));
            }
            forward.finish().unwrap();
            assert_eq!(out, expected, "chunks of {chunk_size}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_refused_at_its_prefix_and_truncation_is_an_error() {
        let mut forward = MessageStream::new(16);
        let refused = forward.push(Bytes::copy_from_slice(&sluice_grpc::message_header(
            false, 17,
        )));
        assert_eq!(
            refused,
            Err(FrameError::TooLarge {
                size: 17,
                limit: 16
            })
        );
        let mut forward = MessageStream::new(16);
        forward
            .push(Bytes::copy_from_slice(&sluice_grpc::message_header(
                false, 10,
            )))
            .unwrap();
        forward.push(Bytes::from_static(b"abc")).unwrap();
        assert!(matches!(
            forward.finish(),
            Err(FrameError::Truncated { .. })
        ));
    }
}
