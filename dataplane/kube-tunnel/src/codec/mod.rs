//! The `MakeRequest` messages: bounded decoding into typed heads (method, origin-form path,
//! headers) with one typed error per violated bound, the encoders, and [`ExchangeOrder`], the
//! order an exchange's messages may come in.
//!
//! Both ends treat what they decode as hostile (the agent what the tunnel brings it, the gateway
//! what the agent answers): a message's size is checked before protobuf decoding, and a head's
//! field count before its fields are allocated.

mod order;
mod scan;
mod validate;

#[cfg(test)]
mod tests;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use prost::Message as _;
use sluice_proto::kubernetes::v1::{
    http_request, http_response, HeaderField, HttpRequest, HttpResponse,
};

pub use order::{ExchangeOrder, MessageKind};
pub use validate::check_path;

/// The bounds of one exchange's messages. Every one is checked on decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeLimits {
    /// A request method's bytes (an HTTP token).
    pub max_method_bytes: usize,
    /// A request path's bytes (origin-form: path and query).
    pub max_path_bytes: usize,
    /// Header fields in one head (a name repeated per value counts once per value).
    pub max_header_fields: usize,
    /// The names and values of one head's header fields, together.
    pub max_header_bytes: usize,
    /// The gateway's assertion in a request head.
    pub max_assertion_bytes: usize,
    /// One data or upgrade-data chunk.
    pub max_data_bytes: usize,
}

impl Default for ExchangeLimits {
    fn default() -> Self {
        Self {
            max_method_bytes: 16,
            max_path_bytes: 8 * 1024,
            max_header_fields: 256,
            max_header_bytes: 64 * 1024,
            max_assertion_bytes: 16 * 1024,
            max_data_bytes: 1024 * 1024,
        }
    }
}

/// Protobuf framing around one header field (its tag and length, its name's and value's tags
/// and lengths) is at most this many bytes at the default bounds; the head bound allows it
/// generously so that a head at every bound at once always fits.
const FIELD_OVERHEAD: usize = 16;
/// Tags and lengths of a message's own fields.
const MESSAGE_OVERHEAD: usize = 64;

impl ExchangeLimits {
    /// The most bytes one encoded head may have: every bound at once plus protobuf framing.
    pub fn max_head_bytes(&self) -> usize {
        self.max_method_bytes
            + self.max_path_bytes
            + self.max_assertion_bytes
            + self.max_header_bytes
            + self.max_header_fields * FIELD_OVERHEAD
            + MESSAGE_OVERHEAD
    }

    /// The most bytes one encoded message may have: the larger of a head and a data chunk.
    pub fn max_message_bytes(&self) -> usize {
        self.max_head_bytes()
            .max(self.max_data_bytes + MESSAGE_OVERHEAD)
    }
}

/// Why a message was refused. Every variant is the peer's fault: INVALID_ARGUMENT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("message of {len} bytes exceeds the bound of {limit}")]
    MessageTooLarge { len: usize, limit: usize },
    #[error("head of {len} bytes exceeds the bound of {limit}")]
    HeadTooLarge { len: usize, limit: usize },
    #[error("malformed protobuf message: {0}")]
    Malformed(String),
    #[error("message sets none of head, data, end and upgrade_data")]
    Empty,
    #[error("method {0:?} is not an HTTP token")]
    InvalidMethod(String),
    #[error("method of {len} bytes exceeds the bound of {limit}")]
    MethodTooLong { len: usize, limit: usize },
    #[error("path of {len} bytes exceeds the bound of {limit}")]
    PathTooLong { len: usize, limit: usize },
    #[error("path is not origin-form: {0}")]
    InvalidPath(&'static str),
    #[error("{count} header fields exceed the bound of {limit}")]
    TooManyHeaders { count: usize, limit: usize },
    #[error("header names and values of {len} bytes exceed the bound of {limit}")]
    HeadersTooLarge { len: usize, limit: usize },
    #[error("header name {0:?} is not a lowercase HTTP header name")]
    InvalidHeaderName(String),
    #[error("header {0} has a value HTTP does not allow")]
    InvalidHeaderValue(String),
    #[error("assertion of {len} bytes exceeds the bound of {limit}")]
    AssertionTooLarge { len: usize, limit: usize },
    #[error("data chunk of {len} bytes exceeds the bound of {limit}")]
    DataTooLarge { len: usize, limit: usize },
    #[error("status {0} is neither 101 nor a final HTTP status")]
    InvalidStatus(u32),
    #[error("{side} {message} may not come {when}")]
    OutOfOrder {
        side: &'static str,
        message: &'static str,
        when: &'static str,
    },
}

impl CodecError {
    /// A bounded label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::HeadTooLarge { .. } => "head_too_large",
            Self::Malformed(_) => "malformed",
            Self::Empty => "empty_message",
            Self::InvalidMethod(_) => "invalid_method",
            Self::MethodTooLong { .. } => "method_too_long",
            Self::PathTooLong { .. } => "path_too_long",
            Self::InvalidPath(_) => "invalid_path",
            Self::TooManyHeaders { .. } => "too_many_headers",
            Self::HeadersTooLarge { .. } => "headers_too_large",
            Self::InvalidHeaderName(_) => "invalid_header_name",
            Self::InvalidHeaderValue(_) => "invalid_header_value",
            Self::AssertionTooLarge { .. } => "assertion_too_large",
            Self::DataTooLarge { .. } => "data_too_large",
            Self::InvalidStatus(_) => "invalid_status",
            Self::OutOfOrder { .. } => "out_of_order",
        }
    }

    /// The gRPC status the exchange ends with: the message is the sender's fault.
    pub fn grpc_code(&self) -> u32 {
        crate::grpc_code::INVALID_ARGUMENT
    }
}

