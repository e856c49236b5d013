//! The client's half of a call, and the one place a failed call is answered.

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::SendStream;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use sluice_grpc::status::encode_message as encode_grpc_message;
use sluice_grpc::transport::recv_data;
use sluice_grpc::Code;

use super::pumps::CallBody;
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::TunnelMetrics;

/// How long a node that reported a ready tunnel (100 Continue) waits for the routing node to
/// start the request body before it puts the tunnel back: the winner starts at once.
const CONTINUE_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn grpc_headers() -> Response<()> {
    let mut response = Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// Inserted by name rather than by `&str`: a name that is not a standard header is copied into
/// a new allocation each time it is inserted from text.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

pub(super) fn status_headers(headers: &mut HeaderMap, code: Code, message: &str) {
    headers.insert(GRPC_STATUS, HeaderValue::from_static(code.header_value()));
    if !message.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&encode_grpc_message(message)) {
            headers.insert(GRPC_MESSAGE, value);
        }
    }
}

/// Ends a call that has sent nothing yet with a trailers-only response.
pub(super) fn respond_status(respond: &mut SendResponse<Bytes>, code: Code, message: &str) {
    let mut response = grpc_headers();
    status_headers(response.headers_mut(), code, message);
    let _ = respond.send_response(response, true);
}

/// Something that resolves when the client resets its call: the responder, or in tests a
/// client that never does.
pub(super) trait ClientReset {
    fn reset(&mut self) -> impl std::future::Future<Output = ()>;
}

impl ClientReset for Responder {
    fn reset(&mut self) -> impl std::future::Future<Output = ()> {
        Responder::reset(self)
    }
}

/// The client's half of a call: headers not yet sent, or the response stream.
pub(super) struct Responder {
    pub(super) respond: SendResponse<Bytes>,
    pub(super) stream: Option<SendStream<Bytes>>,
}

impl Responder {
    pub(super) fn new(respond: SendResponse<Bytes>) -> Self {
        Self {
            respond,
            stream: None,
        }
    }

    /// Whether anything of the answer went to the client (then the call cannot be retried).
    pub(super) fn replied(&self) -> bool {
        self.stream.is_some()
    }

    /// Resolves when the client resets the call.
    pub(super) async fn reset(&mut self) {
        match &mut self.stream {
            Some(stream) => {
                let _ = poll_fn(|cx| stream.poll_reset(cx)).await;
            }
            None => {
                let _ = poll_fn(|cx| self.respond.poll_reset(cx)).await;
            }
        }
    }

    /// Reports the tunnel this node holds for the call (100 Continue) to the routing node that
    /// raced this one, and waits for it to start the request. Fails with `ClientGone` when the
    /// routing node chose another node (reset) or went quiet. `offer`: the 100 Continue says
    /// this node takes framed calls (`framed.rs`).
    pub(super) async fn report_ready(
        &mut self,
        body: &mut CallBody,
        offer: bool,
    ) -> Result<(), TunnelError> {
        let mut ready = Response::builder()
            .status(http::StatusCode::CONTINUE)
            .body(())
            .map_err(|_| TunnelError::client_gone())?;
        if offer {
            super::framed::offer(&mut ready);
        }
        let respond = &mut self.respond;
        respond
            .send_informational(ready)
            .map_err(|_| TunnelError::client_gone())?;
        let next = monoio::select! {
            chunk = recv_data(&mut body.body) => Some(chunk),
            _ = poll_fn(|cx| respond.poll_reset(cx)) => None,
            _ = monoio::time::sleep(CONTINUE_TIMEOUT) => None,
        };
        match next {
            Some(None) => {
                body.ended = true;
                Ok(())
            }
            Some(Some(Ok(chunk))) => {
                body.early.push(chunk);
                Ok(())
            }
            Some(Some(Err(_))) | None => Err(TunnelError::client_gone()),
        }
    }

    /// Ends the call with a status: as trailers if headers went out, else trailers-only.
    pub(super) fn finish(&mut self, code: Code, message: &str) {
        match &mut self.stream {
            Some(stream) => {
                let mut trailers = HeaderMap::new();
                status_headers(&mut trailers, code, message);
                let _ = stream.send_trailers(trailers);
            }
            None => respond_status(&mut self.respond, code, message),
        }
    }

    /// Answers a failed call: the error's code and message (nothing when the client is gone),
    /// counting protocol violations. Returns the code the call is counted under.
    pub(super) fn fail(
        &mut self,
        error: &TunnelError,
        metrics: &TunnelMetrics,
        worker: usize,
    ) -> Code {
        if error.kind().is_protocol_violation() {
            metrics.protocol_errors.inc(worker);
        }
        if error.kind() != ErrorKind::ClientGone {
            self.finish(error.code(), error.message());
        }
        error.code()
    }
}
