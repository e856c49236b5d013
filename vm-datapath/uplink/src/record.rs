//! What the takeover observes and what it records: the uplink's state, its routes, and the
//! `external_ids` on the uplink's OVS Port that let an agent restart (or `restore`) find out what
//! was taken over and how to undo it. Pure data.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::isolation::Isolation;

/// Linux's interface name limit: IFNAMSIZ (16) less the terminating NUL.
pub const MAX_LINK_NAME: usize = 15;

/// Port `external_ids` keys. The first marks the uplink's Port and names the uplink.
pub const KEY_UPLINK: &str = "sluice-uplink";
pub const KEY_MAC: &str = "sluice-uplink-mac";
pub const KEY_MTU: &str = "sluice-uplink-mtu";
pub const KEY_IPS: &str = "sluice-uplink-ips";
/// The IPv4 addresses of `KEY_IPS` that had no broadcast address (added without `brd`).
pub const KEY_IPS_NO_BROADCAST: &str = "sluice-uplink-ips-nobrd";
pub const KEY_ROUTES: &str = "sluice-uplink-routes";
/// The uplink's own `rp_filter`, `arp_ignore`, `disable_ipv6` (see `isolation.rs`).
pub const KEY_SYSCTLS: &str = "sluice-uplink-sysctls";
/// Marks the internal port that took the uplink's name.
pub const KEY_INTERNAL: &str = "sluice-internal";

/// One main-table route whose output device is the uplink. Serialized compactly (short keys,
/// absent options left out): the list is stored in one OVSDB string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSpec {
    /// Destination; `0.0.0.0/0` or `::/0` for the default route.
    pub dst: IpNet,
    #[serde(rename = "gw", default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Metric (`RTA_PRIORITY`); `None` when the kernel reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// `RT_SCOPE_*` (0 universe, 253 link).
    #[serde(default)]
    pub scope: u8,
    /// `RTPROT_*` (2 kernel, 3 boot, 4 static).
    #[serde(rename = "proto", default)]
    pub protocol: u8,
    /// Preferred source address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<IpAddr>,
}

impl RouteSpec {
    /// The same route as far as the kernel's identity goes (what `EEXIST`/`ESRCH` compare).
    pub fn same_route(&self, other: &RouteSpec) -> bool {
        self.dst == other.dst
            && self.gateway == other.gateway
            && self.metric.unwrap_or(0) == other.metric.unwrap_or(0)
    }
}

/// Routes in the order they can be added: on-link routes first, then routes via a gateway
/// (which need an on-link route to the gateway), the default routes last. Deleting goes in
/// the reverse order.
pub fn routes_in_add_order(routes: &[RouteSpec]) -> Vec<RouteSpec> {
    let mut ordered = routes.to_vec();
    ordered.sort_by_key(|route| (route.gateway.is_some(), route.dst.prefix_len() == 0));
    ordered
}

/// A link as observed: what the takeover needs from the uplink (and later the internal port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub name: String,
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub up: bool,
    /// TX checksum offload (see `ethtool.rs`).
    pub tx_checksum: bool,
    /// The sysctls that keep the VM's stack off a bridged device (see `isolation.rs`).
    pub isolation: Isolation,
    /// IPv4 and IPv6 addresses with their prefix length, link-local IPv6 left out (the kernel
    /// makes those itself).
    pub addresses: Vec<IpNet>,
    /// The IPv4 addresses among them without a broadcast address.
    pub without_broadcast: Vec<IpNet>,
    /// Main-table unicast routes out of this link, IPv6 link-local ones left out.
    pub routes: Vec<RouteSpec>,
}

/// What a takeover recorded on the uplink's Port: enough to rebuild [`crate::TakenOver`] and to
/// undo the takeover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UplinkRecord {
    pub uplink: String,
    pub renamed: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addresses: Vec<IpNet>,
    pub without_broadcast: Vec<IpNet>,
    pub routes: Vec<RouteSpec>,
    pub isolation: Isolation,
}

