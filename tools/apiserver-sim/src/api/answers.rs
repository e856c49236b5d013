//! The simulator's answers: JSON objects, `Status` failures and plain text, with the headers a
//! Go apiserver would send.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Value};

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

pub(super) fn status(code: StatusCode, reason: &str, message: &str) -> Response<ResponseBody> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16(),
        }),
    )
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
