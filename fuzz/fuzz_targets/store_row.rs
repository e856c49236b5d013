//! Rows of the control plane's embedded store as read back from its file:
//! `sluice_store::LogRow::decode` must refuse damaged bytes with `Corrupt`, never panic; a row
//! it accepts encodes back to the same bytes, and `decode_key` agrees on its key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_store::LogRow;

fuzz_target!(|data: &[u8]| {
    let decoded = LogRow::decode(7, data);
    let key = LogRow::decode_key(7, data);
    let Ok(row) = decoded else {
        return;
    };
    assert_eq!(key.ok(), Some(row.key.as_str()));
    assert_eq!(row.encode(), data);
});
