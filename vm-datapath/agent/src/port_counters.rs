//! eBPF fast-path counters on the bridge's ports (docs/EBPF.md): every port of the agent's
//! bridge that is a network device in the agent's namespace gets the counting programs, ports
//! that appear are attached and ports that go are released, at each stats poll. A kernel that
//! refuses BPF leaves the agent enforcing as before, with one warning and
//! `sluice_ebpf_enabled 0`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use sluice_ebpf::{EbpfCounters, EbpfMetrics};
use sluice_ovs::OvsdbClient;

#[derive(Clone)]
pub struct PortCounters {
    counters: Option<Arc<Mutex<EbpfCounters>>>,
    metrics: EbpfMetrics,
}

impl PortCounters {
    /// Loads the programs (none when `enabled` is false: `--no-ebpf`).
    pub fn load(enabled: bool) -> Self {
        if !enabled {
            return Self::disabled();
        }
        match EbpfCounters::load(&[]) {
            Ok(counters) => {
                let counters = Arc::new(Mutex::new(counters));
                PortCounters {
                    metrics: EbpfMetrics::live(counters.clone()),
                    counters: Some(counters),
                }
            }
            Err(error) => {
                tracing::warn!(%error, "eBPF counters disabled: the kernel refused the programs; enforcement is not affected");
                Self::disabled()
            }
        }
    }

    fn disabled() -> Self {
        PortCounters {
            counters: None,
            metrics: EbpfMetrics::disabled(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// Attaches to the ports of `bridge` not attached yet and releases those gone.
    pub async fn follow(&self, ovsdb: &mut OvsdbClient, bridge: &str) {
        if self.counters.is_none() {
            return;
        }
        let ports = match ovsdb.bridge_ports(bridge).await {
            Ok(ports) => ports,
            Err(error) => {
                tracing::debug!(%error, "bridge ports not read; eBPF attachments unchanged");
                return;
            }
        };
        let devices: BTreeSet<String> = ports
            .into_iter()
            .map(|port| port.name)
            .filter(|name| name != bridge && is_device(name))
            .collect();
        self.sync(&devices);
    }

    /// Releases every port (the agent leaves the datapath).
    pub fn release_all(&self) {
        self.sync(&BTreeSet::new());
    }

    fn sync(&self, wanted: &BTreeSet<String>) {
        let Some(counters) = &self.counters else {
            return;
        };
        let mut counters = counters.lock().unwrap_or_else(|poison| poison.into_inner());
        let attached: BTreeSet<String> = counters.attached().into_iter().collect();
        let (attach, detach) = changes(&attached, wanted);
        for interface in detach {
            match counters.detach(&interface) {
                Ok(()) => tracing::info!(%interface, "eBPF counters released"),
                Err(error) => {
                    tracing::debug!(%interface, %error, "eBPF counters not released (the device is gone with them)")
                }
            }
        }
        for interface in attach {
            match counters.attach(&interface) {
                Ok(()) => tracing::info!(%interface, "eBPF counters attached"),
                Err(error) => {
                    tracing::warn!(%interface, %error, "eBPF counters not attached; retried at the next poll")
                }
            }
        }
    }
}

/// Whether `name` is a network device in this namespace (a port of another namespace, or an
/// internal port not created yet, is not).
fn is_device(name: &str) -> bool {
    !name.contains('/') && Path::new("/sys/class/net").join(name).exists()
}

/// What to attach and what to release to go from `attached` to `wanted`.
fn changes(attached: &BTreeSet<String>, wanted: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    (
        wanted.difference(attached).cloned().collect(),
        attached.difference(wanted).cloned().collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn ports_that_come_are_attached_and_ports_that_go_released() {
        let (attach, detach) = changes(&set(&["eth0", "eth0~"]), &set(&["eth0~", "v1"]));
        assert_eq!(attach, ["v1"]);
        assert_eq!(detach, ["eth0"]);
        assert_eq!(changes(&set(&["a"]), &set(&["a"])), (vec![], vec![]));
    }

    #[test]
    fn only_devices_of_this_namespace_count() {
        assert!(is_device("lo"));
        assert!(!is_device("no-such-device-here"));
        assert!(!is_device("../lo"));
    }
}
