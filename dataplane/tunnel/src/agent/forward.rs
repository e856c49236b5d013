//! One tunnelled call on the agent: open the call on the backend, relay the node's request to
//! it and its answer back, then decide what becomes of the tunnel.

use std::future::poll_fn;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::uri::{self, Authority, InvalidUri, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use sluice_config::Endpoint;
use sluice_grpc::status::decode_message;
use sluice_grpc::transport::{recv_data, recv_data_now, recv_trailers_now, send_data};
use sluice_grpc::{message_pieces, Code, FrameDecoder};
use sluice_kube_tunnel::MAKE_REQUEST_PATH;
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, Error, RequestInfo,
};

use super::AgentShared;
use crate::error::{ErrorKind, Side, TunnelError};
use crate::protocol::GRPC_TIMEOUT;
use crate::wire::{
    data_frame, data_frame_into, frame, header_frame_into, metadata_into_headers,
    trailer_frame_into, HeaderMetadata, MetadataLimits, ReadError, TunnelReader, COPY_LIMIT,
};

/// Relays one call between the tunnel and the backend. Returns whether the tunnel can carry
/// another call: the node sent CloseSend, the agent sent its Trailer, nothing went wrong.
pub(super) async fn forward(
    agent: &AgentShared,
    info: RequestInfo,
    node_recv: &mut RecvStream,
    reader: &mut TunnelReader,
    node_send: &mut SendStream<Bytes>,
) -> bool {
    let mut close_send_seen = false;
    let outcome = if info.method_name == MAKE_REQUEST_PATH {
        // Never the backend: the configured apiserver, or UNIMPLEMENTED without one.
        super::kube::exchange(agent, node_recv, reader, node_send, &mut close_send_seen).await
    } else {
        relay_backend(
            agent,
            &info,
            node_recv,
            reader,
            node_send,
            &mut close_send_seen,
        )
        .await
    };
    match call_end(outcome, close_send_seen) {
        CallEnd::Reuse => return true,
        CallEnd::Answer(error) => {
            let message = answer_message(agent, &info, &error);
            let _ = send_frame(
                node_send,
                connect_request::Msg::Error(Error {
                    grpc_status: error.code().as_u32(),
                    message,
                }),
            );
            end_tunnel(node_send);
            await_node_close(node_recv).await;
        }
        CallEnd::EndTunnel => {
            end_tunnel(node_send);
            await_node_close(node_recv).await;
        }
        CallEnd::Drop => {}
    }
    false
}

/// Relays one call between the tunnel and the local gRPC backend.
async fn relay_backend(
    agent: &AgentShared,
    info: &RequestInfo,
    node_recv: &mut RecvStream,
    reader: &mut TunnelReader,
    node_send: &mut SendStream<Bytes>,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    match open_backend_call(agent, info).await {
        Ok((response, mut backend_send)) => {
            let limit = agent.task.config.max_message_bytes;
            let up = pump_to_backend(reader, node_recv, &mut backend_send, close_send_seen);
            let down = pump_to_node(response, &mut *node_send, limit);
            let outcome = monoio::select! {
                sent = up => sent,
                received = down => received,
            };
            if let Err(why) = &outcome {
                tracing::debug!(method = %info.method_name, %why, "call ended early; cancelling both sides");
                backend_send.send_reset(h2::Reason::CANCEL);
            }
            outcome
        }
        Err(error) => {
            agent.task.metrics.backend_errors.inc(0);
            Err(error)
        }
    }
}

/// What the node, and through it an external client, is told about a failed call. A backend
/// failure names the backend's address and the agent's network, which are the agent owner's
/// business: the detail goes to this agent's log (rate-bounded, since every call fails alike
/// while the backend is down) and the client learns only that the backend was unreachable.
fn answer_message(agent: &AgentShared, info: &RequestInfo, error: &TunnelError) -> String {
    if error.kind() != ErrorKind::BackendUnavailable {
        return error.message().to_string();
    }
    if info.method_name == MAKE_REQUEST_PATH {
        // The apiserver's address and the failure are the agent owner's business too: the
        // node answers UNAVAILABLE with its fixed text; the detail goes to this log.
        if let Some(suppressed) = agent.backend_log.admit(std::time::Instant::now()) {
            tracing::warn!(%error, suppressed_since_last = suppressed, "Kubernetes API call failed");
        }
        return APISERVER_UNAVAILABLE.to_string();
    }
    if let Some(suppressed) = agent.backend_log.admit(std::time::Instant::now()) {
        tracing::warn!(
            method = %info.method_name,
            backend = %agent.task.config.forward_to.url,
            %error,
            suppressed_since_last = suppressed,
            "call failed: the backend is unreachable or failed it"
        );
    }
    BACKEND_UNAVAILABLE.to_string()
}

