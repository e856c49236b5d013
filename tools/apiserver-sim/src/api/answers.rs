//! The simulator's answers: JSON objects, `Status` failures and plain text, with the headers a
//! Go apiserver would send.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::Value;
use sluice_kube_status::Status;

use crate::body::ResponseBody;

pub(super) fn ok_json(value: Value) -> Response<ResponseBody> {
    json_response(StatusCode::OK, &value)
}

fn json_response(code: StatusCode, value: &Value) -> Response<ResponseBody> {
    json_bytes(code, Bytes::from(value.to_string()))
}

/// A kube-apiserver is a Go server, which sets Content-Length itself when the handler's
/// answer fits its first 4 KiB write buffer, and streams a larger one without it.
const GO_CONTENT_LENGTH_BELOW: usize = 4096;

pub(super) fn json_bytes(code: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let length = body.len();
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if length < GO_CONTENT_LENGTH_BELOW {
        headers.insert(http::header::CONTENT_LENGTH, length.into());
    }
    response
}

pub(super) fn plain(code: StatusCode, text: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(text));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A failure `Status` from the shared encoder; as a JSON value its keys come out sorted, as
/// this simulator always wrote them.
pub(super) fn status(code: StatusCode, reason: &str, message: &str) -> Response<ResponseBody> {
    let status = Status::failure_with_code(code.as_u16(), reason.to_string(), message);
    json_response(code, &status.to_value())
}

pub(super) fn not_found(path: &str) -> Response<ResponseBody> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("the simulator does not serve {path}"),
    )
}

pub(super) fn object_not_found(resource: &str, name: &str) -> Response<ResponseBody> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{resource} \"{name}\" not found"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_with_sorted_keys_as_before() {
        let status = Status::failure_with_code(404, "NotFound".to_string(), "pods \"a\" not found");
        assert_eq!(
            status.to_value().to_string(),
            r#"{"apiVersion":"v1","code":404,"kind":"Status","message":"pods \"a\" not found","metadata":{},"reason":"NotFound","status":"Failure"}"#
        );
    }
}
