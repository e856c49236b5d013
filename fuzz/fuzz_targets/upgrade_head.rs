//! The gateway's HTTP/1.1 upgrade heads: `sluice_gateway_proxy::parse_request` (client
//! request) and `parse_response_status` (apiserver answer); a parsed request re-encoded by
//! `upstream_head` must parse again with the same method, target and headers.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_gateway_proxy::{is_upgrade, parse_request, parse_response_status, upstream_head};

fuzz_target!(|data: &[u8]| {
    let _ = parse_response_status(data);
    let Ok(head) = parse_request(data) else {
        return;
    };
    let _ = is_upgrade(&head.headers);
    let upstream = upstream_head(&head, "upstream.example", 6443);
    let again = parse_request(&upstream).expect("upstream_head output parses");
    assert_eq!(again.method, head.method);
    assert_eq!(
        again.uri.path_and_query().map(|p| p.as_str()),
        Some(head.uri.path_and_query().map_or("/", |p| p.as_str()))
    );
    for (name, value) in &head.headers {
        assert!(again.headers.get_all(name).iter().any(|v| v == value));
    }
});
