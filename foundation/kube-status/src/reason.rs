//! The `reason` of a `Status` (client-go `metav1.StatusReason`) with the code it is served with.

/// The reasons Sluice sends. A decoded `Status` keeps its reason as text (a Kubernetes server
/// may send reasons Sluice never sends); [`StatusReason::parse`] names the known ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusReason {
    /// 404: the object or the path does not exist.
    NotFound,
    /// 409: create of a name that exists.
    AlreadyExists,
    /// 409: a write with a stale resourceVersion.
    Conflict,
    /// 422: the object failed validation; `details.causes` name the fields.
    Invalid,
    /// 400: the request itself is malformed (selector, continue token, body).
    BadRequest,
    /// 403: authenticated but not allowed.
    Forbidden,
    /// 401: no valid credentials.
    Unauthorized,
    /// 410 `Gone`: the resource is gone for good.
    Gone,
    /// 410 `Expired`: the resourceVersion or continue token was compacted away.
    Expired,
    /// 405: the verb is not served for this resource.
    MethodNotAllowed,
    /// 415: the request body's content type is not accepted.
    UnsupportedMediaType,
    /// 406: none of the `Accept` alternatives can be served.
    NotAcceptable,
    /// 413: the request body is too large.
    RequestEntityTooLarge,
    /// 500: a bug or a store failure.
    InternalError,
    /// 503: the store or the upstream is not reachable.
    ServiceUnavailable,
    /// 429: rate limited.
    TooManyRequests,
    /// 507 Insufficient Storage: the store's quota is full (etcd's `NOSPACE`). Kubernetes
    /// has no reason for it (it answers etcd's error as a 500); a reason of its own lets
    /// clients and alerts tell "full" from "broken".
    StorageQuotaExceeded,
}

impl StatusReason {
    /// Every reason, in declaration order.
    pub const ALL: [StatusReason; 17] = [
        Self::NotFound,
        Self::AlreadyExists,
        Self::Conflict,
        Self::Invalid,
        Self::BadRequest,
        Self::Forbidden,
        Self::Unauthorized,
        Self::Gone,
        Self::Expired,
        Self::MethodNotAllowed,
        Self::UnsupportedMediaType,
        Self::NotAcceptable,
        Self::RequestEntityTooLarge,
        Self::InternalError,
        Self::ServiceUnavailable,
        Self::TooManyRequests,
        Self::StorageQuotaExceeded,
    ];

    /// The wire name of the reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "NotFound",
            Self::AlreadyExists => "AlreadyExists",
            Self::Conflict => "Conflict",
            Self::Invalid => "Invalid",
            Self::BadRequest => "BadRequest",
            Self::Forbidden => "Forbidden",
            Self::Unauthorized => "Unauthorized",
            Self::Gone => "Gone",
            Self::Expired => "Expired",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::UnsupportedMediaType => "UnsupportedMediaType",
            Self::NotAcceptable => "NotAcceptable",
            Self::RequestEntityTooLarge => "RequestEntityTooLarge",
            Self::InternalError => "InternalError",
            Self::ServiceUnavailable => "ServiceUnavailable",
            Self::TooManyRequests => "TooManyRequests",
            Self::StorageQuotaExceeded => "StorageQuotaExceeded",
        }
    }

    /// The reason a wire name stands for, `None` for one Sluice does not send.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == text)
    }

    /// The HTTP status code the reason is served with (the gateway answers an upstream failure
    /// `ServiceUnavailable` with 502: the code is the caller's, this is the usual one).
    pub const fn code(self) -> u16 {
        match self {
            Self::NotFound => 404,
            Self::AlreadyExists | Self::Conflict => 409,
            Self::Invalid => 422,
            Self::BadRequest => 400,
            Self::Forbidden => 403,
            Self::Unauthorized => 401,
            Self::Gone | Self::Expired => 410,
            Self::MethodNotAllowed => 405,
            Self::UnsupportedMediaType => 415,
            Self::NotAcceptable => 406,
            Self::RequestEntityTooLarge => 413,
            Self::InternalError => 500,
            Self::ServiceUnavailable => 503,
            Self::TooManyRequests => 429,
            Self::StorageQuotaExceeded => 507,
        }
    }

    /// Whether the same request may succeed if the client retries it unchanged (after
    /// re-reading for a conflict, after a pause for the others). Expired is not: the client
    /// must re-list; nor is a full store: a write succeeds again only once space is freed.
    pub const fn retryable(self) -> bool {
        matches!(
            self,
            Self::Conflict | Self::ServiceUnavailable | Self::TooManyRequests | Self::InternalError
        )
    }
}

impl std::fmt::Display for StatusReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_parses_back_from_its_wire_name() {
        for reason in StatusReason::ALL {
            assert_eq!(StatusReason::parse(reason.as_str()), Some(reason));
            assert_eq!(reason.to_string(), reason.as_str());
        }
        assert_eq!(
            StatusReason::parse("notfound"),
            None,
            "names are case-sensitive"
        );
        assert_eq!(StatusReason::parse("Timeout"), None);
    }

    #[test]
    fn codes_and_retries_are_kube_apiservers() {
        let table = [
            (StatusReason::NotFound, 404, false),
            (StatusReason::Conflict, 409, true),
            (StatusReason::Invalid, 422, false),
            (StatusReason::Expired, 410, false),
            (StatusReason::TooManyRequests, 429, true),
            (StatusReason::ServiceUnavailable, 503, true),
            (StatusReason::InternalError, 500, true),
            (StatusReason::StorageQuotaExceeded, 507, false),
        ];
        for (reason, code, retry) in table {
            assert_eq!(
                (reason.code(), reason.retryable()),
                (code, retry),
                "{reason}"
            );
        }
    }
}
