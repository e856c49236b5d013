//! What the VM agent reads back from ovs-vswitchd after a crash to undo an uplink takeover: an
//! OVSDB `map` of strings (`sluice_ovs::ovsdb_ports::parse_ovsdb_map`) and the uplink record
//! kept in the uplink Port's `external_ids`
//! (`sluice_uplink::UplinkRecord::from_external_ids`, with `Isolation::from_external_id` and
//! `parse_mac`). The first byte picks the input form: OVSDB JSON, or `key=value` lines.
//!
//! Properties: a parsed map written back as OVSDB JSON parses to the same map; an accepted
//! record written back as `external_ids` reads back as the same record; a Port without the
//! `sluice-uplink` key is not an uplink.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_ovs::ovsdb_ports::{ovsdb_map, parse_ovsdb_map};
use sluice_uplink::record::{format_mac, parse_mac, KEY_MAC, KEY_UPLINK};
use sluice_uplink::UplinkRecord;

const PORT: &str = "eth0~";

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let ids = if which % 2 == 0 {
        let Ok(value) = serde_json::from_slice::<Value>(rest) else {
            return;
        };
        let Ok(map) = parse_ovsdb_map(&value) else {
            return;
        };
        assert_eq!(parse_ovsdb_map(&ovsdb_map(&map)).ok().as_ref(), Some(&map));
        map
    } else {
        lines(rest)
    };
    record(&ids);
});

fn lines(data: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn record(ids: &BTreeMap<String, String>) {
    if let Some(mac) = ids.get(KEY_MAC).and_then(|text| parse_mac(text)) {
        assert_eq!(parse_mac(&format_mac(&mac)), Some(mac));
    }
    match UplinkRecord::from_external_ids(PORT, ids) {
        Ok(None) => assert!(!ids.contains_key(KEY_UPLINK)),
        Ok(Some(record)) => {
            assert_eq!(record.renamed, PORT);
            let written = record.external_ids();
            assert_eq!(
                UplinkRecord::from_external_ids(PORT, &written),
                Ok(Some(record))
            );
        }
        Err(error) => assert_eq!(error.port, PORT),
    }
}
