//! `runtime.overload`: the overload monitor's sampling interval, memory limit and thresholds.

use std::time::Duration;

use super::{duration, scalar, unsigned, Errors};
use crate::raw::{Leaf, RawOverload};
use crate::{MemoryLimit, OverloadConfig};

pub(crate) fn overload(raw: &RawOverload, errors: &mut Errors) -> OverloadConfig {
    let defaults = OverloadConfig::default();
    let interval = duration(
        &raw.interval,
        "runtime.overload.interval",
        defaults.interval,
        errors,
    );
    // Faster than 10 ms the sampling itself (reading the process's memory and its descriptor
    // count from /proc) costs CPU;
    // slower than 5 s a burst of connections reaches the limit between two samples.
    if !(Duration::from_millis(10)..=Duration::from_secs(5)).contains(&interval) {
        errors.push(
            "runtime.overload.interval",
            format!("{interval:?} is out of range 10ms..=5s"),
        );
    }
    let percent = |leaf: &Leaf, field: &str, default: u8, errors: &mut Errors| {
        let path = format!("runtime.overload.{field}");
        unsigned(leaf, &path, u64::from(default), (1, 100), errors) as u8
    };
    OverloadConfig {
        interval,
        max_memory: memory_limit(&raw.max_memory_bytes, errors),
        stop_accepting_percent: percent(
            &raw.stop_accepting_percent,
            "stop_accepting_percent",
            defaults.stop_accepting_percent,
            errors,
        ),
        shed_new_requests_percent: percent(
            &raw.shed_new_requests_percent,
            "shed_new_requests_percent",
            defaults.shed_new_requests_percent,
            errors,
        ),
        recover_margin_percent: unsigned(
            &raw.recover_margin_percent,
            "runtime.overload.recover_margin_percent",
            u64::from(defaults.recover_margin_percent),
            (0, 50),
            errors,
        ) as u8,
    }
}

/// `auto` (the cgroup's limit), `off`, or a number of bytes (at least 16 MiB: below that the
/// process is over it at start-up and would never accept a connection).
fn memory_limit(leaf: &Leaf, errors: &mut Errors) -> MemoryLimit {
    const PATH: &str = "runtime.overload.max_memory_bytes";
    const MIN: u64 = 16 << 20;
    let Some(value) = leaf else {
        return MemoryLimit::Auto;
    };
    let Some(text) = scalar(value, PATH, errors) else {
        return MemoryLimit::Auto;
    };
    match text.as_str() {
        "auto" => MemoryLimit::Auto,
        "off" => MemoryLimit::Off,
        _ => match text.parse::<u64>() {
            Ok(bytes) if bytes >= MIN => MemoryLimit::Bytes(bytes),
            Ok(bytes) => {
                errors.push(PATH, format!("{bytes} is below the minimum {MIN} (16 MiB)"));
                MemoryLimit::Auto
            }
            Err(_) => {
                errors.push(
                    PATH,
                    format!("invalid value {text:?}: expected auto, off or a number of bytes"),
                );
                MemoryLimit::Auto
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::{load_str, MemoryLimit, OverloadConfig};

    #[test]
    fn defaults_stop_accepting_at_95_and_shed_at_98_percent() {
        let config = load_str("", "empty.yaml").expect("valid");
        assert_eq!(config.runtime.overload, OverloadConfig::default());
        assert_eq!(config.runtime.overload.max_memory, MemoryLimit::Auto);
    }

    #[test]
    fn every_field_is_read() {
        let config = load_str(
            "runtime:\n  overload: {interval: 100ms, max_memory_bytes: 1073741824, stop_accepting_percent: 70, shed_new_requests_percent: 60, recover_margin_percent: 10}\n",
            "overload.yaml",
        )
        .expect("valid");
        let overload = config.runtime.overload;
        assert_eq!(overload.interval, std::time::Duration::from_millis(100));
        assert_eq!(overload.max_memory, MemoryLimit::Bytes(1 << 30));
        assert_eq!(overload.stop_accepting_percent, 70);
        assert_eq!(overload.shed_new_requests_percent, 60);
        assert_eq!(overload.recover_margin_percent, 10);
        let off = load_str("runtime: {overload: {max_memory_bytes: off}}\n", "off.yaml");
        assert_eq!(
            off.expect("valid").runtime.overload.max_memory,
            MemoryLimit::Off
        );
    }

    #[test]
    fn bad_values_name_their_field_and_reason() {
        let error = load_str(
            "runtime:\n  overload: {interval: 1ms, max_memory_bytes: 1000, stop_accepting_percent: 0, shed_new_requests_percent: 101, recover_margin_percent: 60, extra: 1}\n",
            "bad.yaml",
        )
        .expect_err("invalid");
        let text = error.to_string();
        for expected in [
            "runtime.overload.interval",
            "runtime.overload.max_memory_bytes: 1000 is below the minimum",
            "runtime.overload.stop_accepting_percent: 0 is out of range 1..=100",
            "runtime.overload.shed_new_requests_percent: 101 is out of range",
            "runtime.overload.recover_margin_percent: 60 is out of range 0..=50",
            "runtime.overload.extra",
        ] {
            assert!(
                text.contains(expected),
                "{expected:?} missing from:\n{text}"
            );
        }
    }
}
