use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use sluice_metrics::{PerCoreCounter, PerCoreGauge};

use std::sync::Arc;

use crate::{CloseReason, Placement};

/// Per-core counters of one listener. Workers write their own slot; scrapes sum.
#[derive(Debug, Clone)]
pub struct ListenerStats {
    pub accepted: PerCoreCounter,
    pub active: PerCoreGauge,
    pub requests: PerCoreCounter,
    pub accept_errors: PerCoreCounter,
    pub panics: PerCoreCounter,
    /// Connections closed (or refused) on a limit, by [`CloseReason`].
    pub closed: Arc<[PerCoreCounter; CloseReason::ALL.len()]>,
}

impl ListenerStats {
    pub(crate) fn new(cores: usize) -> Self {
        Self {
            accepted: PerCoreCounter::new(cores),
            active: PerCoreGauge::new(cores),
            requests: PerCoreCounter::new(cores),
            accept_errors: PerCoreCounter::new(cores),
            panics: PerCoreCounter::new(cores),
            closed: Arc::new(std::array::from_fn(|_| PerCoreCounter::new(cores))),
        }
    }
}

/// Encodes the runtime's per-listener totals and per-worker totals at scrape time.
#[derive(Debug)]
pub(crate) struct RuntimeCollector {
    pub(crate) workers: usize,
    pub(crate) listeners: Vec<(String, Placement, ListenerStats)>,
    pub(crate) lifecycle: std::sync::Arc<crate::Lifecycle>,
}

/// Every phase, so the phase gauge has one series each (1 for the current one).
const PHASES: [crate::Phase; 5] = [
    crate::Phase::Starting,
    crate::Phase::Ready,
    crate::Phase::Draining,
    crate::Phase::Stopped,
    crate::Phase::Failed,
];

type PerListener = fn(&ListenerStats) -> u64;

impl RuntimeCollector {
    fn encode_per_listener(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: PerListener,
    ) -> Result<(), std::fmt::Error> {
        let mut family =
            encoder.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for (listener, _, stats) in &self.listeners {
            let labels = [("listener", listener.as_str())];
            ConstCounter::new(value(stats)).encode(family.encode_family(&labels.as_slice())?)?;
        }
        Ok(())
    }

    /// Per-worker totals over the data-plane listeners: proves every core takes its share.
    fn encode_per_worker(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        counter: fn(&ListenerStats) -> &PerCoreCounter,
    ) -> Result<(), std::fmt::Error> {
        let mut family =
            encoder.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for worker in 0..self.workers {
            let total: u64 = self
                .listeners
                .iter()
                .filter(|(_, placement, _)| *placement == Placement::Workers)
                .map(|(_, _, stats)| counter(stats).get(worker))
                .sum();
            let worker = worker.to_string();
            let labels = [("worker", worker.as_str())];
            ConstCounter::new(total).encode(family.encode_family(&labels.as_slice())?)?;
        }
        Ok(())
    }
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let workers = ConstGauge::new(self.workers as i64);
        workers.encode(encoder.encode_descriptor(
            "sluice_workers",
            "Data-plane worker threads (one monoio runtime each)",
            None,
            workers.metric_type(),
        )?)?;
        let current = self.lifecycle.phase();
        let mut phases = encoder.encode_descriptor(
            "sluice_lifecycle_phase",
            "1 for the process's current phase (starting, ready, draining, stopped, failed)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for phase in PHASES {
            let labels = [("phase", phase.as_str())];
            ConstGauge::new(i64::from(phase == current))
                .encode(phases.encode_family(&labels.as_slice())?)?;
        }
        self.encode_per_listener(
            &mut encoder,
            "sluice_connections_accepted",
            "Connections accepted, summed over worker cores",
            |stats| stats.accepted.sum(),
        )?;
        let mut active = encoder.encode_descriptor(
            "sluice_connections_active",
            "Connections open now, summed over worker cores",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (listener, _, stats) in &self.listeners {
            let labels = [("listener", listener.as_str())];
            ConstGauge::new(stats.active.sum())
                .encode(active.encode_family(&labels.as_slice())?)?;
        }
        self.encode_per_listener(
            &mut encoder,
            "sluice_requests",
            "Requests served, summed over worker cores",
            |stats| stats.requests.sum(),
        )?;
        self.encode_per_listener(
            &mut encoder,
            "sluice_accept_errors",
            "Failed accept calls (for example out of file descriptors)",
            |stats| stats.accept_errors.sum(),
        )?;
        self.encode_per_listener(
            &mut encoder,
            "sluice_connection_panics",
            "Connection handlers that panicked; the connection was closed, the worker kept running",
            |stats| stats.panics.sum(),
        )?;
        let mut closed = encoder.encode_descriptor(
            "sluice_connections_closed",
            "Connections a listener closed or refused on one of its limits, by reason (handshake_timeout, header_timeout, idle, keepalive_timeout, max_age, per_ip_limit)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (listener, _, stats) in &self.listeners {
            for reason in CloseReason::ALL {
                let labels = [("listener", listener.as_str()), ("reason", reason.label())];
                ConstCounter::new(stats.closed[reason.index()].sum())
                    .encode(closed.encode_family(&labels.as_slice())?)?;
            }
        }
        let mut panics = encoder.encode_descriptor(
            "sluice_task_panics",
            "Spawned tasks that panicked, by task kind (connection, grpc-stream, tunnel, ...); the task ended, the worker kept running (kind \"worker\": a worker thread died and the process failed)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (task, count) in crate::task::task_panics() {
            let labels = [(crate::task::TASK_PANICS_LABEL, task)];
            ConstCounter::new(count).encode(panics.encode_family(&labels.as_slice())?)?;
        }
        self.encode_per_worker(
            &mut encoder,
            "sluice_worker_connections_accepted",
            "Data-plane connections accepted by each worker core",
            |stats| &stats.accepted,
        )?;
        self.encode_per_worker(
            &mut encoder,
            "sluice_worker_requests",
            "Data-plane requests served by each worker core",
            |stats| &stats.requests,
        )?;
        Ok(())
    }
}
