//! OVSDB JSON-RPC from ovsdb-server: `sluice_ovs::ovsdb::JsonStream` splitting a byte stream
//! (fed in chunks) into values, and `check_transact_result` on each value and its `result`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_ovs::ovsdb::{check_transact_result, JsonStream};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(mode % 32) + 1;
    let mut stream = JsonStream::default();
    let mut values = Vec::new();
    'chunks: for chunk in rest.chunks(step) {
        stream.push(chunk);
        loop {
            match stream.next_value() {
                Ok(Some(value)) => values.push(value),
                Ok(None) => break,
                Err(_) => break 'chunks,
            }
        }
    }
    for value in &values {
        let count = usize::from(mode >> 5);
        let _ = check_transact_result("fuzz", count, value);
        if let Some(result) = value.get("result") {
            let _ = check_transact_result("fuzz", count, result);
        }
    }
});