/// The whole of what a client learns when this agent's backend fails its call.
pub const BACKEND_UNAVAILABLE: &str = "the agent could not reach its backend";

/// The whole of what the gateway learns when this agent's apiserver fails its call.
const APISERVER_UNAVAILABLE: &str = "the agent could not reach its apiserver";

/// What becomes of a tunnel after a call.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CallEnd {
    /// Clean on both sides: the node puts the tunnel back and sends the next call on it.
    Reuse,
    /// The call ended without the node's CloseSend: end the tunnel.
    EndTunnel,
    /// Tell the node why the call failed (an Error message), then end the tunnel.
    Answer(TunnelError),
    /// The node itself ended the call (its client went away): nothing to tell it.
    Drop,
}

pub(super) fn call_end(outcome: Result<(), TunnelError>, close_send_seen: bool) -> CallEnd {
    match outcome {
        // The node puts the tunnel back in its registry once it has both our Trailer and its
        // own CloseSend behind it; otherwise it ends the tunnel.
        Ok(()) if close_send_seen => CallEnd::Reuse,
        Ok(()) => CallEnd::EndTunnel,
        Err(error) if error.side() == Side::Node => CallEnd::Drop,
        Err(error) => CallEnd::Answer(error),
    }
}

/// The backend's `host:port` as every call's request carries it: parsed once per worker
/// (`AgentShared`) rather than formatted and parsed with each call's URI. An IPv6 host gets its
/// brackets back (the config keeps the host without them).
pub(super) fn backend_authority(backend: &Endpoint) -> Result<Authority, InvalidUri> {
    let host = if backend.host.contains(':') {
        format!("[{}]", backend.host)
    } else {
        backend.host.clone()
    };
    Authority::try_from(format!("{host}:{}", backend.port))
}