/// Why a Port's `external_ids` do not make an [`UplinkRecord`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("external_ids:{key} of port `{port}` is {problem}")]
pub struct RecordError {
    pub port: String,
    pub key: &'static str,
    pub problem: String,
}

/// `U~`, refused when it would not fit a Linux interface name.
pub fn renamed_name(uplink: &str) -> Option<String> {
    let renamed = format!("{uplink}~");
    (!uplink.is_empty() && renamed.len() <= MAX_LINK_NAME).then_some(renamed)
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

impl UplinkRecord {
    /// The record of a takeover of the observed uplink `state`.
    pub fn of(state: &LinkState, renamed: &str) -> Self {
        UplinkRecord {
            uplink: state.name.clone(),
            renamed: renamed.to_string(),
            mac: state.mac,
            mtu: state.mtu,
            addresses: state.addresses.clone(),
            without_broadcast: state.without_broadcast.clone(),
            routes: state.routes.clone(),
            isolation: state.isolation,
        }
    }

    /// The uplink Port's `external_ids`.
    pub fn external_ids(&self) -> BTreeMap<String, String> {
        let list = |nets: &[IpNet]| {
            nets.iter()
                .map(IpNet::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        // Serializing plain strings, numbers and addresses cannot fail; an empty list is the
        // harmless fallback all the same.
        let routes = serde_json::to_string(&self.routes).unwrap_or_else(|_| "[]".to_string());
        [
            (KEY_UPLINK, self.uplink.clone()),
            (KEY_MAC, format_mac(&self.mac)),
            (KEY_MTU, self.mtu.to_string()),
            (KEY_IPS, list(&self.addresses)),
            (KEY_IPS_NO_BROADCAST, list(&self.without_broadcast)),
            (KEY_ROUTES, routes),
            (KEY_SYSCTLS, self.isolation.to_external_id()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect()
    }

    /// Reads the record back from the Port named `port`; `Ok(None)` when the Port carries no
    /// `sluice-uplink` key (not an uplink port).
    pub fn from_external_ids(
        port: &str,
        ids: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, RecordError> {
        let Some(uplink) = ids.get(KEY_UPLINK) else {
            return Ok(None);
        };
        let fail = |key: &'static str, problem: String| RecordError {
            port: port.to_string(),
            key,
            problem,
        };
        let get = |key: &'static str| ids.get(key).ok_or_else(|| fail(key, "missing".to_string()));
        let mac_text = get(KEY_MAC)?;
        let mac = parse_mac(mac_text).ok_or_else(|| fail(KEY_MAC, format!("`{mac_text}`")))?;
        let mtu_text = get(KEY_MTU)?;
        let mtu = mtu_text
            .parse()
            .map_err(|_| fail(KEY_MTU, format!("`{mtu_text}`")))?;
        let cidrs = |key: &'static str, text: &str| {
            text.split(',')
                .filter(|part| !part.is_empty())
                .map(|part| {
                    part.parse()
                        .map_err(|_| fail(key, format!("`{part}`, not a CIDR")))
                })
                .collect::<Result<Vec<IpNet>, _>>()
        };
        let addresses = cidrs(KEY_IPS, get(KEY_IPS)?)?;
        // Absent from records written before it existed: every address had its broadcast.
        let no_broadcast = ids.get(KEY_IPS_NO_BROADCAST).map_or("", String::as_str);
        let without_broadcast = cidrs(KEY_IPS_NO_BROADCAST, no_broadcast)?;
        let routes = serde_json::from_str(get(KEY_ROUTES)?)
            .map_err(|e| fail(KEY_ROUTES, format!("not a route list: {e}")))?;
        let isolation = match ids.get(KEY_SYSCTLS) {
            None => Isolation::DEFAULT,
            Some(text) => Isolation::from_external_id(text)
                .ok_or_else(|| fail(KEY_SYSCTLS, format!("`{text}`")))?,
        };
        Ok(Some(UplinkRecord {
            uplink: uplink.clone(),
            renamed: port.to_string(),
            mac,
            mtu,
            addresses,
            without_broadcast,
            routes,
            isolation,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, gateway: Option<&str>) -> RouteSpec {
        RouteSpec {
            dst: dst.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            metric: Some(100),
            scope: if gateway.is_some() { 0 } else { 253 },
            protocol: 4,
            src: None,
        }
    }

    fn record() -> UplinkRecord {
        UplinkRecord {
            uplink: "eth0".into(),
            renamed: "eth0~".into(),
            mac: [0x02, 0, 0xab, 0xcd, 0xef, 0x01],
            mtu: 9000,
            addresses: vec![
                "10.1.2.3/24".parse().unwrap(),
                "2001:db8::3/64".parse().unwrap(),
            ],
            without_broadcast: vec!["10.1.2.3/24".parse().unwrap()],
            routes: vec![
                route("0.0.0.0/0", Some("10.1.2.1")),
                route("10.1.2.0/24", None),
            ],
            isolation: Isolation {
                rp_filter: 2,
                arp_ignore: 1,
                disable_ipv6: 0,
            },
        }
    }

    #[test]
    fn external_ids_round_trip() {
        let record = record();
        let ids = record.external_ids();
        assert_eq!(ids[KEY_IPS], "10.1.2.3/24,2001:db8::3/64");
        assert_eq!(ids[KEY_MAC], "02:00:ab:cd:ef:01");
        assert!(ids[KEY_ROUTES].starts_with(r#"[{"dst":"0.0.0.0/0","gw":"10.1.2.1","metric":100"#));
        let back = UplinkRecord::from_external_ids("eth0~", &ids).unwrap();
        assert_eq!(back, Some(record));
    }

    #[test]
    fn a_port_without_the_key_is_no_record_and_a_broken_one_names_the_key() {
        assert_eq!(
            UplinkRecord::from_external_ids("p", &BTreeMap::new()),
            Ok(None)
        );
        let mut ids = record().external_ids();
        ids.insert(KEY_MTU.into(), "big".into());
        let error = UplinkRecord::from_external_ids("eth0~", &ids).unwrap_err();
        assert_eq!(error.key, KEY_MTU);
        ids.remove(KEY_MAC);
        let error = UplinkRecord::from_external_ids("eth0~", &ids).unwrap_err();
        assert_eq!(
            error.to_string(),
            "external_ids:sluice-uplink-mac of port `eth0~` is missing"
        );
    }

    #[test]
    fn renaming_refuses_names_past_the_kernel_limit() {
        assert_eq!(renamed_name("eth0").as_deref(), Some("eth0~"));
        assert_eq!(renamed_name("enp0s31f6abcdef").as_deref(), None); // 15 + 1
        assert_eq!(
            renamed_name("enp0s31f6abcde").as_deref(),
            Some("enp0s31f6abcde~")
        );
        assert_eq!(renamed_name(""), None);
    }

    #[test]
    fn default_routes_come_last_and_macs_parse_strictly() {
        let ordered = routes_in_add_order(&[
            route("0.0.0.0/0", Some("10.1.2.1")),
            route("10.9.0.0/16", Some("10.1.2.254")),
            route("10.1.2.0/24", None),
        ]);
        let dsts: Vec<String> = ordered.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.1.2.0/24", "10.9.0.0/16", "0.0.0.0/0"]);
        assert_eq!(
            parse_mac("02:00:ab:cd:ef:01"),
            Some([2, 0, 0xab, 0xcd, 0xef, 1])
        );
        assert_eq!(parse_mac("02:00:ab:cd:ef"), None);
        assert_eq!(parse_mac("02:00:ab:cd:ef:01:02"), None);
    }
}
