//! `gateway.access_log` and `tunnel.access_log`: one structured line per request, off unless
//! enabled, optionally sampled (docs/CONFIG.md).

use serde_norway::Value;

use super::{flag, scalar, Errors};
use crate::raw::RawAccessLog;
use crate::AccessLogConfig;

/// The sparsest sampling: one request in a million.
pub(crate) const MAX_SAMPLE_EVERY: u32 = 1_000_000;

pub(super) fn access_log(
    raw: Option<&RawAccessLog>,
    path: &str,
    errors: &mut Errors,
) -> AccessLogConfig {
    let defaults = AccessLogConfig::default();
    let Some(raw) = raw else {
        return defaults;
    };
    AccessLogConfig {
        enabled: flag(
            raw.enabled.as_ref(),
            &format!("{path}.enabled"),
            defaults.enabled,
            errors,
        ),
        sample_every: raw.sample.as_ref().map_or(defaults.sample_every, |value| {
            sample(value, &format!("{path}.sample"), errors).unwrap_or(defaults.sample_every)
        }),
        errors_always: flag(
            raw.errors_always.as_ref(),
            &format!("{path}.errors_always"),
            defaults.errors_always,
            errors,
        ),
    }
}

/// `sample`: a whole number N (one request in N) or a ratio in (0, 1] (`0.01`: one in 100).
fn sample(value: &Value, path: &str, errors: &mut Errors) -> Option<u32> {
    let text = scalar(value, path, errors)?;
    let every = parse_sample(&text);
    if every.is_none() {
        errors.push(
            path,
            format!(
                "invalid sample {text:?}: expected a whole number N in 1..={MAX_SAMPLE_EVERY} \
                 (one request in N) or a ratio in (0, 1] such as 0.01"
            ),
        );
    }
    every
}

pub(crate) fn parse_sample(text: &str) -> Option<u32> {
    if let Ok(every) = text.parse::<u32>() {
        return (1..=MAX_SAMPLE_EVERY).contains(&every).then_some(every);
    }
    let ratio = text.parse::<f64>().ok()?;
    if !(ratio > 0.0 && ratio <= 1.0) {
        return None;
    }
    let every = (1.0 / ratio).round();
    (every <= f64::from(MAX_SAMPLE_EVERY)).then_some(every as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_one_in_n_or_a_ratio() {
        assert_eq!(parse_sample("1"), Some(1));
        assert_eq!(parse_sample("10"), Some(10));
        assert_eq!(parse_sample("0.01"), Some(100));
        assert_eq!(parse_sample("1.0"), Some(1));
        assert_eq!(parse_sample("0.3"), Some(3));
        for bad in [
            "0",
            "-1",
            "0.0",
            "1.5",
            "nan",
            "inf",
            "2000000",
            "0.0000001",
            "x",
        ] {
            assert_eq!(parse_sample(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_fields_name_their_path_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "gateway:\n  clusters_dir: '{}'\n  access_log: {{enabled: yes please, sample: 0, errors_always: [x], format: clf}}\n",
            dir.path().display()
        );
        let errors: Vec<String> = crate::load_str(&text, "gw.yaml")
            .expect_err("invalid")
            .errors
            .iter()
            .map(ToString::to_string)
            .collect();
        for expected in [
            "gateway.access_log.enabled: expected true or false, found \"yes please\"",
            "gateway.access_log.sample: invalid sample \"0\": expected a whole number N in 1..=1000000 (one request in N) or a ratio in (0, 1] such as 0.01",
            "gateway.access_log.errors_always: expected a single value, found a list",
            // serde_ignored's rendering of the optional sections.
            "gateway.?.access_log.?.format: unknown field",
        ] {
            assert!(errors.contains(&expected.to_string()), "{errors:?}");
        }
        let config = crate::load_str(
            &format!("gateway: {{clusters_dir: '{}'}}\n", dir.path().display()),
            "gw.yaml",
        )
        .unwrap();
        assert_eq!(
            config.gateway.unwrap().access_log,
            AccessLogConfig::default()
        );
    }
}
