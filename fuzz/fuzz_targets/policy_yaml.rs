//! VM policy files: `sluice_policy::load::load_str`, as YAML (first byte even) or JSON (odd).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_policy::load::{load_str, Format};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = if mode % 2 == 0 {
        Format::Yaml
    } else {
        Format::Json
    };
    if let Err(errors) = load_str(text, "fuzz.yaml", format) {
        let _ = errors.to_string();
    }
});
