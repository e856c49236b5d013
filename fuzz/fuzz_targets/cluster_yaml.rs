//! UpstreamCluster files: `sluice_gateway::cluster::parse_clusters` (YAML, all documents, with
//! validation; touches no file), then `check_unique` over what loaded and the gateway's
//! compiled snapshot of it (endpoint and agent servers, dispatch policies).
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_gateway::cluster::{check_unique, parse_clusters, GatewaySnapshot, InvalidSources};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_clusters(text, Path::new("/etc/sluice/clusters/fuzz.yaml")) {
        Ok(clusters) => {
            let mut errors = InvalidSources::default();
            check_unique(&clusters, &mut errors);
            let _ = GatewaySnapshot::compile(clusters);
        }
        Err(errors) => {
            let _ = errors.to_string();
        }
    }
});
