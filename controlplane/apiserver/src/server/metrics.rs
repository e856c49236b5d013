//! The API server's metrics. Every label value comes from a fixed set (verbs, the registry's
//! resources, status codes, refusal reasons), never from what a client wrote.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// An RBAC verb, `discovery`, `health` or `unknown` (a path the server does not serve).
    pub verb: &'static str,
    /// A served resource's plural, or `none`.
    pub resource: String,
    pub code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

/// Counters and gauges of one API server.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<ReasonLabels, Histogram, fn() -> Histogram>,
    pub authentication_failures: Family<ReasonLabels, Counter>,
    pub watchers: Family<ResourceLabels, Gauge>,
    pub watch_events: Family<ResourceLabels, Counter>,
    pub connections: Gauge,
    pub connections_refused: Family<ReasonLabels, Counter>,
    pub store_revision: Gauge,
    pub tokens: Gauge,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

impl ApiMetrics {
    fn new() -> Self {
        Self {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
            authentication_failures: Family::default(),
            watchers: Family::default(),
            watch_events: Family::default(),
            connections: Gauge::default(),
            connections_refused: Family::default(),
            store_revision: Gauge::default(),
            tokens: Gauge::default(),
        }
    }

    /// Registers every metric under `sluice_controlplane_*`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::new();
        let prefixed = registry.sub_registry_with_prefix("sluice_controlplane");
        prefixed.register(
            "requests",
            "API requests answered, by verb, resource and status code",
            metrics.requests.clone(),
        );
        prefixed.register(
            "request_duration_seconds",
            "Time to answer API requests other than watches, by verb",
            metrics.request_seconds.clone(),
        );
        prefixed.register(
            "authentication_failures",
            "Requests refused 401, by reason (no credentials, unknown token, bad certificate)",
            metrics.authentication_failures.clone(),
        );
        prefixed.register(
            "watchers",
            "Open watches, by resource",
            metrics.watchers.clone(),
        );
        prefixed.register(
            "watch_events",
            "Watch events sent to clients, by resource",
            metrics.watch_events.clone(),
        );
        prefixed.register(
            "connections",
            "Open client connections",
            metrics.connections.clone(),
        );
        prefixed.register(
            "connections_refused",
            "Connections closed before a request, by reason (limit, handshake timeout, TLS error)",
            metrics.connections_refused.clone(),
        );
        prefixed.register(
            "store_revision",
            "The store's revision as last seen by this server",
            metrics.store_revision.clone(),
        );
        prefixed.register(
            "tokens",
            "Bearer tokens this server accepts",
            metrics.tokens.clone(),
        );
        metrics
    }
}
