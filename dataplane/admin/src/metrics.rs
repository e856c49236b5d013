use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Admin-endpoint metrics. The admin endpoint runs on one thread, so plain atomics suffice.
#[derive(Debug, Clone)]
pub struct AdminMetrics {
    bad_requests: Family<ReasonLabels, Counter>,
}

impl AdminMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let bad_requests = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "sluice_admin_bad_requests",
            "Admin requests refused, by reason (malformed, too_large, body, timeout, truncated, method)",
            bad_requests.clone(),
        );
        Self { bad_requests }
    }

    pub(crate) fn bad_request(&self, reason: &'static str) {
        self.bad_requests
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}
