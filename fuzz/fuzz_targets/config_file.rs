//! The main config file (`/etc/sluice/config.yaml`, `--config`): `sluice_config::load_str`,
//! YAML into the raw types, then every field's check. A bad file is an `InvalidConfig` that
//! names the file and at least one field error with its reason, never a panic; loading is
//! deterministic (a reload of the same text gives the same verdict).
#![no_main]
use libfuzzer_sys::fuzz_target;

const ORIGIN: &str = "/etc/sluice/fuzz.yaml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The checks open the files the config names and read secrets whole: a path to a device,
    // a FIFO or a kernel file would test the machine, not the decoder (and can block). YAML
    // spells a `/` only literally or through a `\` escape; relative paths start in the
    // checkout, where these directories are not.
    if ["/dev", "/proc", "/sys", "/run", "\\"]
        .iter()
        .any(|part| text.contains(part))
    {
        return;
    }
    match sluice_config::load_str(text, ORIGIN) {
        Ok(_) => assert!(sluice_config::load_str(text, ORIGIN).is_ok()),
        Err(invalid) => {
            assert_eq!(invalid.origin, ORIGIN);
            assert!(!invalid.errors.is_empty(), "an error without a field error");
            for error in &invalid.errors {
                assert!(
                    !error.reason.is_empty(),
                    "field error {:?} without a reason",
                    error.path
                );
            }
            let again = sluice_config::load_str(text, ORIGIN).expect_err("verdict changed");
            assert_eq!(again.errors.len(), invalid.errors.len());
        }
    }
});
