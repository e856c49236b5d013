//! The gateway's request info: `sluice_gateway::request_info::decode_path` then
//! `RequestInfo::parse`. Input: `METHOD PATH[?QUERY]`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_gateway::request_info::{decode_path, RequestInfo};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (method, url) = text.split_once(' ').unwrap_or(("GET", text));
    let (raw_path, query) = url.split_once('?').unwrap_or((url, ""));
    // Paths that decode two ways are refused before request info is built.
    let Ok(path) = decode_path(raw_path) else {
        return;
    };
    if let Ok(info) = RequestInfo::parse(method, &path, query) {
        let _ = info.is_long_running();
        let _ = info.verb.as_str();
        if info.is_resource_request {
            assert!(info.api_prefix == "api" || info.api_prefix == "apis");
        }
        assert_eq!(info.path, &*path);
    }
});
