//! `EbpfCounters`: the loaded object, its hooks and its map reads.

use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues};
use aya::programs::tc::SchedClassifierLinkId;
use aya::programs::SchedClassifier;
use aya::{Ebpf, EbpfLoader};

use crate::hooks::{self, AttachMode, Namespace};
use crate::layout::{
    CounterKey, Counts, Direction, Listener, ListenerCounts, PortKey, COUNTERS_MAP, ERRORS_MAP,
    ERR_COUNTERS_FULL, LISTENER_MAP, MAX_LISTENERS, PORTS_MAP,
};
use crate::snapshot::{self, CounterSnapshot};
use crate::EbpfError;

/// The object compiled from `bpf/counters.bpf.c`, checked in (see `tests/regenerate.rs`).
static OBJECT: &[u8] = include_bytes!("../bpf/counters.bpf.o");

/// `volatile const` in `bpf/counters.bpf.c`: how many listeners `sluice_ports` holds.
const LISTENER_COUNT_GLOBAL: &str = "sluice_listener_count";

/// One interface's two links.
#[derive(Debug)]
struct Attachment {
    ifindex: u32,
    ingress: SchedClassifierLinkId,
    egress: SchedClassifierLinkId,
}

/// Run statistics of one program (non-zero only while `kernel.bpf_stats_enabled=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStats {
    pub program: &'static str,
    pub run_time_ns: u64,
    pub run_count: u64,
}

/// The counting programs, loaded once, attached to any number of interfaces of one network
/// namespace. Dropping it takes every program off its hooks.
#[derive(Debug)]
pub struct EbpfCounters {
    ebpf: Ebpf,
    mode: AttachMode,
    listeners: Vec<String>,
    namespace: Option<Namespace>,
    attached: BTreeMap<String, Attachment>,
}

impl EbpfCounters {
    /// Loads the programs (the verifier log is in the error when refused) and fills the
    /// listener-port map. Attaches with TCX on Linux >= 6.6, netlink before.
    pub fn load(listeners: &[Listener]) -> Result<Self, EbpfError> {
        Self::load_with(listeners, AttachMode::Auto)
    }

    /// As `load`, choosing how programs are attached (tests force the netlink path).
    pub fn load_with(listeners: &[Listener], mode: AttachMode) -> Result<Self, EbpfError> {
        let ports = listener_ports(listeners)?;
        // A constant to the verifier (frozen .rodata): with none, the programs skip the
        // listener lookup altogether.
        let listener_count = ports.len() as u32;
        let mut ebpf = EbpfLoader::new()
            .override_global(LISTENER_COUNT_GLOBAL, &listener_count, true)
            .load(OBJECT)
            .map_err(EbpfError::Load)?;
        for direction in Direction::ALL {
            classifier(&mut ebpf, direction)?
                .load()
                .map_err(|e| EbpfError::program(direction.program(), e))?;
        }
        let mut map = BpfHashMap::<&mut MapData, PortKey, u32>::try_from(
            ebpf.map_mut(PORTS_MAP).ok_or(missing_map(PORTS_MAP))?,
        )
        .map_err(EbpfError::map(PORTS_MAP))?;
        for (key, id) in &ports {
            map.insert(key, id, 0).map_err(EbpfError::map(PORTS_MAP))?;
        }
        Ok(Self {
            ebpf,
            mode: mode.resolve(),
            listeners: listeners.iter().map(|l| l.name.clone()).collect(),
            namespace: None,
            attached: BTreeMap::new(),
        })
    }

    /// How programs are attached on this kernel (`Tcx` or `Netlink`).
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Attaches ingress and egress to `interface` in the calling thread's network namespace.
    /// Idempotent; an interface re-created under the same name gets the programs again. An
    /// earlier instance's programs on these hooks are replaced, never doubled.
    pub fn attach(&mut self, interface: &str) -> Result<(), EbpfError> {
        let ifindex = hooks::ifindex(interface)?;
        self.check_namespace(interface)?;
        match self.attached.get(interface) {
            Some(attachment) if attachment.ifindex == ifindex => return Ok(()),
            // The old device is gone with its hooks; drop our record of it and its keys.
            Some(_) => {
                let _ = self.detach(interface);
            }
            None => {}
        }
        let ingress = self.attach_one(interface, ifindex, Direction::Ingress)?;
        let egress = match self.attach_one(interface, ifindex, Direction::Egress) {
            Ok(link) => link,
            Err(e) => {
                // No half-attached interface.
                let _ = classifier(&mut self.ebpf, Direction::Ingress)?.detach(ingress);
                return Err(e);
            }
        };
        self.attached.insert(
            interface.to_string(),
            Attachment {
                ifindex,
                ingress,
                egress,
            },
        );
        Ok(())
    }