/// The backend request for a tunnelled call: its method, the client's metadata, and the
/// deadline the node forwarded (it is a hop header elsewhere, so it is set here by hand).
/// A method that is not a gRPC path is refused (UNIMPLEMENTED), as is metadata past
/// [`MetadataLimits::CEILING`] (RESOURCE_EXHAUSTED; a node holds calls to its own, smaller,
/// limits, so only a broken node sends either) rather than forwarded without it.
pub(super) fn backend_request(
    info: &RequestInfo,
    authority: &Authority,
) -> Result<Request<()>, TunnelError> {
    let malformed = || {
        TunnelError::new(
            ErrorKind::Unimplemented,
            "malformed method: a gRPC :path is /package.Service/Method",
        )
    };
    // The method follows the backend's authority: one without a leading '/' would choose
    // another authority (`@elsewhere:443/x`) in a URI made of text. Nodes refuse such calls;
    // so does the agent.
    if !info.method_name.starts_with('/') {
        return Err(malformed());
    }
    let path = PathAndQuery::from_maybe_shared(Bytes::copy_from_slice(info.method_name.as_bytes()))
        .map_err(|_| malformed())?;
    let mut parts = uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(path);
    let uri = Uri::from_parts(parts).map_err(|_| malformed())?;
    let mut request = Request::new(());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    metadata_into_headers(
        &info.metadata,
        request.headers_mut(),
        &MetadataLimits::CEILING,
    )
    .map_err(|error| {
        TunnelError::new(ErrorKind::NodeProtocol, format!("request {error}"))
            .with_code(Code::ResourceExhausted)
    })?;
    let headers = request.headers_mut();
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    headers
        .entry(http::header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/grpc"));
    let timeout = info
        .metadata
        .iter()
        .find(|entry| entry.key == GRPC_TIMEOUT)
        .and_then(|entry| entry.values.first())
        .and_then(|value| HeaderValue::from_bytes(value).ok());
    if let Some(value) = timeout {
        headers.insert(GRPC_TIMEOUT, value);
    }
    Ok(request)
}

/// Opens the call on the backend (dialling it if needed).
async fn open_backend_call(
    agent: &AgentShared,
    info: &RequestInfo,
) -> Result<(ResponseFuture, SendStream<Bytes>), TunnelError> {
    let backend = &agent.task.config.forward_to;
    let Some(authority) = &agent.backend_authority else {
        let message = format!("the agent's backend {} is not a host:port", backend.url);
        return Err(TunnelError::new(ErrorKind::BackendUnavailable, message));
    };
    let request = backend_request(info, authority)?;
    let mut connection = agent.backend().await.map_err(|why| {
        let message = format!("the agent cannot reach its backend {}: {why}", backend.url);
        TunnelError::new(ErrorKind::BackendUnavailable, message)
    })?;
    connection.send_request(request, false).map_err(|error| {
        let message = format!("backend {}: {error}", backend.url);
        TunnelError::new(ErrorKind::BackendUnavailable, message)
    })
}

/// One node -> backend message, classified.
#[derive(Debug)]
pub(super) enum FromNode {
    /// A request message.
    Message(sluice_proto::tunnel::v1::Message),
    CloseSend,
}

fn node_error(error: ReadError) -> TunnelError {
    TunnelError::new(
        ErrorKind::NodeGone,
        format!("the node reset the tunnel: {error}"),
    )
}

/// Classifies what the node sent during a call's request.
pub(super) fn classify_request(
    next: Result<Option<connect_response::Msg>, ReadError>,
) -> Result<FromNode, TunnelError> {
    match next {
        Ok(Some(connect_response::Msg::Message(message))) => Ok(FromNode::Message(message)),
        Ok(Some(connect_response::Msg::CloseSend(_))) => Ok(FromNode::CloseSend),
        Ok(Some(connect_response::Msg::RequestInfo(_))) => Err(TunnelError::new(
            ErrorKind::NodeProtocol,
            "a second RequestInfo",
        )),
        // The node ended or reset the tunnel: the client went away (cancel).
        Ok(None) => Err(TunnelError::new(
            ErrorKind::NodeGone,
            "the node closed the tunnel",
        )),
        Err(error) => Err(node_error(error)),
    }
}

/// Node -> backend: Message* then CloseSend; after that, keeps listening to the tunnel so a
/// reset from the node (the client cancelled, or its deadline passed) cancels the backend call.
async fn pump_to_backend(
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    backend_send: &mut SendStream<Bytes>,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    // A backend may answer and close its stream before reading all of the request (a unary
    // server replies as soon as it has the message); from then on the rest of the request has
    // nowhere to go and is dropped, while the response still flows down.
    let mut backend_open = true;
    let mut read_ahead = None;
    loop {
        let next = match read_ahead.take() {
            Some(next) => next,
            None => reader.read_response(node_recv).await,
        };
        let message = match classify_request(next)? {
            FromNode::Message(message) => message,
            FromNode::CloseSend => {
                if backend_open {
                    let _ = send_data(backend_send, Bytes::new(), true).await;
                }
                break;
            }
        };
        // A unary request's message and CloseSend arrive together: the message's frame then
        // ends the backend stream too.
        let following = reader.next_response().map_err(ReadError::Protocol);
        let closes = matches!(following, Ok(Some(connect_response::Msg::CloseSend(_))));
        if !closes && !matches!(following, Ok(None)) {
            read_ahead = Some(following);
        }
        if backend_open {
            let (first, rest) = message_pieces(message.compressed, message.data);
            backend_open = send_data(backend_send, first, closes && rest.is_none())
                .await
                .is_ok();
            if let (true, Some(rest)) = (backend_open, rest) {
                backend_open = send_data(backend_send, rest, closes).await.is_ok();
            }
        }
        if closes {
            break;
        }
    }
    *close_send_seen = true;
    // The node sends nothing more for this call: the next message would be the next call's
    // RequestInfo, which comes only after this call's Trailer (when this future is no longer
    // polled). A reset means the client cancelled.
    match reader.read_response(node_recv).await {
        Ok(Some(_)) => Err(TunnelError::new(
            ErrorKind::NodeProtocol,
            "the node sent a message after CloseSend",
        )),
        // The node finished its side: the call is over; the backend side ends by itself.
        Ok(None) => std::future::pending().await,
        Err(error) => Err(node_error(error)),
    }
}

fn backend_error(error: impl std::fmt::Display) -> TunnelError {
    TunnelError::new(ErrorKind::BackendUnavailable, format!("backend: {error}"))
}

fn node_send_error(error: h2::Error) -> TunnelError {
    TunnelError::new(ErrorKind::NodeGone, error.to_string())
}

/// Backend -> node: Header, Message*, Trailer, gathered into as few DATA frames as the
/// backend's pace allows.
async fn pump_to_node(
    response: ResponseFuture,
    node_send: &mut SendStream<Bytes>,
    limit: usize,
) -> Result<(), TunnelError> {
    let response = response.await.map_err(backend_error)?;
    let (parts, mut body) = response.into_parts();
    let mut batch = Batch {
        // A unary answer's Header, Message and Trailer in one allocation, not three growths.
        out: BytesMut::with_capacity(BATCH_CAPACITY),
        send: node_send,
    };
    if parts.headers.contains_key(&GRPC_STATUS) {
        // Trailers-only response.
        trailer_into(&mut batch.out, &parts.headers);
        return batch.flush().await.map_err(node_send_error);
    }
    header_frame_into(&mut batch.out, &HeaderMetadata::of(&parts.headers));
    let mut frames = FrameDecoder::new(limit);
    loop {
        let chunk = match recv_data_now(&mut body).await {
            Some(chunk) => chunk,
            None => {
                batch.flush().await.map_err(node_send_error)?;
                recv_data(&mut body).await
            }
        };
        let Some(chunk) = chunk else { break };
        frames.push(chunk.map_err(backend_error)?);
        while let Some(message) = frames.next_message().map_err(backend_error)? {
            batch
                .push_message(message.data, message.compressed)
                .await
                .map_err(node_send_error)?;
        }
    }
    frames.finish().map_err(backend_error)?;
    let trailers = match recv_trailers_now(&mut body).await {
        Some(trailers) => trailers,
        None => {
            batch.flush().await.map_err(node_send_error)?;
            poll_fn(|cx| body.poll_trailers(cx)).await
        }
    };
    let trailers = trailers.map_err(backend_error)?.unwrap_or_default();
    trailer_into(&mut batch.out, &trailers);
    batch.flush().await.map_err(node_send_error)
}

fn send_frame(
    send: &mut SendStream<Bytes>,
    message: connect_request::Msg,
) -> Result<(), h2::Error> {
    send.send_data(frame(&ConnectRequest { msg: Some(message) }), false)
}

/// Ends the tunnel's Connect call from the agent's side.
pub(super) fn end_tunnel(send: &mut SendStream<Bytes>) {
    let _ = send.send_data(Bytes::new(), true);
}

/// What a batch reserves first: a small unary answer with its metadata fits.
const BATCH_CAPACITY: usize = 512;

/// Agent -> node messages gathered into one DATA frame until the agent would wait for the
/// backend: a unary answer (Header, Message, Trailer) arrives together and leaves as one frame.
struct Batch<'a> {
    out: BytesMut,
    send: &'a mut SendStream<Bytes>,
}

