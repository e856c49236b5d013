//! One gRPC call over HTTP/2 (sluice-grpc's transport on a monoio thread): the request message
//! out, each reply message to a sink as it arrives, the status from the trailers. Everything
//! that can end a call is a [`CallError`] that knows its gRPC status, found by the client when
//! the server sent none (gRPC's rules: no connection is UNAVAILABLE, an HTTP error status maps
//! to a code, a reset stream's reason too).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use rustls::pki_types::ServerName;
use sluice_grpc::transport::{self, ConnectBounds, ConnectError, H2Settings};
use sluice_grpc::{Code, FrameDecoder, FrameError, Status};

/// Largest reply message accepted (the node relays 32 MiB by default).
pub const MAX_REPLY_BYTES: usize = 32 * 1024 * 1024;

/// What to send, resolved.
pub struct Call {
    pub address: SocketAddr,
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    /// `scheme://authority/path`.
    pub uri: http::Uri,
    pub headers: HeaderMap,
    pub message: Bytes,
    pub timeout: Duration,
}

/// Why a call did not end with OK.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Connect(#[from] ConnectError),
    #[error("the stream failed: {0}")]
    Stream(h2::Error),
    #[error("cannot build the request: {0}")]
    Request(http::Error),
    #[error("the node answered HTTP {0}, not a gRPC response")]
    Http(StatusCode),
    #[error("the reply is not gRPC (content-type {0:?})")]
    NotGrpc(String),
    #[error("the reply's framing: {0}")]
    Frame(#[from] FrameError),
    #[error("a compressed reply message, though the call offered no compression")]
    Compressed,
    #[error("the reply ended without a grpc-status")]
    NoStatus,
    #[error("no reply within the deadline of {0:?}")]
    Deadline(Duration),
    /// The status the server ended the call with.
    #[error("{}", .0.message)]
    Status(Status),
    /// The reply could not be written out (not a status: the call itself went through).
    #[error("cannot write the reply: {0}")]
    Output(std::io::Error),
}

impl CallError {
    /// The call's gRPC status code; `None` when the call went through but its output did not.
    pub fn code(&self) -> Option<Code> {
        Some(match self {
            CallError::Connect(_) => Code::Unavailable,
            CallError::Stream(error) => reset_code(error),
            CallError::Http(status) => http_code(*status),
            CallError::NotGrpc(_) => Code::Unknown,
            CallError::Frame(error) => error.code(),
            CallError::Request(_) | CallError::Compressed | CallError::NoStatus => Code::Internal,
            CallError::Deadline(_) => Code::DeadlineExceeded,
            CallError::Status(status) => status.code,
            CallError::Output(_) => return None,
        })
    }
}

