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

/// The request latency's label: the same verbs as [`RequestLabels::verb`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    pub verb: &'static str,
}

/// A watch event sent: the resource (the kind table's plural) and the event type (`ADDED`,
/// `MODIFIED`, `DELETED`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchEventLabels {
    pub resource: String,
    pub r#type: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// A pool share: the pool (`watches`, `requests_in_flight`, `connections`) and the role,
/// never the user.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShareLabels {
    pub pool: &'static str,
    pub role: &'static str,
}

/// A refusal by a share: which pool, whose role, and which budget (`identity`, `role`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub pool: &'static str,
    pub role: &'static str,
    pub budget: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

/// Counters and gauges of one API server.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<VerbLabels, Histogram, fn() -> Histogram>,
    pub authentication_failures: Family<ReasonLabels, Counter>,
    pub watchers: Family<ResourceLabels, Gauge>,
    pub watch_events: Family<WatchEventLabels, Counter>,
    pub connections: Gauge,
    pub connections_refused: Family<ReasonLabels, Counter>,
    pub unauthenticated_connections: Gauge,
    pub admission_in_use: Family<ShareLabels, Gauge>,
    pub admission_refused: Family<AdmissionLabels, Counter>,
    pub store_revision: Gauge,
    pub tokens: Gauge,
    /// Complete reads of the shared span view (see `span_feed`).
    pub span_policy_reads: Counter,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

impl ApiMetrics {
    pub(crate) fn new() -> Self {
        Self {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
            authentication_failures: Family::default(),
            watchers: Family::default(),
            watch_events: Family::default(),
            connections: Gauge::default(),
            connections_refused: Family::default(),
            unauthenticated_connections: Gauge::default(),
            admission_in_use: Family::default(),
            admission_refused: Family::default(),
            store_revision: Gauge::default(),
            tokens: Gauge::default(),
            span_policy_reads: Counter::default(),
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
            "Watch events sent to clients, by resource and event type, counted as each is sent",
            metrics.watch_events.clone(),
        );
        prefixed.register(
            "connections",
            "Open client connections",
            metrics.connections.clone(),
        );
        prefixed.register(
            "connections_refused",
            "Connections refused or closed by the server, by reason (limit, evicted for a newer \
             one, tls, handshake_timeout, first_request_timeout, idle, identity_connections)",
            metrics.connections_refused.clone(),
        );
        prefixed.register(
            "unauthenticated_connections",
            "Open connections on which no request has authenticated yet",
            metrics.unauthenticated_connections.clone(),
        );
        prefixed.register(
            "admission_in_use",
            "Slots in use of a shared pool (watches, requests_in_flight, connections), by role",
            metrics.admission_in_use.clone(),
        );
        prefixed.register(
            "admission_refused",
            "Requests answered 429 because a share was used up, by pool, role and budget \
             (identity: the caller's own cap; role: the role's reservation and the shared part)",
            metrics.admission_refused.clone(),
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
        prefixed.register(
            "span_policy_reads",
            "Complete reads of every policy object and VM by the shared span view: at its start \
             and whenever its store watch breaks",
            metrics.span_policy_reads.clone(),
        );
        metrics
    }
}

/// A watch's event counters, resolved once when it opens so that sending an event only
/// increments an atomic.
#[derive(Debug, Clone)]
pub struct WatchEventCounters {
    added: Counter,
    modified: Counter,
    deleted: Counter,
}

impl WatchEventCounters {
    pub fn new(metrics: &ApiMetrics, resource: &str) -> Self {
        let counter = |event: &'static str| {
            metrics
                .watch_events
                .get_or_create(&WatchEventLabels {
                    resource: resource.to_string(),
                    r#type: event,
                })
                .clone()
        };
        Self {
            added: counter("ADDED"),
            modified: counter("MODIFIED"),
            deleted: counter("DELETED"),
        }
    }

    /// Counts one event sent; bookmarks and errors are not changes and are not counted.
    pub fn sent(&self, event: sluice_apimachinery::list::WatchEventType) {
        use sluice_apimachinery::list::WatchEventType as Type;
        match event {
            Type::Added => self.added.inc(),
            Type::Modified => self.modified.inc(),
            Type::Deleted => self.deleted.inc(),
            Type::Bookmark | Type::Error => 0,
        };
    }
}