/// A request head: what the agent replays against its apiserver (after checking `assertion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// Origin-form (see [`check_path`]): the agent joins it to its own apiserver URL.
    pub path: String,
    pub headers: HeaderMap,
    /// The gateway's signed assertion of the user (see [`crate::assertion`]).
    pub assertion: String,
}

/// One message of the gateway's request stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestMessage {
    Head(RequestHead),
    Data(Bytes),
    End,
    UpgradeData(Bytes),
}

/// The apiserver's response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
}

/// One message of the agent's response stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseMessage {
    Head(ResponseHead),
    Data(Bytes),
    End,
    UpgradeData(Bytes),
}

impl RequestMessage {
    pub fn kind(&self) -> MessageKind {
        match self {
            Self::Head(_) => MessageKind::Head,
            Self::Data(_) => MessageKind::Data,
            Self::End => MessageKind::End,
            Self::UpgradeData(_) => MessageKind::UpgradeData,
        }
    }
}

impl ResponseMessage {
    pub fn kind(&self) -> MessageKind {
        match self {
            Self::Head(_) => MessageKind::Head,
            Self::Data(_) => MessageKind::Data,
            Self::End => MessageKind::End,
            Self::UpgradeData(_) => MessageKind::UpgradeData,
        }
    }
}

/// Decodes one request message (protobuf bytes, without the gRPC prefix).
pub fn decode_request(bytes: &[u8], limits: &ExchangeLimits) -> Result<RequestMessage, CodecError> {
    scan::check_bounds(bytes, limits, 3)?;
    let message =
        HttpRequest::decode(bytes).map_err(|error| CodecError::Malformed(error.to_string()))?;
    match message.message.ok_or(CodecError::Empty)? {
        http_request::Message::Head(head) => {
            let method = validate::method(&head.method, limits)?;
            validate::check_path(&head.path, limits)?;
            let headers = validate::headers(head.headers, limits)?;
            if head.assertion.len() > limits.max_assertion_bytes {
                return Err(CodecError::AssertionTooLarge {
                    len: head.assertion.len(),
                    limit: limits.max_assertion_bytes,
                });
            }
            Ok(RequestMessage::Head(RequestHead {
                method,
                path: head.path,
                headers,
                assertion: head.assertion,
            }))
        }
        http_request::Message::Data(data) => {
            Ok(RequestMessage::Data(validate::data(data.data, limits)?))
        }
        http_request::Message::End(_) => Ok(RequestMessage::End),
        http_request::Message::UpgradeData(data) => Ok(RequestMessage::UpgradeData(
            validate::data(data.data, limits)?,
        )),
    }
}

/// Decodes one response message (protobuf bytes, without the gRPC prefix).
pub fn decode_response(
    bytes: &[u8],
    limits: &ExchangeLimits,
) -> Result<ResponseMessage, CodecError> {
    scan::check_bounds(bytes, limits, 2)?;
    let message =
        HttpResponse::decode(bytes).map_err(|error| CodecError::Malformed(error.to_string()))?;
    match message.message.ok_or(CodecError::Empty)? {
        http_response::Message::Head(head) => Ok(ResponseMessage::Head(ResponseHead {
            status: validate::status(head.status)?,
            headers: validate::headers(head.headers, limits)?,
        })),
        http_response::Message::Data(data) => {
            Ok(ResponseMessage::Data(validate::data(data.data, limits)?))
        }
        http_response::Message::End(_) => Ok(ResponseMessage::End),
        http_response::Message::UpgradeData(data) => Ok(ResponseMessage::UpgradeData(
            validate::data(data.data, limits)?,
        )),
    }
}

fn header_fields(headers: &HeaderMap) -> Vec<HeaderField> {
    headers
        .iter()
        .map(|(name, value)| HeaderField {
            name: name.as_str().to_string(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        })
        .collect()
}

fn request(message: http_request::Message) -> Bytes {
    Bytes::from(
        HttpRequest {
            message: Some(message),
        }
        .encode_to_vec(),
    )
}

fn response(message: http_response::Message) -> Bytes {
    Bytes::from(
        HttpResponse {
            message: Some(message),
        }
        .encode_to_vec(),
    )
}

/// A request head's protobuf bytes. The caller passes what [`decode_request`] accepts (an
/// origin-form path, an assertion within its bound): the agent checks it again.
pub fn encode_request_head(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    assertion: &str,
) -> Bytes {
    request(http_request::Message::Head(http_request::Head {
        method: method.as_str().to_string(),
        path: path.to_string(),
        headers: header_fields(headers),
        assertion: assertion.to_string(),
    }))
}

pub fn encode_request_data(data: Bytes) -> Bytes {
    request(http_request::Message::Data(http_request::Data { data }))
}

pub fn encode_request_end() -> Bytes {
    request(http_request::Message::End(http_request::End {}))
}

pub fn encode_request_upgrade_data(data: Bytes) -> Bytes {
    request(http_request::Message::UpgradeData(http_request::Data {
        data,
    }))
}

pub fn encode_response_head(status: StatusCode, headers: &HeaderMap) -> Bytes {
    response(http_response::Message::Head(http_response::Head {
        status: u32::from(status.as_u16()),
        headers: header_fields(headers),
    }))
}

pub fn encode_response_data(data: Bytes) -> Bytes {
    response(http_response::Message::Data(http_response::Data { data }))
}

pub fn encode_response_end() -> Bytes {
    response(http_response::Message::End(http_response::End {}))
}

pub fn encode_response_upgrade_data(data: Bytes) -> Bytes {
    response(http_response::Message::UpgradeData(http_response::Data {
        data,
    }))
}
