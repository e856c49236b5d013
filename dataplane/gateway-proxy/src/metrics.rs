//! Gateway metrics. Hot-path counters are per core (`sluice-metrics`); the labelled request
//! family is looked up once per label set per core and cached by the handler, with a bound on
//! distinct label sets so clients cannot grow it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_metrics::{Cores, PerCoreCounter, PerCoreGauge, PerCoreHistogram};

use crate::error::REJECT_REASONS;

/// Distinct (cluster, resource) pairs given their own label; later resources count as "other".
const MAX_RESOURCE_LABELS: usize = 500;
/// Longest resource label: a Kubernetes resource (plural) is a DNS label.
pub const MAX_RESOURCE_LABEL_BYTES: usize = 63;

/// The `resource` label for a resource name: itself when it could be a Kubernetes resource
/// (a DNS label: at most 63 of `a-z0-9-.`), `other` otherwise. Callers label only after
/// authentication (see `handler::resource_label`).
pub fn bounded_resource_label(resource: &str) -> &str {
    let plausible = resource.len() <= MAX_RESOURCE_LABEL_BYTES
        && resource
            .bytes()
            .all(|byte| matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'));
    if plausible {
        resource
    } else {
        "other"
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    cluster: String,
    verb: &'static str,
    resource: String,
    code: u16,
}

/// The latency's label: a cluster name from the gateway's configuration.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    requests: Family<RequestLabels, PerCoreCounter, Cores>,
    resources: Arc<Mutex<HashSet<(String, String)>>>,
    rejected: Vec<PerCoreCounter>,
    duration: Family<ClusterLabels, PerCoreHistogram, Cores>,
    pub in_flight: PerCoreGauge,
    pub upstream_connections: PerCoreGauge,
    pub auth_cache_hits: PerCoreCounter,
    pub auth_cache_misses: PerCoreCounter,
    pub refusal_logs_suppressed: PerCoreCounter,
    pub upgrade_early_dropped: PerCoreCounter,
    /// Forwarded requests by cluster, server kind and result; answer-head latency.
    pub forward: crate::forward_metrics::ForwardFamilies,
    /// Fair shares of upstream streams, per priority level.
    pub fair: crate::fair_metrics::FairShareMetrics,
    pub reloads_ok: Counter,
    pub reloads_failed: Counter,
}

impl GatewayMetrics {
    pub fn register(registry: &mut Registry, workers: usize) -> Self {
        let rejected_family = Family::<ReasonLabels, PerCoreCounter, Cores>::new_with_constructor(
            Cores::new(workers),
        );
        let auth_family = Family::<ResultLabels, PerCoreCounter, Cores>::new_with_constructor(
            Cores::new(workers),
        );
        let reload_family = Family::<ResultLabels, Counter>::default();
        // One statement per lookup: get_or_create returns a read guard, and a second lookup
        // in the same expression would wait for it forever.
        let auth_cache_hits = auth_family
            .get_or_create(&ResultLabels { result: "hit" })
            .clone();
        let auth_cache_misses = auth_family
            .get_or_create(&ResultLabels { result: "miss" })
            .clone();
        let reloads_ok = reload_family
            .get_or_create(&ResultLabels { result: "ok" })
            .clone();
        let reloads_failed = reload_family
            .get_or_create(&ResultLabels { result: "error" })
            .clone();
        let rejected = REJECT_REASONS
            .iter()
            .map(|reason| {
                rejected_family
                    .get_or_create(&ReasonLabels { reason })
                    .clone()
            })
            .collect();
        let metrics = Self {
            requests: Family::new_with_constructor(Cores::new(workers)),
            resources: Arc::default(),
            rejected,
            duration: Family::new_with_constructor(Cores::new(workers)),
            in_flight: PerCoreGauge::new(workers),
            upstream_connections: PerCoreGauge::new(workers),
            auth_cache_hits,
            auth_cache_misses,
            refusal_logs_suppressed: PerCoreCounter::new(workers),
            upgrade_early_dropped: PerCoreCounter::new(workers),
            forward: crate::forward_metrics::ForwardFamilies::register(registry, workers),
            fair: crate::fair_metrics::FairShareMetrics::register(registry, workers),
            reloads_ok,
            reloads_failed,
        };
        registry.register(
            "sluice_gateway_requests",
            "Requests through the gateway, by cluster, verb, resource and HTTP status",
            metrics.requests.clone(),
        );
        registry.register(
            "sluice_gateway_request_duration_seconds",
            "Time from a request's arrival to its response head (whole body for short requests), \
             by cluster",
            metrics.duration.clone(),
        );
        registry.register(
            "sluice_gateway_in_flight_requests",
            "Requests being served now",
            metrics.in_flight.clone(),
        );
        registry.register(
            "sluice_gateway_rejected",
            "Requests the gateway answered itself, by reason",
            rejected_family,
        );
        registry.register(
            "sluice_gateway_refusal_logs_suppressed",
            "Refusal log lines not written because a core wrote its limit for the second",
            metrics.refusal_logs_suppressed.clone(),
        );
        registry.register(
            "sluice_gateway_upgrade_early_bytes_dropped",
            "Upgrade requests whose bytes sent behind the head were dropped because the apiserver did not switch protocols",
            metrics.upgrade_early_dropped.clone(),
        );
        registry.register(
            "sluice_gateway_upstream_connections",
            "HTTP/2 connections open to apiservers",
            metrics.upstream_connections.clone(),
        );
        registry.register(
            "sluice_gateway_auth_cache",
            "TokenReview cache lookups, by result",
            auth_family,
        );
        registry.register(
            "sluice_gateway_config_reloads",
            "Cluster directory reloads, by result (an error keeps the last good config)",
            reload_family,
        );
        metrics
    }

    /// The latency histogram of `cluster` (a configured cluster's name, as in
    /// `sluice_gateway_requests_total`); callers cache it per core.
    pub fn duration(&self, cluster: &str) -> PerCoreHistogram {
        self.duration
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .clone()
    }

    /// The counter for one label set; callers cache it per core.
    pub fn requests(
        &self,
        cluster: &str,
        verb: &'static str,
        resource: &str,
        code: u16,
    ) -> PerCoreCounter {
        let resource = {
            let mut known = self
                .resources
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let key = (cluster.to_string(), resource.to_string());
            if known.contains(&key) || (known.len() < MAX_RESOURCE_LABELS && known.insert(key)) {
                resource.to_string()
            } else {
                "other".to_string()
            }
        };
        self.requests
            .get_or_create(&RequestLabels {
                cluster: cluster.to_string(),
                verb,
                resource,
                code,
            })
            .clone()
    }

    pub fn reject(&self, reason: &str, worker: usize) {
        if let Some(index) = REJECT_REASONS.iter().position(|known| *known == reason) {
            self.rejected[index].inc(worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exported(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn resources_past_the_label_bound_count_as_other() {
        let mut registry = Registry::default();
        let metrics = GatewayMetrics::register(&mut registry, 1);
        for index in 0..MAX_RESOURCE_LABELS + 5 {
            metrics
                .requests("c", "get", &format!("r{index}"), 200)
                .inc(0);
        }
        metrics.requests("c", "get", "r0", 200).inc(0);
        let text = exported(&registry);
        assert!(
            text.contains(r#"cluster="c",verb="get",resource="r0",code="200"} 2"#),
            "a known resource keeps its label"
        );
        assert!(text.contains(r#"resource="other",code="200"} 5"#), "{text}");
        assert!(!text.contains(&format!("resource=\"r{MAX_RESOURCE_LABELS}\"")));
    }

    #[test]
    fn resource_labels_are_short_kubernetes_names_or_other() {
        assert_eq!(bounded_resource_label("pods"), "pods");
        assert_eq!(
            bounded_resource_label("widgets.example.com"),
            "widgets.example.com"
        );
        assert_eq!(bounded_resource_label(""), "");
        assert_eq!(bounded_resource_label(&"a".repeat(64)), "other");
        assert_eq!(bounded_resource_label("Pods"), "other");
        assert_eq!(bounded_resource_label("p\"o"), "other");
    }

    #[test]
    fn refusals_count_under_known_reasons_only() {
        let mut registry = Registry::default();
        let metrics = GatewayMetrics::register(&mut registry, 1);
        metrics.reject("unauthorized", 0);
        metrics.reject("no_such_reason", 0);
        let text = exported(&registry);
        assert!(
            text.contains(r#"sluice_gateway_rejected_total{reason="unauthorized"} 1"#),
            "{text}"
        );
        assert!(!text.contains("no_such_reason"));
        for reason in REJECT_REASONS {
            assert!(
                text.contains(&format!("reason=\"{reason}\"")),
                "{reason} is exported from the start"
            );
        }
    }
}