    fn attach_one(
        &mut self,
        interface: &str,
        ifindex: u32,
        direction: Direction,
    ) -> Result<SchedClassifierLinkId, EbpfError> {
        let mode = self.mode;
        let program = classifier(&mut self.ebpf, direction)?;
        let own_id = program
            .info()
            .map_err(|e| EbpfError::program(direction.program(), e))?
            .id();
        hooks::clear_previous(mode, interface, ifindex, direction, own_id)?;
        hooks::attach(program, mode, interface, direction, own_id)
    }

    fn check_namespace(&mut self, interface: &str) -> Result<(), EbpfError> {
        let io = |source| EbpfError::Interface {
            interface: interface.to_string(),
            source,
        };
        match &self.namespace {
            Some(namespace) if !namespace.is_current().map_err(io)? => {
                Err(EbpfError::OtherNamespace {
                    interface: interface.to_string(),
                })
            }
            Some(_) => Ok(()),
            None => {
                self.namespace = Some(Namespace::current().map_err(io)?);
                Ok(())
            }
        }
    }

    /// Takes both programs off `interface` and forgets its counters (their keys are removed,
    /// so churning VM ports never fill the map).
    pub fn detach(&mut self, interface: &str) -> Result<(), EbpfError> {
        let attachment = self
            .attached
            .remove(interface)
            .ok_or_else(|| EbpfError::NotAttached(interface.to_string()))?;
        let result = self.unlink(interface, attachment.ingress, attachment.egress);
        self.forget_keys(attachment.ifindex)?;
        result
    }

    /// Detaches both links, in the interfaces' namespace for netlink filters (a netlink detach
    /// names an ifindex, which means another device in another namespace).
    fn unlink(
        &mut self,
        interface: &str,
        ingress: SchedClassifierLinkId,
        egress: SchedClassifierLinkId,
    ) -> Result<(), EbpfError> {
        let ebpf = &mut self.ebpf;
        let detach = || -> Result<(), EbpfError> {
            let first = taken_over_is_gone(
                Direction::Ingress,
                interface,
                classifier(ebpf, Direction::Ingress)?.detach(ingress),
            );
            taken_over_is_gone(
                Direction::Egress,
                interface,
                classifier(ebpf, Direction::Egress)?.detach(egress),
            )?;
            first
        };
        match (&self.namespace, self.mode) {
            (Some(namespace), AttachMode::Netlink) => {
                namespace
                    .run(detach)
                    .map_err(|source| EbpfError::Interface {
                        interface: interface.to_string(),
                        source,
                    })?
            }
            _ => detach(),
        }
    }

    fn forget_keys(&mut self, ifindex: u32) -> Result<(), EbpfError> {
        let mut map = PerCpuHashMap::<&mut MapData, CounterKey, Counts>::try_from(
            self.ebpf
                .map_mut(COUNTERS_MAP)
                .ok_or(missing_map(COUNTERS_MAP))?,
        )
        .map_err(EbpfError::map(COUNTERS_MAP))?;
        let stale: Vec<CounterKey> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|key| key.ifindex == ifindex)
            .collect();
        for key in stale {
            // Gone already (a concurrent reader does not delete): nothing to do.
            let _ = map.remove(&key);
        }
        Ok(())
    }

    /// Interfaces attached now, sorted.
    pub fn attached(&self) -> Vec<String> {
        self.attached.keys().cloned().collect()
    }

    /// Sums the per-CPU values without stopping traffic.
    pub fn read(&self) -> Result<CounterSnapshot, EbpfError> {
        let names: BTreeMap<u32, String> = self
            .attached
            .iter()
            .map(|(name, attachment)| (attachment.ifindex, name.clone()))
            .collect();
        let counters = PerCpuHashMap::<&MapData, CounterKey, Counts>::try_from(
            self.ebpf
                .map(COUNTERS_MAP)
                .ok_or(missing_map(COUNTERS_MAP))?,
        )
        .map_err(EbpfError::map(COUNTERS_MAP))?;
        // A key deleted between listing and lookup (a detach) is simply not in this read.
        let entries: Vec<(CounterKey, Vec<Counts>)> = counters
            .iter()
            .flatten()
            .map(|(key, values)| (key, values.iter().copied().collect()))
            .collect();
        let listen = PerCpuArray::<&MapData, ListenerCounts>::try_from(
            self.ebpf
                .map(LISTENER_MAP)
                .ok_or(missing_map(LISTENER_MAP))?,
        )
        .map_err(EbpfError::map(LISTENER_MAP))?;
        let mut listeners = Vec::with_capacity(self.listeners.len());
        for (index, name) in self.listeners.iter().enumerate() {
            let shares: PerCpuValues<ListenerCounts> = listen
                .get(&(index as u32), 0)
                .map_err(EbpfError::map(LISTENER_MAP))?;
            listeners.push(snapshot::listener_traffic(name, &shares));
        }
        let errors = PerCpuArray::<&MapData, u64>::try_from(
            self.ebpf.map(ERRORS_MAP).ok_or(missing_map(ERRORS_MAP))?,
        )
        .map_err(EbpfError::map(ERRORS_MAP))?;
        let map_full = errors
            .get(&ERR_COUNTERS_FULL, 0)
            .map_err(EbpfError::map(ERRORS_MAP))?
            .iter()
            .sum();
        Ok(CounterSnapshot {
            interfaces: snapshot::interface_counters(entries, &names),
            listeners,
            map_full,
            attached: self.attached(),
        })
    }

    /// `run_time_ns` / `run_cnt` of each program; zero unless `kernel.bpf_stats_enabled=1`.
    pub fn program_stats(&self) -> Result<Vec<ProgramStats>, EbpfError> {
        Direction::ALL
            .iter()
            .map(|direction| {
                let program = direction.program();
                let info = self
                    .ebpf
                    .program(program)
                    .ok_or_else(missing_program)?
                    .info()
                    .map_err(|e| EbpfError::program(program, e))?;
                Ok(ProgramStats {
                    program,
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                    run_count: info.run_count(),
                })
            })
            .collect()
    }
}

