//! One `MakeRequest` call: the request Head (within a bound), the assertion verified before
//! any byte reaches the apiserver, the request replayed against the configured apiserver only,
//! the body streamed up with flow control, and the answer relayed back as Head, Data*, End and
//! an OK Trailer (each chunk as it arrives: a watch's events are not held back).

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::uri::PathAndQuery;
use http::{HeaderMap, Request};
use sluice_grpc::transport::{recv_data_held, release, send_data};
use sluice_grpc::Code;
use sluice_kube_tunnel::{
    apiserver_headers, decode_request, encode_response_data, encode_response_end,
    encode_response_head, review_headers, ExchangeLimits, ExchangeOrder, MessageKind, RequestHead,
    RequestMessage, Vouched,
};
use sluice_proto::tunnel::v1::connect_request;
use sluice_proto::tunnel::v1::{ConnectRequest, Header, Trailer};

use super::KubeApi;
use crate::agent::forward::{classify_request, FromNode};
use crate::agent::AgentShared;
use crate::error::{ErrorKind, TunnelError};
use crate::wire::{data_frame, frame_into, TunnelReader};

/// Longest wait for the request Head after the call arrived.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Calls the agent takes beyond `max_in_flight` for the gateway's own TokenReviews and
/// SubjectAccessReviews: users' watches filling the bound must not stop the gateway
/// authenticating anyone (a review is known only once its head is read, hence the check there).
const REVIEW_RESERVE: usize = 16;

/// Serves one call; `close_send_seen` as in `forward::forward` (the tunnel's reuse).
pub(in crate::agent) async fn exchange(
    agent: &AgentShared,
    node_recv: &mut RecvStream,
    reader: &mut TunnelReader,
    node_send: &mut SendStream<Bytes>,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    let Some(kube) = agent.kube.as_ref() else {
        return Err(TunnelError::new(
            ErrorKind::Unimplemented,
            "this agent does not serve the Kubernetes API (no agent.kubernetes_api section)",
        ));
    };
    let metrics = &kube.setup.metrics;
    if kube.in_flight.get() >= kube.setup.config.max_in_flight + REVIEW_RESERVE {
        metrics.answered(Code::ResourceExhausted);
        return Err(over_share(kube));
    }
    let _slot = InFlight::new(kube);
    let outcome = relay(kube, node_recv, reader, node_send, close_send_seen).await;
    let code = match &outcome {
        Ok(()) => Code::Ok,
        Err(error) => error.code(),
    };
    metrics.answered(code);
    outcome
}

fn over_share(kube: &KubeApi) -> TunnelError {
    let limit = kube.setup.config.max_in_flight;
    TunnelError::new(
        ErrorKind::OverShare,
        format!("the agent forwards at most {limit} Kubernetes API requests at once"),
    )
}

/// Counts a call in flight for as long as it lives.
struct InFlight<'a>(&'a KubeApi);

impl<'a> InFlight<'a> {
    fn new(kube: &'a KubeApi) -> Self {
        kube.in_flight.set(kube.in_flight.get() + 1);
        kube.setup.metrics.in_flight().inc();
        Self(kube)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let kube = self.0;
        kube.in_flight.set(kube.in_flight.get().saturating_sub(1));
        kube.setup.metrics.in_flight().dec();
    }
}

async fn relay(
    kube: &KubeApi,
    node_recv: &mut RecvStream,
    reader: &mut TunnelReader,
    node_send: &mut SendStream<Bytes>,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    let limits = ExchangeLimits::default();
    let mut order = ExchangeOrder::new();
    let first = monoio::time::timeout(HEAD_TIMEOUT, next(reader, node_recv, &limits))
        .await
        .map_err(|_| {
            TunnelError::new(ErrorKind::DeadlineExceeded, "no request head within 10 s")
        })??;
    let head = match first {
        Next::Message(RequestMessage::Head(head)) => head,
        Next::Message(_) | Next::CloseSend => {
            return Err(invalid("the request does not start with a head"))
        }
    };
    order
        .request_kind(MessageKind::Head)
        .map_err(|error| invalid(&error.to_string()))?;
    let (request, review) = authorized_request(kube, head)?;
    // This call counts itself: a user's request fits while the total is within the bound.
    if !review && kube.in_flight.get() > kube.setup.config.max_in_flight {
        return Err(over_share(kube));
    }
    if is_upgrade(request.headers()) {
        let upgrade = super::upgrade::relay_upgrade(
            kube,
            request,
            reader,
            node_recv,
            node_send,
            close_send_seen,
        );
        return Box::pin(upgrade).await;
    }
    let (response, mut api_send) = open(kube, request).await?;
    let up = pump_up(
        reader,
        node_recv,
        &mut api_send,
        &limits,
        &mut order,
        close_send_seen,
    );
    let down = pump_down(kube, response, node_send, &limits);
    let outcome = monoio::select! {
        sent = up => sent,
        received = down => received,
    };
    if outcome.is_err() {
        api_send.send_reset(h2::Reason::CANCEL);
    }
    if outcome.is_ok() {
        await_close_send(reader, node_recv, close_send_seen).await;
    }
    outcome
}

