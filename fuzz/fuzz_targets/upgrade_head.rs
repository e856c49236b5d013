//! The gateway's HTTP/1.1 upgrade heads: `sluice_gateway_proxy::parse_request` (client
//! request) and `parse_response_status` (apiserver answer). A parsed request re-encoded by
//! `upstream_head` must parse again with the same method, target and headers, and exactly one
//! `host` (the upstream's).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_gateway_proxy::{is_upgrade, parse_request, parse_response_status, upstream_head};

/// `parse_request`'s header limit (upgrade.rs `MAX_HEADERS`).
const MAX_HEADERS: usize = 128;

fuzz_target!(|data: &[u8]| {
    let _ = parse_response_status(data);
    let Ok(mut head) = parse_request(data) else {
        return;
    };
    let _ = is_upgrade(&head.headers);
    // The proxy drops the client's hop-by-hop headers, `host` among them, before
    // `upstream_head` adds the upstream's (headers.rs `upstream_headers`).
    head.headers.remove(http::header::HOST);
    // `upstream_head` adds `host`: a head already at the limit would not parse back with our own
    // parser; the apiserver has no such limit, so that is not a property worth asserting.
    if head.headers.len() >= MAX_HEADERS {
        return;
    }
    let upstream = upstream_head(&head, "upstream.example", 6443);
    let again = parse_request(&upstream).expect("upstream_head output parses");
    assert_eq!(again.method, head.method);
    assert_eq!(
        again.uri.path_and_query().map(|p| p.as_str()),
        Some(head.uri.path_and_query().map_or("/", |p| p.as_str()))
    );
    let hosts: Vec<_> = again.headers.get_all(http::header::HOST).iter().collect();
    assert_eq!(hosts, ["upstream.example:6443"]);
    for (name, value) in &head.headers {
        assert!(again.headers.get_all(name).iter().any(|v| v == value));
    }
});
