//! The two directions of a local relay: client messages down the tunnel, agent messages back
//! to the client. Errors name the side that failed; the relay adds the agent and answers.

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Response};
use sluice_grpc::transport::{recv_data, recv_data_now, send_data};
use sluice_grpc::{message_pieces, Code, FrameDecoder};
use sluice_proto::tunnel::v1::{connect_request, connect_response, CloseSend, ConnectResponse};

use super::answer::{grpc_headers, status_headers, Responder};
use crate::error::{ErrorKind, TunnelError};
use crate::wire::{data_frame, frame, frame_into, metadata_into_headers, ReadError, TunnelReader};

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

/// What of the client's request went down the tunnel before the relay started.
pub(super) struct Upload {
    /// Body chunks read early, not yet sent.
    pub(super) early: Vec<Bytes>,
    /// The whole request (messages and CloseSend) went out with the RequestInfo.
    pub(super) sent: bool,
}

fn agent_gone(why: impl ToString) -> TunnelError {
    TunnelError::new(ErrorKind::AgentGone, why.to_string())
}

fn agent_protocol(why: impl ToString) -> TunnelError {
    TunnelError::new(ErrorKind::AgentProtocol, why.to_string())
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

/// `info` followed by every message of a complete request body and CloseSend, as one buffer;
/// `None` if the body is not well-formed gRPC framing (the pump then reports it the usual way)
/// or too big to copy.
pub(super) fn whole_request(info: &[u8], chunks: &[Bytes], limit: usize) -> Option<Bytes> {
    let size: usize = chunks.iter().map(Bytes::len).sum();
    if size > WHOLE_REQUEST_LIMIT {
        return None;
    }
    let mut out = bytes::BytesMut::with_capacity(info.len() + size + 32);
    out.extend_from_slice(info);
    let mut frames = FrameDecoder::new(limit);
    for chunk in chunks {
        frames.push(chunk.clone());
    }
    while let Some(message) = frames.next_message().ok()? {
        for piece in data_frame(message.data, message.compressed, false) {
            out.extend_from_slice(&piece);
        }
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
pub(super) async fn pump_up(
    up: Upload,
    client_body: &mut RecvStream,
    tunnel: &mut SendStream<Bytes>,
    limit: usize,
) -> Result<(), TunnelError> {
    if up.sent {
        return Ok(());
    }
    let mut early = up.early.into_iter();
    let mut frames = FrameDecoder::new(limit);
    loop {
        let chunk = match early.next() {
            Some(chunk) => chunk,
            None => match recv_data(client_body).await {
                Some(chunk) => chunk.map_err(|_| TunnelError::client_gone())?,
                None => break,
            },
        };
        frames.push(chunk);
        while let Some(message) = frames
            .next_message()
            .map_err(|error| client_protocol(&error))?
        {
            for piece in data_frame(message.data, message.compressed, false) {
                send_data(tunnel, piece, false).await.map_err(agent_gone)?;
            }
        }
    }
    frames.finish().map_err(|error| client_protocol(&error))?;
    let close = frame(&ConnectResponse {
        msg: Some(connect_response::Msg::CloseSend(CloseSend {})),
    });
    send_data(tunnel, close, false).await.map_err(agent_gone)
}

/// Agent -> client: Header, Message*, then Trailer or Error. Returns the call's status code
/// and whether the agent ended it with a Trailer (not an Error).
pub(super) async fn pump_down(
    recv: &mut RecvStream,
    reader: &mut TunnelReader,
    responder: &mut Responder,
) -> Result<(Code, bool), TunnelError> {
    loop {
        let next = monoio::select! {
            message = reader.read_request(recv) => Some(message),
            _ = responder.reset() => None,
        };
        let message = match next {
            None => return Err(TunnelError::client_gone()),
            Some(Err(ReadError::Gone(why))) => return Err(agent_gone(why)),
            Some(Err(ReadError::Protocol(error))) => return Err(agent_protocol(error)),
            Some(Ok(None)) => return Err(agent_gone("the tunnel closed before the call ended")),
            Some(Ok(Some(message))) => message,
        };
        if let Some(end) = pass_down(message, responder).await? {
            return Ok(end);
        }
    }
}

/// Passes one agent message to the client; `Some` when it ended the call.
async fn pass_down(
    message: connect_request::Msg,
    responder: &mut Responder,
) -> Result<Option<(Code, bool)>, TunnelError> {
    match message {
        connect_request::Msg::Header(header) => {
            if responder.stream.is_some() {
                return Err(agent_protocol("a second Header"));
            }
            let mut response = Response::new(());
            metadata_into_headers(&header.metadata, response.headers_mut());
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
            metadata_into_headers(&trailer.metadata, &mut trailers);
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
            // The agent's own answer (its backend is unreachable...): relayed as it is.
            let code = Code::from_u32(error.grpc_status);
            responder.finish(code, &error.message);
            Ok(Some((code, false)))
        }
        connect_request::Msg::Descriptor(_) => {
            Err(agent_protocol("a Descriptor in the middle of a call"))
        }
    }
}
