//! The admin endpoint's request head: `sluice_admin::parse_head`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match sluice_admin::parse_head(data) {
        Ok(Some((head, consumed))) => {
            assert!(consumed <= data.len());
            assert!(!head.path.contains('?'));
        }
        Ok(None) => {}
        Err(error) => {
            let _ = (error.status(), error.status_reason(), error.reason());
        }
    }
});