/// gRPC's mapping of an HTTP status received instead of a gRPC response
/// (grpc/doc/http-grpc-status-mapping.md).
pub fn http_code(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// gRPC's mapping of an HTTP/2 error (RST_STREAM or GOAWAY reason) to a status; I/O errors
/// (the connection lost) are UNAVAILABLE.
pub fn reset_code(error: &h2::Error) -> Code {
    if error.is_io() {
        return Code::Unavailable;
    }
    match error.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// The status in `headers` (the trailers, or the head of a Trailers-Only reply), if any.
pub fn status_of(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_header(headers.get("grpc-status")?.as_bytes());
    let message = headers
        .get("grpc-message")
        .map(|value| sluice_grpc::status::decode_message(value.as_bytes()))
        .unwrap_or_default();
    Some(Status::new(code, message))
}

/// OK, or why not. `sink` gets each reply message's bytes.
pub async fn call(
    call: Call,
    sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<(), CallError> {
    let timeout = call.timeout;
    monoio::time::timeout(timeout, exchange(call, sink))
        .await
        .unwrap_or(Err(CallError::Deadline(timeout)))
}

async fn exchange(
    call: Call,
    sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<(), CallError> {
    let bounds = ConnectBounds {
        connect: call.timeout,
        unacked: call.timeout,
    };
    let connection =
        transport::connect_within(call.address, call.tls, &H2Settings::default(), bounds).await?;
    let mut sender = connection.ready().await.map_err(CallError::Stream)?;
    let mut request = Request::post(call.uri)
        .body(())
        .map_err(CallError::Request)?;
    *request.headers_mut() = call.headers;
    let (response, mut send) = sender
        .send_request(request, false)
        .map_err(CallError::Stream)?;
    // A server that answers before reading the request (a refusal) resets the stream: the
    // response below says why, so a failed send is not the error to report.
    let _ = transport::send_data(
        &mut send,
        sluice_grpc::encode_message(false, &call.message),
        true,
    )
    .await;
    let response = response.await.map_err(CallError::Stream)?;
    if response.status() != StatusCode::OK {
        return Err(CallError::Http(response.status()));
    }
    if let Some(status) = status_of(response.headers()) {
        return ended(status);
    }
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .unwrap_or_default();
    if !content_type.starts_with("application/grpc") {
        return Err(CallError::NotGrpc(content_type));
    }
    let mut body = response.into_body();
    let mut decoder = FrameDecoder::new(MAX_REPLY_BYTES);
    while let Some(chunk) = transport::recv_data(&mut body).await {
        decoder.push(chunk.map_err(CallError::Stream)?);
        while let Some(message) = decoder.next_message()? {
            if message.compressed {
                return Err(CallError::Compressed);
            }
            sink(&message.data).map_err(CallError::Output)?;
        }
    }
    decoder.finish()?;
    let trailers = body.trailers().await.map_err(CallError::Stream)?;
    match trailers.as_ref().and_then(status_of) {
        Some(status) => ended(status),
        None => Err(CallError::NoStatus),
    }
}

fn ended(status: Status) -> Result<(), CallError> {
    if status.code == Code::Ok {
        Ok(())
    } else {
        Err(CallError::Status(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_map_as_grpc_says() {
        let code = |status: u16| http_code(StatusCode::from_u16(status).unwrap());
        assert_eq!(code(400), Code::Internal);
        assert_eq!(code(401), Code::Unauthenticated);
        assert_eq!(code(403), Code::PermissionDenied);
        assert_eq!(code(404), Code::Unimplemented);
        for unavailable in [429, 502, 503, 504] {
            assert_eq!(code(unavailable), Code::Unavailable);
        }
        assert_eq!(code(500), Code::Unknown);
    }

    #[test]
    fn reset_reasons_map_as_grpc_says() {
        let code = |reason: h2::Reason| reset_code(&h2::Error::from(reason));
        assert_eq!(code(h2::Reason::REFUSED_STREAM), Code::Unavailable);
        assert_eq!(code(h2::Reason::CANCEL), Code::Cancelled);
        assert_eq!(code(h2::Reason::ENHANCE_YOUR_CALM), Code::ResourceExhausted);
        assert_eq!(
            code(h2::Reason::INADEQUATE_SECURITY),
            Code::PermissionDenied
        );
        assert_eq!(code(h2::Reason::PROTOCOL_ERROR), Code::Internal);
    }

    #[test]
    fn a_status_is_read_with_its_message_decoded() {
        let mut headers = HeaderMap::new();
        assert_eq!(status_of(&headers), None);
        headers.insert("grpc-status", "16".parse().unwrap());
        headers.insert("grpc-message", "token%20expired".parse().unwrap());
        let status = status_of(&headers).unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (Code::Unauthenticated, "token expired")
        );
        headers.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(status_of(&headers).unwrap().code, Code::Unknown);
        assert!(ended(Status::new(Code::Ok, "")).is_ok());
        let error = ended(Status::new(Code::NotFound, "no agent")).unwrap_err();
        assert_eq!(error.code(), Some(Code::NotFound));
    }
}