/// How long an answered call waits for the rest of the request and the node's CloseSend.
const CLOSE_SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The answer can be complete before the request was read to its CloseSend (the apiserver
/// answered early, or closed an upgraded stream right after the gateway's End): reads what is
/// left, so the tunnel can carry another call. Without it the agent would end a tunnel the node
/// has already parked for the next call, which would then fail.
pub(super) async fn await_close_send(
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    close_send_seen: &mut bool,
) {
    if *close_send_seen {
        return;
    }
    let limits = ExchangeLimits::default();
    let rest = async {
        loop {
            match next(reader, node_recv, &limits).await {
                Ok(Next::CloseSend) => return true,
                Ok(Next::Message(_)) => {}
                Err(_) => return false,
            }
        }
    };
    *close_send_seen = monoio::time::timeout(CLOSE_SEND_WAIT, rest)
        .await
        .unwrap_or(false);
}

pub(super) fn invalid(why: &str) -> TunnelError {
    TunnelError::new(
        ErrorKind::BadRequest,
        format!("malformed Kubernetes API request: {why}"),
    )
}

/// The assertion verified for exactly this method and path, then the apiserver request built
/// from the configuration's authority and the head's path only; and whether it is the
/// gateway's own review.
fn authorized_request(
    kube: &KubeApi,
    head: RequestHead,
) -> Result<(Request<()>, bool), TunnelError> {
    let setup = &kube.setup;
    let verified = setup.verifier().verify_vouched(
        &head.assertion,
        head.method.as_str(),
        &head.path,
        SystemTime::now(),
    );
    let vouched = verified.map_err(|error| {
        setup.metrics.refused(error.reason());
        tracing::debug!(%error, "Kubernetes API request refused: the assertion did not verify");
        TunnelError::new(
            ErrorKind::PermissionDenied,
            format!("the gateway's assertion was refused: {}", error.reason()),
        )
    })?;
    let bearer = kube.bearer()?;
    let review = vouched == Vouched::GatewayReview;
    let headers = match vouched {
        Vouched::User(identity) => apiserver_headers(&head.headers, &identity, bearer.as_ref())
            .map_err(|error| invalid(&error.to_string()))?,
        // The gateway's own TokenReview or SubjectAccessReview (the assertion allows no other
        // request): as the agent itself.
        Vouched::GatewayReview => review_headers(&head.headers, bearer.as_ref()),
    };
    let request = apiserver_request(&setup.authority, head.method, &head.path, headers)?;
    Ok((request, review))
}

/// The request to the configured apiserver: `https`, the configured authority, and the path
/// of the head. Nothing of the request (its Host, an absolute URI, `:authority`) takes part.
pub(super) fn apiserver_request(
    authority: &http::uri::Authority,
    method: http::Method,
    path: &str,
    headers: HeaderMap,
) -> Result<Request<()>, TunnelError> {
    if !path.starts_with('/') || path.starts_with("//") {
        return Err(invalid("the path must be origin-form (/api/...)"));
    }
    let path = PathAndQuery::try_from(path).map_err(|error| invalid(&error.to_string()))?;
    let uri = http::Uri::builder()
        .scheme("https")
        .authority(authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|error| invalid(&error.to_string()))?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// Whether a request asks for a protocol switch (exec, attach, port-forward over SPDY or
/// websocket), which HTTP/2 to the apiserver cannot carry.
pub(super) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::UPGRADE)
        || headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|value| {
                value
                    .as_bytes()
                    .split(|byte| *byte == b',')
                    .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
            })
}

async fn open(
    kube: &KubeApi,
    request: Request<()>,
) -> Result<(ResponseFuture, SendStream<Bytes>), TunnelError> {
    let unreachable = |why: String| {
        kube.setup.metrics.apiserver_error();
        TunnelError::new(ErrorKind::BackendUnavailable, why)
    };
    let mut ready = kube
        .ready()
        .await
        .map_err(|error| unreachable(format!("the apiserver is unreachable: {error}")))?;
    ready
        .send_request(request, false)
        .map_err(|error| unreachable(format!("the apiserver refused the request: {error}")))
}

