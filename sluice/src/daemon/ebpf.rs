//! `ebpf.interfaces`: the eBPF counters on the node's data-plane interfaces (docs/EBPF.md):
//! packets, bytes and SYNs per interface, direction and protocol, and ingress traffic to each
//! data-plane listener's port, including what user space never accepted (a SYN flood, a port
//! nobody listens on). A kernel that refuses BPF leaves the node serving, with one warning and
//! `sluice_ebpf_enabled 0`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use sluice_config::Config;
use sluice_ebpf::{EbpfCounters, EbpfMetrics, Listener, L4};

/// The data-plane listeners whose ports are counted (the admin port is not data plane).
const COUNTED_LISTENERS: [&str; 4] = ["agent", "external", "private", "gateway"];

/// Held until the node stops; dropping it takes the programs off the interfaces.
pub struct NodeCounters {
    _counters: Option<Arc<Mutex<EbpfCounters>>>,
}

/// Loads and attaches the counters when the config asks for them, registering their metrics.
pub fn wire(
    config: &Config,
    addresses: &[(String, SocketAddr)],
    registry: &mut Registry,
) -> Option<NodeCounters> {
    let ebpf = config.ebpf.as_ref()?;
    let listeners = counted_listeners(addresses);
    let mut counters = match EbpfCounters::load(&listeners) {
        Ok(counters) => counters,
        Err(error) => {
            tracing::warn!(%error, "eBPF counters disabled: the kernel refused the programs; the node serves as usual");
            EbpfMetrics::disabled().register(registry);
            return Some(NodeCounters { _counters: None });
        }
    };
    for interface in &ebpf.interfaces {
        match counters.attach(interface) {
            Ok(()) => tracing::info!(%interface, "eBPF counters attached"),
            Err(error) => {
                tracing::warn!(%interface, %error, "eBPF counters not attached to this interface")
            }
        }
    }
    let counters = Arc::new(Mutex::new(counters));
    EbpfMetrics::live(counters.clone()).register(registry);
    Some(NodeCounters {
        _counters: Some(counters),
    })
}

/// The bound data-plane listeners as the programs' listener table: TCP on each one's port
/// (two listeners on one port, on different addresses, count once under the first name).
fn counted_listeners(addresses: &[(String, SocketAddr)]) -> Vec<Listener> {
    let mut listeners: Vec<Listener> = Vec::new();
    for (name, address) in addresses {
        let counted = COUNTED_LISTENERS.contains(&name.as_str());
        if counted && !listeners.iter().any(|known| known.port == address.port()) {
            listeners.push(Listener {
                name: name.clone(),
                port: address.port(),
                protocol: L4::Tcp,
            });
        }
    }
    listeners
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_plane_listeners_are_counted_once_per_port() {
        let address = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let listeners = counted_listeners(&[
            ("admin".into(), address(9901)),
            ("agent".into(), address(8150)),
            ("external".into(), address(8151)),
            ("gateway".into(), address(8151)),
            ("demo-backend".into(), address(4000)),
        ]);
        let named: Vec<(&str, u16)> = listeners
            .iter()
            .map(|listener| (listener.name.as_str(), listener.port))
            .collect();
        assert_eq!(named, [("agent", 8150), ("external", 8151)]);
    }
}
