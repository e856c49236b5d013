//! Overload protection on the API server (docs/SECURITY.md, "Overload"): near the process's
//! memory or descriptor limit the listener stops accepting and new requests get 503
//! `ServiceUnavailable` with `Retry-After`, while requests in flight and open watches go on.
//! The verdict comes from `sluice-overload`'s monitor (one relaxed load per request).

use std::time::Duration;

use sluice_apimachinery::{StatusDetails, StatusError, StatusReason};
use sluice_overload::{Action, Role};

/// How often a paused accept loop looks again (the monitor samples every 250 ms by default).
const POLL: Duration = Duration::from_millis(50);

/// The refusal of a new request while the process sheds, counted.
pub(super) fn shed() -> Result<(), StatusError> {
    if !sluice_overload::shedding() {
        return Ok(());
    }
    sluice_overload::count_shed(Role::Apiserver);
    Err(unavailable(
        "the control plane is overloaded (near its memory or file-descriptor limit) and sheds new requests; retry later",
    ))
}

/// `/readyz` is not ready while any overload action is on, so a load balancer in front of
/// several replicas sends new clients elsewhere.
pub(super) fn readiness() -> Result<(), StatusError> {
    if Action::ALL.into_iter().any(sluice_overload::is_active) {
        return Err(unavailable(
            "overloaded: near the memory or file-descriptor limit",
        ));
    }
    Ok(())
}

/// Returns once the listener may accept again.
pub(super) async fn accepting() {
    while sluice_overload::stop_accepting() {
        tokio::time::sleep(POLL).await;
    }
}

fn unavailable(message: &str) -> StatusError {
    StatusError {
        details: Some(Box::new(StatusDetails {
            retry_after_seconds: Some(sluice_overload::RETRY_AFTER_SECONDS),
            ..StatusDetails::default()
        })),
        ..StatusError::new(StatusReason::ServiceUnavailable, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_request_is_a_503_that_says_when_to_retry() {
        let status = unavailable("x");
        assert_eq!(status.code, 503);
        assert_eq!(status.reason, StatusReason::ServiceUnavailable);
        assert_eq!(status.details.unwrap().retry_after_seconds, Some(1));
    }
}
