//! `/metrics` for the counters: a collector that encodes a snapshot at scrape time, from the
//! live maps or from the last published snapshot, and `sluice_ebpf_enabled 0` when the kernel
//! refused BPF.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::layout::Counts;
use crate::snapshot::{CounterSnapshot, ListenerTraffic};
use crate::EbpfCounters;

#[derive(Debug)]
enum Source {
    /// The kernel refused BPF (or counting is off): only `sluice_ebpf_enabled 0`.
    Disabled,
    /// The last snapshot its owner published.
    Published(CounterSnapshot),
    /// Read from the maps at each scrape.
    Live(Arc<Mutex<EbpfCounters>>),
}

/// The eBPF metric families. Clones share one source, so the owner can switch it (disable,
/// publish) after `register`.
#[derive(Debug, Clone)]
pub struct EbpfMetrics {
    source: Arc<Mutex<Source>>,
}

impl EbpfMetrics {
    /// For a daemon whose kernel refused BPF: `sluice_ebpf_enabled 0`, nothing else.
    pub fn disabled() -> Self {
        Self::with(Source::Disabled)
    }

    /// Reads `counters` at every scrape (the lock is held for the read only).
    pub fn live(counters: Arc<Mutex<EbpfCounters>>) -> Self {
        Self::with(Source::Live(counters))
    }

    /// Encodes `snapshot` until the next `publish`.
    pub fn published(snapshot: CounterSnapshot) -> Self {
        Self::with(Source::Published(snapshot))
    }

    fn with(source: Source) -> Self {
        Self {
            source: Arc::new(Mutex::new(source)),
        }
    }

    /// Replaces what is encoded with `snapshot`.
    pub fn publish(&self, snapshot: CounterSnapshot) {
        *self.lock() = Source::Published(snapshot);
    }

