//! What one read of the maps returns, built by a pure function from the raw entries so the
//! label mapping and the per-CPU sums are tested without a kernel.

use std::collections::BTreeMap;

use crate::layout::{CounterKey, Counts, Direction, ListenerCounts, Protocol};

/// Counters of one (interface, direction, protocol), summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub interface: String,
    pub direction: Direction,
    pub protocol: Protocol,
    pub counts: Counts,
}

/// Ingress packets to one listener's port, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTraffic {
    pub listener: String,
    pub packets: u64,
    pub bytes: u64,
    pub syns: u64,
}

/// One read of every counter, taken while traffic flows (each CPU's value is read as the
/// kernel has it at that moment; sums are monotonic between reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Sorted by interface, direction, protocol; only interfaces attached now.
    pub interfaces: Vec<InterfaceCounters>,
    /// Every registered listener, in registration order, zero if nothing arrived.
    pub listeners: Vec<ListenerTraffic>,
    /// Packets left uncounted because the counters map was full.
    pub map_full: u64,
    /// Interfaces attached now.
    pub attached: Vec<String>,
}

impl CounterSnapshot {
    /// The counts of one (interface, direction, protocol); zero when nothing was seen.
    pub fn get(&self, interface: &str, direction: Direction, protocol: Protocol) -> Counts {
        self.interfaces
            .iter()
            .find(|entry| {
                entry.interface == interface
                    && entry.direction == direction
                    && entry.protocol == protocol
            })
            .map(|entry| entry.counts)
            .unwrap_or_default()
    }

    /// One listener's traffic, if it is registered.
    pub fn listener(&self, name: &str) -> Option<&ListenerTraffic> {
        self.listeners.iter().find(|entry| entry.listener == name)
    }
}

/// Sums each key's per-CPU shares and names its interface. Keys of interfaces not in `names`
/// (detached since: their keys are being removed) are left out, so labels stay bounded by the
/// attached set.
pub(crate) fn interface_counters(
    entries: impl IntoIterator<Item = (CounterKey, Vec<Counts>)>,
    names: &BTreeMap<u32, String>,
) -> Vec<InterfaceCounters> {
    let mut summed: BTreeMap<(String, Direction, Protocol), Counts> = BTreeMap::new();
    for (key, shares) in entries {
        let (Some(name), Some(direction)) =
            (names.get(&key.ifindex), Direction::from_raw(key.direction))
        else {
            continue;
        };
        let protocol = Protocol::from_raw(key.protocol);
        summed
            .entry((name.clone(), direction, protocol))
            .or_default()
            .add(&Counts::sum(&shares));
    }
    summed
        .into_iter()
        .map(
            |((interface, direction, protocol), counts)| InterfaceCounters {
                interface,
                direction,
                protocol,
                counts,
            },
        )
        .collect()
}

pub(crate) fn listener_traffic(name: &str, shares: &[ListenerCounts]) -> ListenerTraffic {
    let total = ListenerCounts::sum(shares);
    ListenerTraffic {
        listener: name.to_string(),
        packets: total.packets,
        bytes: total.bytes,
        syns: total.syns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ifindex: u32, direction: u8, protocol: u8) -> CounterKey {
        CounterKey {
            ifindex,
            direction,
            protocol,
            pad: 0,
        }
    }

    fn counts(packets: u64, bytes: u64) -> Counts {
        Counts {
            packets,
            bytes,
            ..Counts::default()
        }
    }

    #[test]
    fn entries_are_summed_over_cpus_and_named() {
        let names = BTreeMap::from([(7, "vm0".to_string())]);
        let entries = vec![
            (key(7, 0, 17), vec![counts(2, 200), counts(3, 300)]),
            (key(7, 1, 6), vec![counts(1, 54)]),
            // Detached interface: dropped, not labelled by a number.
            (key(9, 0, 17), vec![counts(5, 500)]),
            // Two raw protocols that both map to `other` add up under one label.
            (key(7, 0, 47), vec![counts(1, 10)]),
            (key(7, 0, 255), vec![counts(1, 20)]),
            // A direction the C never writes is skipped.
            (key(7, 3, 6), vec![counts(1, 1)]),
        ];
        let snapshot = CounterSnapshot {
            interfaces: interface_counters(entries, &names),
            ..CounterSnapshot::default()
        };
        assert_eq!(snapshot.interfaces.len(), 3);
        assert_eq!(
            snapshot.get("vm0", Direction::Ingress, Protocol::Udp),
            counts(5, 500)
        );
        assert_eq!(
            snapshot.get("vm0", Direction::Egress, Protocol::Tcp),
            counts(1, 54)
        );
        assert_eq!(
            snapshot.get("vm0", Direction::Ingress, Protocol::Other),
            counts(2, 30)
        );
        assert_eq!(
            snapshot.get("vm0", Direction::Egress, Protocol::Udp),
            Counts::default()
        );
    }

    #[test]
    fn listener_shares_are_summed() {
        let shares = [
            ListenerCounts {
                packets: 3,
                bytes: 222,
                syns: 3,
            },
            ListenerCounts {
                packets: 2,
                bytes: 148,
                syns: 2,
            },
        ];
        assert_eq!(
            listener_traffic("agent", &shares),
            ListenerTraffic {
                listener: "agent".to_string(),
                packets: 5,
                bytes: 370,
                syns: 5
            }
        );
    }
}
