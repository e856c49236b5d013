//! `/metrics` for the overload state: read from the process-wide atomics at scrape time.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::monitor::{FDS, FD_LIMIT, LAST, MEMORY_LIMIT, RSS};
use crate::{Action, Role};

/// Registers with `Registry::register_collector`.
#[derive(Debug, Default)]
pub struct OverloadCollector;

impl Collector for OverloadCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut state = encoder.encode_descriptor(
            "sluice_overload_state",
            "1 while an overload action is active (stop_accepting, shed_new_requests)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for action in Action::ALL {
            let labels = [("action", action.label())];
            ConstGauge::new(i64::from(crate::is_active(action)))
                .encode(state.encode_family(&labels.as_slice())?)?;
        }
        let mut transitions = encoder.encode_descriptor(
            "sluice_overload_transitions",
            "Overload actions turning on (to=active) or off (to=inactive)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for action in Action::ALL {
            for (to, active) in [("active", true), ("inactive", false)] {
                let labels = [("action", action.label()), ("to", to)];
                ConstCounter::new(crate::transitions_total(action, active))
                    .encode(transitions.encode_family(&labels.as_slice())?)?;
            }
        }
        let mut shed = encoder.encode_descriptor(
            "sluice_overload_shed",
            "Requests refused because the process was overloaded, by role",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for role in Role::ALL {
            let labels = [("role", role.label())];
            ConstCounter::new(crate::shed_total(role))
                .encode(shed.encode_family(&labels.as_slice())?)?;
        }
        let mut used = encoder.encode_descriptor(
            "sluice_overload_resource",
            "The overload monitor's last sample: use and limit (0: none) of memory (bytes) and file descriptors",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (resource, kind, slot) in [
            ("memory_bytes", "used", RSS),
            ("memory_bytes", "limit", MEMORY_LIMIT),
            ("file_descriptors", "used", FDS),
            ("file_descriptors", "limit", FD_LIMIT),
        ] {
            let labels = [("resource", resource), ("kind", kind)];
            let value = i64::try_from(LAST[slot].load(std::sync::atomic::Ordering::Relaxed))
                .unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(used.encode_family(&labels.as_slice())?)?;
        }
        Ok(())
    }
}