pub(super) enum Next {
    Message(RequestMessage),
    CloseSend,
}

/// The node's next message for this call, decoded.
pub(super) async fn next(
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    limits: &ExchangeLimits,
) -> Result<Next, TunnelError> {
    match classify_request(reader.read_response(node_recv).await)? {
        FromNode::CloseSend => Ok(Next::CloseSend),
        FromNode::Message(message) if message.compressed => {
            Err(invalid("compressed messages are not accepted"))
        }
        FromNode::Message(message) => decode_request(&message.data, limits)
            .map(Next::Message)
            .map_err(|error| invalid(&error.to_string())),
    }
}

/// Node -> apiserver: Data* then End; then CloseSend, after which a reset from the node (the
/// gateway's client went away) still cancels the request.
async fn pump_up(
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    api_send: &mut SendStream<Bytes>,
    limits: &ExchangeLimits,
    order: &mut ExchangeOrder,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    // The apiserver may answer before it read the whole body (a refusal): the rest has nowhere
    // to go and is dropped while the answer still flows down.
    let mut api_open = true;
    let mut ended = false;
    loop {
        let message = match next(reader, node_recv, limits).await? {
            Next::Message(message) => message,
            Next::CloseSend => break,
        };
        order
            .on_request(&message)
            .map_err(|error| invalid(&error.to_string()))?;
        ended |= matches!(message, RequestMessage::End);
        match message {
            RequestMessage::Data(data) if api_open => {
                api_open = send_data(api_send, data, false).await.is_ok();
            }
            RequestMessage::End if api_open => {
                api_open = send_data(api_send, Bytes::new(), true).await.is_ok();
            }
            _ => {}
        }
    }
    // CloseSend without End would pass a cut body off as whole.
    if !ended {
        return Err(invalid("the request ended without End"));
    }
    *close_send_seen = true;
    match reader.read_response(node_recv).await {
        Ok(Some(_)) => Err(TunnelError::new(
            ErrorKind::NodeProtocol,
            "the node sent a message after CloseSend",
        )),
        Ok(None) => std::future::pending().await,
        Err(error) => Err(TunnelError::new(
            ErrorKind::NodeGone,
            format!("the node reset the tunnel: {error}"),
        )),
    }
}

fn node_gone(error: h2::Error) -> TunnelError {
    TunnelError::new(ErrorKind::NodeGone, error.to_string())
}

/// Apiserver -> node: the response head, every body chunk as it arrives (its flow-control
/// credit returned only once it went on to the node), End, and the OK Trailer.
async fn pump_down(
    kube: &KubeApi,
    response: ResponseFuture,
    node_send: &mut SendStream<Bytes>,
    limits: &ExchangeLimits,
) -> Result<(), TunnelError> {
    let failed = |error: h2::Error| {
        kube.setup.metrics.apiserver_error();
        TunnelError::new(ErrorKind::BackendUnavailable, format!("apiserver: {error}"))
    };
    let response = response.await.map_err(failed)?;
    let (parts, mut body) = response.into_parts();
    let mut out = BytesMut::new();
    frame_into(
        &mut out,
        &ConnectRequest {
            msg: Some(connect_request::Msg::Header(Header::default())),
        },
    );
    message_into(&mut out, encode_response_head(parts.status, &parts.headers));
    send_data(node_send, out.split().freeze(), false)
        .await
        .map_err(node_gone)?;
    while let Some(chunk) = recv_data_held(&mut body).await {
        let chunk = chunk.map_err(failed)?;
        let size = chunk.len();
        for piece in pieces(chunk, limits.max_data_bytes) {
            for part in data_frame(encode_response_data(piece), false, true) {
                send_data(node_send, part, false).await.map_err(node_gone)?;
            }
        }
        release(&mut body, size);
    }
    message_into(&mut out, encode_response_end());
    frame_into(
        &mut out,
        &ConnectRequest {
            msg: Some(connect_request::Msg::Trailer(Trailer {
                grpc_status: Code::Ok.as_u32(),
                ..Trailer::default()
            })),
        },
    );
    send_data(node_send, out.split().freeze(), false)
        .await
        .map_err(node_gone)
}

fn message_into(out: &mut BytesMut, message: Bytes) {
    for part in data_frame(message, false, true) {
        out.extend_from_slice(&part);
    }
}

/// `chunk` in slices of at most `max` bytes (uncopied).
pub(super) fn pieces(mut chunk: Bytes, max: usize) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(chunk.len().div_ceil(max.max(1)));
    while chunk.len() > max {
        out.push(chunk.split_to(max));
    }
    if !chunk.is_empty() {
        out.push(chunk);
    }
    out
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
