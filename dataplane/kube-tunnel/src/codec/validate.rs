//! The checks of a head's fields: method, path, headers, status, data chunk sizes.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use sluice_proto::kubernetes::v1::HeaderField;

use super::{CodecError, ExchangeLimits};

/// Longest name quoted back in an error: names are bounded only by the headers' total.
const QUOTED_NAME_BYTES: usize = 64;

pub(super) fn method(method: &str, limits: &ExchangeLimits) -> Result<Method, CodecError> {
    if method.len() > limits.max_method_bytes {
        return Err(CodecError::MethodTooLong {
            len: method.len(),
            limit: limits.max_method_bytes,
        });
    }
    Method::from_bytes(method.as_bytes()).map_err(|_| CodecError::InvalidMethod(method.to_string()))
}

/// Whether `path` is an origin-form request target (RFC 9112 3.2.1: absolute path and query)
/// that joined to the agent's apiserver URL can name nothing but a path on that apiserver: it
/// starts with `/` but not `//` (a network-path reference names a host), has no fragment and
/// no byte outside visible ASCII (no whitespace, controls or raw UTF-8: those are
/// percent-encoded), and no backslash (which some servers read as `/`).
pub fn check_path(path: &str, limits: &ExchangeLimits) -> Result<(), CodecError> {
    if path.len() > limits.max_path_bytes {
        return Err(CodecError::PathTooLong {
            len: path.len(),
            limit: limits.max_path_bytes,
        });
    }
    if !path.starts_with('/') {
        return Err(CodecError::InvalidPath("it does not start with /"));
    }
    if path.starts_with("//") {
        return Err(CodecError::InvalidPath("it starts with // (an authority)"));
    }
    if let Some(byte) = path.bytes().find(|byte| !byte.is_ascii_graphic()) {
        return Err(CodecError::InvalidPath(if byte.is_ascii_whitespace() {
            "it contains whitespace"
        } else {
            "it contains a control or non-ASCII byte"
        }));
    }
    if path.contains('#') {
        return Err(CodecError::InvalidPath("it contains a fragment"));
    }
    if path.contains('\\') {
        return Err(CodecError::InvalidPath("it contains a backslash"));
    }
    http::uri::PathAndQuery::from_maybe_shared(Bytes::copy_from_slice(path.as_bytes()))
        .map_err(|_| CodecError::InvalidPath("it is not a URI path and query"))?;
    Ok(())
}

pub(super) fn headers(
    fields: Vec<HeaderField>,
    limits: &ExchangeLimits,
) -> Result<HeaderMap, CodecError> {
    if fields.len() > limits.max_header_fields {
        return Err(CodecError::TooManyHeaders {
            count: fields.len(),
            limit: limits.max_header_fields,
        });
    }
    let len: usize = fields
        .iter()
        .map(|field| field.name.len() + field.value.len())
        .sum();
    if len > limits.max_header_bytes {
        return Err(CodecError::HeadersTooLarge {
            len,
            limit: limits.max_header_bytes,
        });
    }
    let mut headers = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_lowercase(field.name.as_bytes())
            .map_err(|_| CodecError::InvalidHeaderName(quoted(&field.name)))?;
        let value = HeaderValue::from_maybe_shared(field.value)
            .map_err(|_| CodecError::InvalidHeaderValue(name.as_str().to_string()))?;
        headers.append(name, value);
    }
    Ok(headers)
}

fn quoted(name: &str) -> String {
    name.char_indices()
        .take_while(|(index, _)| *index < QUOTED_NAME_BYTES)
        .map(|(_, char)| char)
        .collect()
}

pub(super) fn data(data: Bytes, limits: &ExchangeLimits) -> Result<Bytes, CodecError> {
    if data.len() > limits.max_data_bytes {
        return Err(CodecError::DataTooLarge {
            len: data.len(),
            limit: limits.max_data_bytes,
        });
    }
    Ok(data)
}

/// 101 (the upgrade) or a final status: other 1xx are the HTTP client's business, never sent
/// through the tunnel.
pub(super) fn status(status: u32) -> Result<StatusCode, CodecError> {
    u16::try_from(status)
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .filter(|code| *code == StatusCode::SWITCHING_PROTOCOLS || !code.is_informational())
        .ok_or(CodecError::InvalidStatus(status))
}