impl Drop for EbpfCounters {
    /// aya would detach on drop too, but netlink filters must be removed from their own
    /// namespace, whatever thread drops us; TCX links simply close.
    fn drop(&mut self) {
        let interfaces: Vec<String> = self.attached.keys().cloned().collect();
        for interface in interfaces {
            if let Err(e) = self.detach(&interface) {
                tracing::warn!(%interface, error = %e, "eBPF counters: detaching on drop");
            }
        }
    }
}

/// Listener ports as map entries (key -> listener id = index), refusing what the map cannot
/// hold or would make ambiguous.
fn listener_ports(listeners: &[Listener]) -> Result<Vec<(PortKey, u32)>, EbpfError> {
    if listeners.len() > MAX_LISTENERS {
        return Err(EbpfError::TooManyListeners {
            count: listeners.len(),
            max: MAX_LISTENERS,
        });
    }
    let mut seen: HashMap<PortKey, &str> = HashMap::new();
    let mut ports = Vec::with_capacity(listeners.len());
    for (id, listener) in listeners.iter().enumerate() {
        let key = PortKey {
            port: listener.port,
            protocol: listener.protocol.raw(),
            pad: 0,
        };
        if let Some(first) = seen.insert(key, &listener.name) {
            return Err(EbpfError::DuplicateListenerPort {
                first: first.to_string(),
                second: listener.name.clone(),
                port: listener.port,
            });
        }
        ports.push((key, id as u32));
    }
    Ok(ports)
}

fn classifier(ebpf: &mut Ebpf, direction: Direction) -> Result<&mut SchedClassifier, EbpfError> {
    ebpf.program_mut(direction.program())
        .ok_or_else(missing_program)?
        .try_into()
        .map_err(|e| EbpfError::program(direction.program(), e))
}

/// A netlink filter that a newer instance removed (taking the hook over) is already detached.
fn taken_over_is_gone(
    direction: Direction,
    interface: &str,
    result: Result<(), aya::programs::ProgramError>,
) -> Result<(), EbpfError> {
    match result {
        Ok(()) => Ok(()),
        Err(aya::programs::ProgramError::NetlinkError(e))
            if e.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(e) => Err(EbpfError::Hook {
            action: "detaching",
            program: direction.program(),
            interface: interface.to_string(),
            source: std::io::Error::other(e),
        }),
    }
}

fn missing_map(map: &'static str) -> EbpfError {
    EbpfError::Map {
        map,
        source: aya::maps::MapError::InvalidName {
            name: map.to_string(),
        },
    }
}

fn missing_program() -> EbpfError {
    EbpfError::Program {
        program: "sluice_ingress/sluice_egress",
        source: aya::programs::ProgramError::UnexpectedProgramType,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::L4;

    fn listener(name: &str, port: u16, protocol: L4) -> Listener {
        Listener {
            name: name.to_string(),
            port,
            protocol,
        }
    }

    #[test]
    fn listener_ids_follow_registration_order() {
        let ports = listener_ports(&[
            listener("agent", 8080, L4::Tcp),
            listener("dns", 8080, L4::Udp),
        ])
        .expect("valid");
        assert_eq!(ports.len(), 2);
        assert_eq!(
            (ports[0].0.port, ports[0].0.protocol, ports[0].1),
            (8080, 6, 0)
        );
        assert_eq!(
            (ports[1].0.port, ports[1].0.protocol, ports[1].1),
            (8080, 17, 1)
        );
    }

    #[test]
    fn listeners_the_map_cannot_hold_are_refused() {
        let duplicate = listener_ports(&[listener("a", 443, L4::Tcp), listener("b", 443, L4::Tcp)]);
        assert!(matches!(
            duplicate,
            Err(EbpfError::DuplicateListenerPort { port: 443, .. })
        ));
        let many: Vec<Listener> = (0..=MAX_LISTENERS as u16)
            .map(|i| listener(&format!("l{i}"), 1000 + i, L4::Tcp))
            .collect();
        assert!(matches!(
            listener_ports(&many),
            Err(EbpfError::TooManyListeners { count: 65, max: 64 })
        ));
    }
}
