//! Every way the gateway itself ends a request, as one error type that knows its HTTP status,
//! its Kubernetes `Status` reason and whether the client should retry, and renders the
//! `Status` JSON body kubectl and client-go understand.

use std::sync::Arc;

use sluice_kube_status::{Outcome, StatusDetails as SharedDetails, StatusReason};

/// A request the gateway answers itself instead of forwarding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The TLS server name / Host names no configured cluster. 404 rather than upstream
    /// KubeGateway's 503: a name that is not configured will not start working on a retry.
    #[error("no upstream cluster is configured for host {host:?}")]
    UnknownHost { host: String },
    #[error("invalid request: {reason}")]
    BadRequest { reason: String },
    /// No usable credentials: no client certificate from the host's CA, a rejected bearer token,
    /// and anonymous access is off.
    #[error("Unauthorized")]
    Unauthorized,
    /// A client-sent Impersonate-* header that the SubjectAccessReview did not allow.
    #[error("{user:?} cannot impersonate {kind} {value:?}")]
    ImpersonationForbidden {
        user: String,
        kind: &'static str,
        value: String,
    },
    /// The cluster has dispatch policies and none matched. 403: the policies act like an
    /// allow-list, so retrying the same request cannot succeed.
    #[error("no dispatch policy of cluster {cluster:?} matches {verb} {path}")]
    NoDispatchPolicy {
        cluster: String,
        verb: &'static str,
        path: String,
    },
    /// A flow-control schema rejected the request; the gateway never queues. The schema name is
    /// shared with the compiled config, so rejecting under overload allocates nothing.
    #[error("too many requests: flow control schema {schema:?} is at its limit, retry later")]
    TooManyRequests { schema: Arc<str> },
    /// The request is over its user's fair share of the apiserver's streams or of long-running
    /// requests (see `fair_share.rs`); `level` is its flow-control schema, the priority level.
    #[error("too many requests: {refusal}, retry later")]
    FairShare {
        level: Option<Arc<str>>,
        refusal: crate::fair_share::FairShareRefusal,
    },
    /// This core already has as many TokenReviews in flight as the cluster allows: a new bearer
    /// token waits for a retry instead of amplifying into one more review.
    #[error("too many bearer tokens are being reviewed for cluster {cluster:?}, retry later")]
    TokenReviewsBusy { cluster: String },
    /// The client's address had too many bearer tokens rejected lately; its unknown tokens are
    /// not reviewed until its allowance refills.
    #[error("too many rejected bearer tokens from this address, retry in {retry_after}s")]
    AuthenticationFailuresLimited { retry_after: u32 },
    /// Every server of the matched upstream subset is down or disabled.
    #[error("no healthy upstream server for cluster {cluster:?}")]
    NoHealthyUpstream { cluster: String },
    /// TokenReview / SubjectAccessReview could not be asked (timeout, connection failure).
    #[error("authentication backend of cluster {cluster:?} is unavailable: {reason}")]
    AuthenticationUnavailable { cluster: String, reason: String },
    /// Forwarding to the chosen apiserver failed before any response byte reached the client.
    #[error("upstream {server} failed: {reason}")]
    UpstreamFailed { server: String, reason: String },
    #[error("internal error: {reason}")]
    Internal { reason: String },
}

