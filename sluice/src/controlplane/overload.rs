//! The `--overload-*` flags of `sluice controlplane`: the control plane's `runtime.overload`
//! (docs/CONFIG.md), as flags because the control plane has no config file.

use std::time::Duration;

use sluice_config::{MemoryLimit, OverloadConfig};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct OverloadArgs {
    /// How often memory and descriptors are sampled (default 250ms; 10ms..=5s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub overload_interval: Option<Duration>,
    /// The memory limit: auto (the cgroup's memory.max), off, or bytes (default auto).
    #[arg(long, value_name = "auto|off|BYTES")]
    pub overload_max_memory_bytes: Option<String>,
    /// Pressure (percent of a limit) at which the listener stops accepting (default 95).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub overload_stop_accepting_percent: Option<u8>,
    /// Pressure at which new requests get 503 ServiceUnavailable (default 98).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub overload_shed_new_requests_percent: Option<u8>,
    /// An action turns off this many points below its threshold (default 5).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(0..=50))]
    pub overload_recover_margin_percent: Option<u8>,
}

impl OverloadArgs {
    /// The defaults with these flags applied; the error names the flag.
    pub fn config(&self) -> Result<OverloadConfig, String> {
        let mut config = OverloadConfig::default();
        if let Some(interval) = self.overload_interval {
            if !(Duration::from_millis(10)..=Duration::from_secs(5)).contains(&interval) {
                return Err(format!(
                    "--overload-interval: {interval:?} is out of range 10ms..=5s"
                ));
            }
            config.interval = interval;
        }
        if let Some(memory) = &self.overload_max_memory_bytes {
            config.max_memory = match memory.as_str() {
                "auto" => MemoryLimit::Auto,
                "off" => MemoryLimit::Off,
                bytes => match bytes.parse::<u64>() {
                    Ok(bytes) if bytes >= 16 << 20 => MemoryLimit::Bytes(bytes),
                    _ => {
                        return Err(format!(
                            "--overload-max-memory-bytes: {memory:?}: expected auto, off or a number of bytes of at least 16 MiB"
                        ))
                    }
                },
            };
        }
        let set = |target: &mut u8, value: Option<u8>| {
            if let Some(value) = value {
                *target = value;
            }
        };
        set(
            &mut config.stop_accepting_percent,
            self.overload_stop_accepting_percent,
        );
        set(
            &mut config.shed_new_requests_percent,
            self.overload_shed_new_requests_percent,
        );
        set(
            &mut config.recover_margin_percent,
            self.overload_recover_margin_percent,
        );
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_defaults_and_bad_values_name_the_flag() {
        assert_eq!(
            OverloadArgs::default().config().unwrap(),
            OverloadConfig::default()
        );
        let args = OverloadArgs {
            overload_max_memory_bytes: Some("off".into()),
            overload_shed_new_requests_percent: Some(60),
            ..OverloadArgs::default()
        };
        let config = args.config().unwrap();
        assert_eq!(config.max_memory, MemoryLimit::Off);
        assert_eq!(config.shed_new_requests_percent, 60);
        let small = OverloadArgs {
            overload_max_memory_bytes: Some("1000".into()),
            ..OverloadArgs::default()
        };
        assert!(small
            .config()
            .unwrap_err()
            .starts_with("--overload-max-memory-bytes"));
        let fast = OverloadArgs {
            overload_interval: Some(Duration::from_millis(1)),
            ..OverloadArgs::default()
        };
        assert!(fast
            .config()
            .unwrap_err()
            .starts_with("--overload-interval"));
    }
}
