//! `sluice_access_log_lines_total` and `sluice_access_log_dropped_total`, by role.

use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

use crate::switch::{Role, SWITCHES};

/// Registered once per process (the counts are process-wide, like the switch).
#[derive(Debug)]
pub struct AccessLogCollector;

impl Collector for AccessLogCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, count) in [
            (
                "sluice_access_log_lines",
                "Access log lines written, by role",
                (|role: Role| &SWITCHES[role as usize].written) as fn(Role) -> _,
            ),
            (
                "sluice_access_log_dropped",
                "Access log lines dropped because the log writer fell behind (its queue was full), by role",
                |role: Role| &SWITCHES[role as usize].dropped,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for role in Role::ALL {
                let labels = [("role", role.label())];
                ConstCounter::new(count(role).load(Ordering::Relaxed))
                    .encode(family.encode_family(&labels.as_slice())?)?;
            }
        }
        Ok(())
    }
}
