//! OVSDB requests for ports that carry data of their own: a port added with `external_ids` on
//! its Port row and a `mac` on its Interface (the uplink takeover records what it must undo
//! there, so an agent restart can read it back), the ports of a bridge with their
//! `external_ids`, and a bridge's datapath type.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::ovsdb::{OvsdbClient, OvsdbError, PortKind};

/// A port to add to a bridge, with the columns beyond its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPort {
    /// Port and interface name (for a system port: the existing device's name).
    pub name: String,
    pub kind: PortKind,
    /// The Interface's `mac` column, e.g. `"02:00:00:00:00:01"`: the MAC ovs-vswitchd gives an
    /// internal port's device. `None` leaves OVS's default.
    pub mac: Option<String>,
    /// The Port row's `external_ids`.
    pub external_ids: BTreeMap<String, String>,
}

/// One port of a bridge as OVSDB records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRecord {
    pub name: String,
    pub external_ids: BTreeMap<String, String>,
}

/// An OVSDB `map` value (`["map", [[k, v], ...]]`) of string pairs.
pub fn ovsdb_map(map: &BTreeMap<String, String>) -> Value {
    let pairs: Vec<Value> = map.iter().map(|(k, v)| json!([k, v])).collect();
    json!(["map", pairs])
}

/// Reads an OVSDB `map` of strings back.
pub fn parse_ovsdb_map(value: &Value) -> Result<BTreeMap<String, String>, OvsdbError> {
    let bad = || OvsdbError::Protocol(format!("not a map of strings: {value}"));
    if value.get(0).and_then(Value::as_str) != Some("map") {
        return Err(bad());
    }
    let pairs = value.get(1).and_then(Value::as_array).ok_or_else(bad)?;
    pairs
        .iter()
        .map(|pair| {
            let key = pair.get(0).and_then(Value::as_str).ok_or_else(bad)?;
            let value = pair.get(1).and_then(Value::as_str).ok_or_else(bad)?;
            Ok((key.to_string(), value.to_string()))
        })
        .collect()
}

/// The uuids of an OVSDB set-of-uuids column: a set has two encodings, `["uuid", u]` for one
/// member and `["set", [["uuid", u], ...]]` for any number.
fn uuid_set(value: &Value) -> Vec<String> {
    match value.get(0).and_then(Value::as_str) {
        Some("uuid") => value
            .get(1)
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect(),
        Some("set") => value
            .get(1)
            .and_then(Value::as_array)
            .map(|members| {
                members
                    .iter()
                    .filter_map(|m| m.get(1).and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn first_row(results: &[Value], index: usize) -> Option<&Value> {
    results.get(index).and_then(|r| r["rows"].get(0))
}

impl OvsdbClient {
    /// Adds `port` to `bridge` in one transaction (Interface with its type and MAC, Port with
    /// its external_ids) and returns its OpenFlow port number once ovs-vswitchd assigned one.
    pub async fn add_port_with(&mut self, bridge: &str, port: &NewPort) -> Result<u32, OvsdbError> {
        if self.uuid_of("Bridge", bridge).await?.is_none() {
            return Err(OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            });
        }
        if self.uuid_of("Port", &port.name).await?.is_some() {
            return Err(OvsdbError::AlreadyExists {
                table: "Port",
                name: port.name.clone(),
            });
        }
        let mut interface = json!({"name": port.name, "type": match port.kind {
            PortKind::Internal => "internal",
            PortKind::System => "",
        }});
        if let Some(mac) = &port.mac {
            interface["mac"] = json!(mac);
        }
        let mut operations = vec![
            json!({"op": "insert", "table": "Interface", "row": interface, "uuid-name": "iface"}),
            json!({"op": "insert", "table": "Port", "row": {
                "name": port.name,
                "interfaces": ["named-uuid", "iface"],
                "external_ids": ovsdb_map(&port.external_ids),
            }, "uuid-name": "port"}),
            json!({"op": "mutate", "table": "Bridge", "where": [["name", "==", bridge]],
                "mutations": [["ports", "insert", ["set", [["named-uuid", "port"]]]]]}),
        ];
        operations.extend(Self::bump_next_cfg());
        let what = format!("add port {} to {bridge}", port.name);
        let results = self.transact(&what, operations).await?;
        let next_cfg = Self::next_cfg_of(&results)?;
        self.wait_for_vswitchd(next_cfg, &format!("port {}", port.name))
            .await?;
        self.ofport(&port.name).await
    }

    /// The ports of `bridge` with their `external_ids`, sorted by name.
    pub async fn bridge_ports(&mut self, bridge: &str) -> Result<Vec<PortRecord>, OvsdbError> {
        let results = self
            .transact(
                &format!("read the ports of {bridge}"),
                vec![
                    json!({"op": "select", "table": "Bridge", "where": [["name", "==", bridge]], "columns": ["ports"]}),
                    json!({"op": "select", "table": "Port", "where": [], "columns": ["_uuid", "name", "external_ids"]}),
                ],
            )
            .await?;
        let bridge_row = first_row(&results, 0).ok_or_else(|| OvsdbError::NotFound {
            table: "Bridge",
            name: bridge.to_string(),
        })?;
        let members = uuid_set(&bridge_row["ports"]);
        let rows = results
            .get(1)
            .and_then(|r| r["rows"].as_array())
            .cloned()
            .unwrap_or_default();
        let mut ports = Vec::new();
        for row in rows {
            let uuid = row["_uuid"].get(1).and_then(Value::as_str).unwrap_or("");
            if !members.iter().any(|member| member == uuid) {
                continue;
            }
            let name = row["name"]
                .as_str()
                .ok_or_else(|| OvsdbError::Protocol(format!("a Port row without a name: {row}")))?;
            ports.push(PortRecord {
                name: name.to_string(),
                external_ids: parse_ovsdb_map(&row["external_ids"])?,
            });
        }
        ports.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ports)
    }

    /// The `datapath_type` of `bridge`: `netdev` for the userspace datapath, `system` or empty
    /// (the default, also the kernel datapath) otherwise.
    pub async fn datapath_type(&mut self, bridge: &str) -> Result<String, OvsdbError> {
        let results = self
            .transact(
                &format!("read the datapath type of {bridge}"),
                vec![json!({"op": "select", "table": "Bridge", "where": [["name", "==", bridge]], "columns": ["datapath_type"]})],
            )
            .await?;
        let row = first_row(&results, 0).ok_or_else(|| OvsdbError::NotFound {
            table: "Bridge",
            name: bridge.to_string(),
        })?;
        row["datapath_type"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| OvsdbError::Protocol(format!("datapath_type is not a string: {row}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_round_trip_and_reject_other_shapes() {
        let map: BTreeMap<String, String> = [
            ("a", "1"),
            ("sluice-uplink-routes", "[{\"dst\":\"0.0.0.0/0\"}]"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(parse_ovsdb_map(&ovsdb_map(&map)).unwrap(), map);
        assert!(parse_ovsdb_map(&json!(["map", []])).unwrap().is_empty());
        assert!(parse_ovsdb_map(&json!(["set", []])).is_err());
        assert!(parse_ovsdb_map(&json!(["map", [["a", 1]]])).is_err());
    }

    #[test]
    fn uuid_sets_have_two_encodings() {
        assert_eq!(uuid_set(&json!(["uuid", "u1"])), vec!["u1"]);
        assert_eq!(
            uuid_set(&json!(["set", [["uuid", "u1"], ["uuid", "u2"]]])),
            vec!["u1", "u2"]
        );
        assert!(uuid_set(&json!(["set", []])).is_empty());
    }
}