impl Batch<'_> {
    /// A backend message, framed in place; large ones go out as their own slices, uncopied.
    async fn push_message(&mut self, data: Bytes, compressed: bool) -> Result<(), h2::Error> {
        if data.len() <= COPY_LIMIT {
            data_frame_into(&mut self.out, &data, compressed, true);
            return Ok(());
        }
        self.flush().await?;
        for piece in data_frame(data, compressed, true) {
            send_data(self.send, piece, false).await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), h2::Error> {
        if self.out.is_empty() {
            return Ok(());
        }
        send_data(self.send, self.out.split().freeze(), false).await
    }
}

/// Waits for the node to close its side of the tunnel (it answers our Trailer or Error with its
/// own trailers). Dropping the stream earlier would reset it, and a reset can overtake the last
/// message on the wire.
async fn await_node_close(node_recv: &mut RecvStream) {
    let _ = monoio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = recv_data(node_recv).await {}
        let _ = poll_fn(|cx| node_recv.poll_trailers(cx)).await;
    })
    .await;
}

// Looked up as names, not text: a `&str` key is parsed and validated on every lookup.
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// Appends the Trailer frame of the backend's trailers (or trailers-only headers).
pub(super) fn trailer_into(out: &mut BytesMut, headers: &HeaderMap) {
    let code = headers
        .get(&GRPC_STATUS)
        .map_or(Code::Unknown, |value| Code::from_header(value.as_bytes()));
    let message = headers
        .get(&GRPC_MESSAGE)
        .map(|value| decode_message(value.as_bytes()))
        .unwrap_or_default();
    let metadata = HeaderMetadata::of_trailers(headers);
    trailer_frame_into(out, code.as_u32(), &message, &metadata);
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