/// The seconds a rejected client should wait: one, as kube-apiserver's max-inflight filter says.
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl GatewayError {
    pub fn http_status(&self) -> http::StatusCode {
        use http::StatusCode;
        match self {
            GatewayError::UnknownHost { .. } => StatusCode::NOT_FOUND,
            GatewayError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::ImpersonationForbidden { .. } | GatewayError::NoDispatchPolicy { .. } => {
                StatusCode::FORBIDDEN
            }
            GatewayError::TooManyRequests { .. }
            | GatewayError::FairShare { .. }
            | GatewayError::TokenReviewsBusy { .. }
            | GatewayError::AuthenticationFailuresLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::NoHealthyUpstream { .. }
            | GatewayError::AuthenticationUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `reason` of the Kubernetes `Status` (metav1.StatusReason).
    pub fn reason(&self) -> &'static str {
        self.status_reason().as_str()
    }

    fn status_reason(&self) -> StatusReason {
        match self {
            GatewayError::UnknownHost { .. } => StatusReason::NotFound,
            GatewayError::BadRequest { .. } => StatusReason::BadRequest,
            GatewayError::Unauthorized => StatusReason::Unauthorized,
            GatewayError::ImpersonationForbidden { .. } | GatewayError::NoDispatchPolicy { .. } => {
                StatusReason::Forbidden
            }
            GatewayError::TooManyRequests { .. }
            | GatewayError::FairShare { .. }
            | GatewayError::TokenReviewsBusy { .. }
            | GatewayError::AuthenticationFailuresLimited { .. } => StatusReason::TooManyRequests,
            GatewayError::NoHealthyUpstream { .. }
            | GatewayError::AuthenticationUnavailable { .. }
            | GatewayError::UpstreamFailed { .. } => StatusReason::ServiceUnavailable,
            GatewayError::Internal { .. } => StatusReason::InternalError,
        }
    }

    /// `Retry-After` seconds for errors a retry can fix.
    pub fn retry_after_seconds(&self) -> Option<u32> {
        match self {
            GatewayError::TooManyRequests { .. }
            | GatewayError::FairShare { .. }
            | GatewayError::TokenReviewsBusy { .. }
            | GatewayError::NoHealthyUpstream { .. }
            | GatewayError::AuthenticationUnavailable { .. }
            | GatewayError::UpstreamFailed { .. } => Some(RETRY_AFTER_SECONDS),
            GatewayError::AuthenticationFailuresLimited { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    pub fn to_status(&self) -> Status {
        Status {
            kind: sluice_kube_status::KIND,
            api_version: sluice_kube_status::API_VERSION,
            metadata: EmptyObject {},
            status: Outcome::Failure.as_str(),
            message: self.to_string(),
            reason: self.reason(),
            details: self.retry_after_seconds().map(|seconds| StatusDetails {
                retry_after_seconds: seconds,
            }),
            code: self.http_status().as_u16(),
        }
    }

    /// The JSON body (`Content-Type: application/json`).
    pub fn status_body(&self) -> Vec<u8> {
        self.to_status().into_body()
    }
}

impl From<crate::request_info::RequestInfoError> for GatewayError {
    /// kube-apiserver answers 500 here; the path is the client's mistake, so the gateway says
    /// 400.
    fn from(error: crate::request_info::RequestInfoError) -> Self {
        GatewayError::BadRequest {
            reason: error.to_string(),
        }
    }
}

impl From<crate::request_info::PathError> for GatewayError {
    /// A path that does not decode to exactly one path: 400, naming what is wrong with it.
    fn from(error: crate::request_info::PathError) -> Self {
        GatewayError::BadRequest {
            reason: error.to_string(),
        }
    }
}

impl From<crate::identity::IdentityError> for GatewayError {
    fn from(error: crate::identity::IdentityError) -> Self {
        use crate::identity::IdentityError;
        match error {
            // A certificate the TLS layer accepted but that names no user.
            IdentityError::Certificate(_) | IdentityError::EmptyCommonName => {
                GatewayError::Unauthorized
            }
            // Malformed client Impersonate-* headers, or an identity that cannot be encoded.
            other => GatewayError::BadRequest {
                reason: other.to_string(),
            },
        }
    }
}

/// Kubernetes `metav1.Status` as the gateway builds it: a fixed shape (no `details` but
/// `retryAfterSeconds`, constant `kind` and `status`) that the shared `sluice-kube-status`
/// encoder writes, so the gateway's bytes are the control plane's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: EmptyObject,
    pub status: &'static str,
    pub message: String,
    pub reason: &'static str,
    pub details: Option<StatusDetails>,
    pub code: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmptyObject {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusDetails {
    pub retry_after_seconds: u32,
}

impl Status {
    /// The shared `Status` this one stands for (`kind`, `apiVersion` and `metadata` are the
    /// encoder's constants; a `status` other than "Success" is a failure).
    pub fn into_shared(self) -> sluice_kube_status::Status {
        let outcome = match self.status {
            "Success" => Outcome::Success,
            _ => Outcome::Failure,
        };
        sluice_kube_status::Status {
            outcome,
            message: self.message,
            reason: self.reason.into(),
            details: self
                .details
                .map(|details| SharedDetails::retry_after(details.retry_after_seconds)),
            code: self.code,
        }
    }

    /// The JSON body, written by the shared encoder.
    pub fn into_body(self) -> Vec<u8> {
        self.into_shared().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(error: &GatewayError) -> serde_json::Value {
        serde_json::from_slice(&error.status_body()).unwrap()
    }

    #[test]
    fn too_many_requests_is_429_with_retry_after() {
        let error = GatewayError::TooManyRequests {
            schema: "slow".into(),
        };
        assert_eq!(error.http_status(), 429);
        assert_eq!(error.retry_after_seconds(), Some(1));
        assert_eq!(
            body(&error),
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too many requests: flow control schema \"slow\" is at its limit, retry later",
                "reason": "TooManyRequests", "details": {"retryAfterSeconds": 1}, "code": 429
            })
        );
    }

    #[test]
    fn bodies_are_the_shared_encoders_bytes_and_decode_back() {
        let error = GatewayError::TooManyRequests {
            schema: "slow".into(),
        };
        // The bytes the gateway wrote before the encoder was shared: same keys, same order.
        assert_eq!(
            String::from_utf8(error.status_body()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too many requests: flow control schema \"slow\" is at its limit, retry later","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#
        );
        let unauthorized = GatewayError::Unauthorized.status_body();
        assert_eq!(
            String::from_utf8(unauthorized.clone()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
        let decoded = sluice_kube_status::Status::decode(&unauthorized).unwrap();
        assert_eq!(
            decoded,
            GatewayError::Unauthorized.to_status().into_shared()
        );
        assert_eq!(decoded.known_reason(), Some(StatusReason::Unauthorized));
    }

    #[test]
    fn every_error_maps_to_code_and_reason() {
        let cases = [
            (
                GatewayError::UnknownHost { host: "x".into() },
                404,
                "NotFound",
                None,
            ),
            (
                GatewayError::BadRequest { reason: "r".into() },
                400,
                "BadRequest",
                None,
            ),
            (GatewayError::Unauthorized, 401, "Unauthorized", None),
            (
                GatewayError::ImpersonationForbidden {
                    user: "alice".into(),
                    kind: "user",
                    value: "bob".into(),
                },
                403,
                "Forbidden",
                None,
            ),
            (
                GatewayError::NoDispatchPolicy {
                    cluster: "c".into(),
                    verb: "get",
                    path: "/x".into(),
                },
                403,
                "Forbidden",
                None,
            ),
            (
                GatewayError::NoHealthyUpstream {
                    cluster: "c".into(),
                },
                503,
                "ServiceUnavailable",
                Some(1),
            ),
            (
                GatewayError::AuthenticationUnavailable {
                    cluster: "c".into(),
                    reason: "timeout".into(),
                },
                503,
                "ServiceUnavailable",
                Some(1),
            ),
            (
                GatewayError::UpstreamFailed {
                    server: "https://a".into(),
                    reason: "reset".into(),
                },
                502,
                "ServiceUnavailable",
                Some(1),
            ),
            (
                GatewayError::Internal { reason: "r".into() },
                500,
                "InternalError",
                None,
            ),
        ];
        for (error, code, reason, retry) in cases {
            let json = body(&error);
            assert_eq!(json["code"], code, "{error:?}");
            assert_eq!(json["reason"], reason, "{error:?}");
            assert_eq!(json["kind"], "Status");
            assert_eq!(json["status"], "Failure");
            assert_eq!(json["message"], error.to_string());
            assert_eq!(error.http_status().as_u16(), code);
            assert_eq!(error.retry_after_seconds(), retry, "{error:?}");
        }
    }

    #[test]
    fn phase_errors_convert_to_gateway_errors() {
        use crate::identity::IdentityError;
        use crate::request_info::RequestInfo;
        let path_error = RequestInfo::parse("GET", "/api/v1/watch", "").unwrap_err();
        assert_eq!(GatewayError::from(path_error).http_status(), 400);
        assert_eq!(
            GatewayError::from(IdentityError::EmptyCommonName),
            GatewayError::Unauthorized
        );
        let header_error = IdentityError::ImpersonationWithoutUser {
            header: "impersonate-group".into(),
        };
        assert_eq!(GatewayError::from(header_error).reason(), "BadRequest");
    }

    #[test]
    fn impersonation_message_names_user_and_target() {
        let error = GatewayError::ImpersonationForbidden {
            user: "alice".into(),
            kind: "group",
            value: "system:masters".into(),
        };
        assert_eq!(
            error.to_string(),
            "\"alice\" cannot impersonate group \"system:masters\""
        );
    }
}
