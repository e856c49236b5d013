//! `grpc-timeout` header values: `sluice_grpc::parse_timeout`, and the round trip through
//! `encode_timeout` (which rounds up, so a forwarded deadline never shrinks).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_grpc::{encode_timeout, parse_timeout};

fuzz_target!(|data: &[u8]| {
    let Ok(duration) = parse_timeout(data) else {
        return;
    };
    let encoded = encode_timeout(duration);
    let again = parse_timeout(encoded.as_bytes()).expect("encode_timeout output must parse");
    assert!(
        again >= duration,
        "{data:?}: {duration:?} -> {encoded} -> {again:?}"
    );
});
