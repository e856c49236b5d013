//! The watch clients' metrics: one family per metric, one child per watched resource.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabels {
    resource: String,
    r#type: &'static str,
}

type TimestampGauge = Gauge<f64, AtomicU64>;

/// The families, registered once per registry and shared by every watch client of the
/// process (a role may mirror several resources).
#[derive(Debug, Clone, Default)]
pub struct WatchMetrics {
    connected: Family<ResourceLabel, Gauge>,
    last_event: Family<ResourceLabel, TimestampGauge>,
    relists: Family<ResourceLabel, Counter>,
    reconnects: Family<ResourceLabel, Counter>,
    events: Family<EventLabels, Counter>,
}

impl WatchMetrics {
    /// Registers the `sluice_controlplane_watch_*` families.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "sluice_controlplane_watch_connected",
            "1 while the watch of the resource is open, 0 while reconnecting",
            metrics.connected.clone(),
        );
        registry.register(
            "sluice_controlplane_watch_last_event_timestamp_seconds",
            "Unix time of the last watch event (bookmarks included) or completed list; 0: never",
            metrics.last_event.clone(),
        );
        registry.register(
            "sluice_controlplane_watch_relists",
            "Lists after the first one (410 Expired, or a panic while handling the server's data)",
            metrics.relists.clone(),
        );
        registry.register(
            "sluice_controlplane_watch_reconnects",
            "Watch requests after the first one (resumed from the last resourceVersion)",
            metrics.reconnects.clone(),
        );
        registry.register(
            "sluice_controlplane_watch_events",
            "Watch events received, by type",
            metrics.events.clone(),
        );
        metrics
    }

    /// The handles of one resource. `resource` is the caller's fixed name for what it
    /// watches (`upstreamclusters`), never a value read from the server, so the label set
    /// stays bounded.
    pub fn for_resource(&self, resource: &str) -> ResourceMetrics {
        let label = ResourceLabel {
            resource: resource.to_string(),
        };
        let event = |r#type| {
            self.events
                .get_or_create(&EventLabels {
                    resource: resource.to_string(),
                    r#type,
                })
                .clone()
        };
        ResourceMetrics {
            connected: self.connected.get_or_create(&label).clone(),
            last_event: self.last_event.get_or_create(&label).clone(),
            relists: self.relists.get_or_create(&label).clone(),
            reconnects: self.reconnects.get_or_create(&label).clone(),
            added: event("ADDED"),
            modified: event("MODIFIED"),
            deleted: event("DELETED"),
            bookmark: event("BOOKMARK"),
            error: event("ERROR"),
        }
    }
}

/// One resource's metric handles (cheap clones of the family children).
#[derive(Debug, Clone)]
pub struct ResourceMetrics {
    pub connected: Gauge,
    pub last_event: Gauge<f64, AtomicU64>,
    pub relists: Counter,
    pub reconnects: Counter,
    added: Counter,
    modified: Counter,
    deleted: Counter,
    bookmark: Counter,
    error: Counter,
}

impl ResourceMetrics {
    /// Handles registered nowhere (tests, or a caller without a registry).
    pub fn unregistered(resource: &str) -> Self {
        WatchMetrics::default().for_resource(resource)
    }

    /// Counts one event of `event_type` (the fixed wire names) and stamps the time.
    pub fn event(&self, event_type: &str) {
        let counter = match event_type {
            "ADDED" => &self.added,
            "MODIFIED" => &self.modified,
            "DELETED" => &self.deleted,
            "BOOKMARK" => &self.bookmark,
            _ => &self.error,
        };
        counter.inc();
        self.touch();
    }

    /// Records that the server just told us something (an event or a completed list).
    pub fn touch(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs_f64())
            .unwrap_or(0.0);
        self.last_event.set(now);
    }

    /// The events counted so far for `event_type` (tests and logs).
    pub fn events(&self, event_type: &str) -> u64 {
        match event_type {
            "ADDED" => self.added.get(),
            "MODIFIED" => self.modified.get(),
            "DELETED" => self.deleted.get(),
            "BOOKMARK" => self.bookmark.get(),
            _ => self.error.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_encode_with_the_resource_label() {
        let mut registry = Registry::default();
        let metrics = WatchMetrics::register(&mut registry);
        let agents = metrics.for_resource("agents");
        agents.connected.set(1);
        agents.relists.inc();
        agents.event("ADDED");
        agents.event("garbage");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for expected in [
            "sluice_controlplane_watch_connected{resource=\"agents\"} 1",
            "sluice_controlplane_watch_relists_total{resource=\"agents\"} 1",
            "sluice_controlplane_watch_events_total{resource=\"agents\",type=\"ADDED\"} 1",
            "sluice_controlplane_watch_events_total{resource=\"agents\",type=\"ERROR\"} 1",
            "sluice_controlplane_watch_last_event_timestamp_seconds{resource=\"agents\"}",
        ] {
            assert!(text.contains(expected), "{expected} missing in\n{text}");
        }
        assert!(agents.last_event.get() > 1.0e9);
    }
}