    /// Switches to `sluice_ebpf_enabled 0` (the programs were dropped).
    pub fn disable(&self) {
        *self.lock() = Source::Disabled;
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Source> {
        // A panic while holding the lock left a whole Source behind: keep using it.
        self.source
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The snapshot to encode now; `None` when disabled.
    fn current(&self) -> Option<CounterSnapshot> {
        let live = match &*self.lock() {
            Source::Disabled => return None,
            Source::Published(snapshot) => return Some(snapshot.clone()),
            Source::Live(counters) => Arc::clone(counters),
        };
        let counters = live.lock().unwrap_or_else(|poison| poison.into_inner());
        match counters.read() {
            Ok(snapshot) => Some(snapshot),
            Err(e) => {
                // Still enabled (the programs count on); this scrape has no counter samples.
                tracing::warn!(error = %e, "eBPF counters: reading the maps");
                Some(CounterSnapshot {
                    attached: counters.attached(),
                    ..CounterSnapshot::default()
                })
            }
        }
    }
}

type InterfaceValue = fn(&Counts) -> u64;
type ListenerValue = fn(&ListenerTraffic) -> u64;

const INTERFACE_FAMILIES: [(&str, &str, InterfaceValue); 4] = [
    (
        "sluice_ebpf_packets",
        "Packets seen by the tc programs, by interface, direction and L4 protocol",
        |c| c.packets,
    ),
    (
        "sluice_ebpf_bytes",
        "Bytes (whole frames, skb->len) seen by the tc programs",
        |c| c.bytes,
    ),
    (
        "sluice_ebpf_tcp_syn",
        "TCP segments with SYN and without ACK (connection attempts)",
        |c| c.tcp_syn,
    ),
    (
        "sluice_ebpf_malformed",
        "Frames whose headers were cut short or inconsistent at the tc hook (the nearest honest count of drops there: docs/EBPF.md)",
        |c| c.malformed,
    ),
];

const LISTENER_FAMILIES: [(&str, &str, ListenerValue); 3] = [
    (
        "sluice_ebpf_listener_packets",
        "Ingress packets to a data-plane listener's port, accepted by user space or not",
        |l| l.packets,
    ),
    (
        "sluice_ebpf_listener_bytes",
        "Ingress bytes (whole frames) to a data-plane listener's port",
        |l| l.bytes,
    ),
    (
        "sluice_ebpf_listener_syns",
        "Ingress TCP SYNs (without ACK) to a data-plane listener's port",
        |l| l.syns,
    ),
];

impl Collector for EbpfMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.current();
        let enabled = ConstGauge::new(i64::from(snapshot.is_some()));
        enabled.encode(encoder.encode_descriptor(
            "sluice_ebpf_enabled",
            "1 when the eBPF counters are loaded, 0 when the kernel refused them",
            None,
            enabled.metric_type(),
        )?)?;
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let attached = ConstGauge::new(snapshot.attached.len() as i64);
        attached.encode(encoder.encode_descriptor(
            "sluice_ebpf_attached_interfaces",
            "Interfaces carrying the counting programs",
            None,
            attached.metric_type(),
        )?)?;
        let full = ConstCounter::new(snapshot.map_full);
        full.encode(encoder.encode_descriptor(
            "sluice_ebpf_map_full",
            "Packets left uncounted because the counters map was full",
            None,
            full.metric_type(),
        )?)?;
        for (name, help, value) in INTERFACE_FAMILIES {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for entry in &snapshot.interfaces {
                let labels = [
                    ("interface", entry.interface.as_str()),
                    ("direction", entry.direction.label()),
                    ("protocol", entry.protocol.label()),
                ];
                ConstCounter::new(value(&entry.counts))
                    .encode(family.encode_family(&labels.as_slice())?)?;
            }
        }
        for (name, help, value) in LISTENER_FAMILIES {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for entry in &snapshot.listeners {
                let labels = [("listener", entry.listener.as_str())];
                ConstCounter::new(value(entry))
                    .encode(family.encode_family(&labels.as_slice())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Direction, Protocol};
    use crate::snapshot::InterfaceCounters;
    use prometheus_client::encoding::text::encode;

    fn scrape(metrics: &EbpfMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn disabled_is_one_gauge_at_zero() {
        let text = scrape(&EbpfMetrics::disabled());
        assert!(text.contains("sluice_ebpf_enabled 0\n"), "{text}");
        assert!(!text.contains("sluice_ebpf_packets"), "{text}");
    }

    #[test]
    fn a_published_snapshot_is_encoded_with_bounded_labels() {
        let metrics = EbpfMetrics::disabled();
        metrics.publish(CounterSnapshot {
            interfaces: vec![InterfaceCounters {
                interface: "vm0".to_string(),
                direction: Direction::Ingress,
                protocol: Protocol::Udp,
                counts: Counts {
                    packets: 10,
                    bytes: 1420,
                    tcp_syn: 0,
                    malformed: 1,
                },
            }],
            listeners: vec![ListenerTraffic {
                listener: "agent".to_string(),
                packets: 5,
                bytes: 370,
                syns: 5,
            }],
            map_full: 2,
            attached: vec!["vm0".to_string()],
        });
        let text = scrape(&metrics);
        for line in [
            "sluice_ebpf_enabled 1\n",
            "sluice_ebpf_attached_interfaces 1\n",
            "sluice_ebpf_map_full_total 2\n",
            "sluice_ebpf_packets_total{interface=\"vm0\",direction=\"ingress\",protocol=\"udp\"} 10\n",
            "sluice_ebpf_bytes_total{interface=\"vm0\",direction=\"ingress\",protocol=\"udp\"} 1420\n",
            "sluice_ebpf_tcp_syn_total{interface=\"vm0\",direction=\"ingress\",protocol=\"udp\"} 0\n",
            "sluice_ebpf_malformed_total{interface=\"vm0\",direction=\"ingress\",protocol=\"udp\"} 1\n",
            "sluice_ebpf_listener_packets_total{listener=\"agent\"} 5\n",
            "sluice_ebpf_listener_bytes_total{listener=\"agent\"} 370\n",
            "sluice_ebpf_listener_syns_total{listener=\"agent\"} 5\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        metrics.disable();
        assert!(scrape(&metrics).contains("sluice_ebpf_enabled 0\n"));
    }
}
