//! eBPF fast-path counters (docs/EBPF.md): two tc programs written in C (`bpf/`) count packets,
//! bytes, TCP SYNs and malformed frames per (interface, direction, L4 protocol), and ingress
//! traffic to the data plane's listener ports, in per-CPU maps that this crate loads (aya),
//! attaches (TCX, else clsact + netlink), sums at read time and exports to Prometheus.
//!
//! A kernel that refuses BPF is an [`EbpfError`]: callers log it once, publish
//! [`EbpfMetrics::disabled`] and keep running.

mod counters;
mod error;
mod hooks;
mod layout;
mod metrics;
mod snapshot;
mod tcx;

pub use counters::{EbpfCounters, ProgramStats};
pub use error::EbpfError;
pub use hooks::{tcx_programs, AttachMode};
pub use layout::{Counts, Direction, Listener, Protocol, L4, MAX_COUNTER_KEYS, MAX_LISTENERS};
pub use metrics::EbpfMetrics;
pub use snapshot::{CounterSnapshot, InterfaceCounters, ListenerTraffic};
