//! Node entries read back from Redis (`<expiry ms>|<private address>`):
//! `sluice_tracker::parse_entry`, with the round trip through the format the tracker writes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_tracker::parse_entry;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let Some(entry) = parse_entry("node-a".into(), value) else {
        return;
    };
    let written = format!("{}|{}", entry.expires_at_unix_ms, entry.private_address);
    assert_eq!(parse_entry("node-a".into(), &written), Some(entry));
});
