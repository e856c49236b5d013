//! CPU time and memory of the proxy's processes, read from procfs.

use serde::Serialize;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProcError {
    #[error("/proc/PID/stat: no `)` after the command name")]
    NoCommandEnd,
    #[error("/proc/PID/stat: field {0} missing or not a number")]
    BadField(usize),
    #[error("/proc/PID/status: no VmRSS line")]
    NoRss,
}

/// utime + stime in clock ticks from the text of `/proc/PID/stat` (all threads of the process).
pub fn parse_stat_cpu_ticks(stat: &str) -> Result<u64, ProcError> {
    // The command name (field 2) is in parentheses and may itself contain spaces or `)`.
    let after_name = stat.rfind(')').ok_or(ProcError::NoCommandEnd)?;
    let fields: Vec<&str> = stat[after_name + 1..].split_whitespace().collect();
    // Fields after the name start at field 3 (state); utime is field 14, stime field 15.
    let field = |number: usize| -> Result<u64, ProcError> {
        fields
            .get(number - 3)
            .and_then(|text| text.parse().ok())
            .ok_or(ProcError::BadField(number))
    };
    Ok(field(14)? + field(15)?)
}

/// VmRSS in KiB from the text of `/proc/PID/status`.
pub fn parse_status_rss_kib(status: &str) -> Result<u64, ProcError> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or(ProcError::NoRss)
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// CPU microseconds used so far by process `pid`.
pub fn cpu_micros(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok(parse_stat_cpu_ticks(&stat)? * 1_000_000 / clock_ticks_per_second())
}

pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(parse_status_rss_kib(&status)?)
}

/// One process of the proxy side during one measured interval.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessUsage {
    pub name: String,
    pub pid: u32,
    pub cpu_us: u64,
    pub rss_kib: u64,
}

/// CPU of a set of processes between `start` and `finish`.
#[derive(Debug)]
pub struct CpuMeter {
    processes: Vec<(String, u32, u64)>,
}

impl CpuMeter {
    pub fn start(processes: &[(String, u32)]) -> anyhow::Result<Self> {
        let processes = processes
            .iter()
            .map(|(name, pid)| Ok((name.clone(), *pid, cpu_micros(*pid)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { processes })
    }

    pub fn finish(self) -> anyhow::Result<Vec<ProcessUsage>> {
        self.processes
            .into_iter()
            .map(|(name, pid, before)| {
                Ok(ProcessUsage {
                    cpu_us: cpu_micros(pid)?.saturating_sub(before),
                    rss_kib: rss_kib(pid)?,
                    name,
                    pid,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STAT: &str = "4242 (sluice) worker) S 1 4242 4242 0 -1 4194560 2405 0 0 0 731 129 0 0 20 0 3 0 1234 123456789 7654 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 0 0 0 0 0 0\n";

    #[test]
    fn stat_cpu_is_user_plus_system() {
        assert_eq!(parse_stat_cpu_ticks(STAT), Ok(731 + 129));
        assert_eq!(
            parse_stat_cpu_ticks("4242 sluice"),
            Err(ProcError::NoCommandEnd)
        );
        assert_eq!(
            parse_stat_cpu_ticks("1 (x) S 1 2"),
            Err(ProcError::BadField(14))
        );
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        cpu_micros(pid).unwrap();
    }

    #[test]
    fn status_rss() {
        let status = "Name:\tsluice\nVmPeak:\t  99 kB\nVmRSS:\t   30616 kB\nThreads:\t3\n";
        assert_eq!(parse_status_rss_kib(status), Ok(30616));
        assert_eq!(parse_status_rss_kib("Name:\tx\n"), Err(ProcError::NoRss));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(text in "(?s).{0,300}") {
            let _ = parse_stat_cpu_ticks(&text);
            let _ = parse_status_rss_kib(&text);
        }
    }
}
