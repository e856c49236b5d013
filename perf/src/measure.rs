//! CPU time and memory of the proxy's processes, read from procfs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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

/// utime + stime in microseconds of every child process this one has waited for: taken before
/// and after waiting for one child, the difference is that child's whole CPU, to the
/// microsecond (`/proc` has no entry left to read once it has exited).
pub fn waited_children_cpu_micros() -> u64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is zeroed and owned here.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0;
    }
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    micros(usage.ru_utime) + micros(usage.ru_stime)
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

/// How often [`CpuMeter`] samples resident memory while it runs.
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// The largest VmRSS of each process, sampled on a thread while a meter runs.
///
/// Why not one reading at the end: the load generator has exited by then, so every client
/// connection is closed and the allocator may already have handed pages back; the memory a
/// proxy needs *with* 512 clients connected is the peak.
#[derive(Debug)]
struct RssPeaks {
    stop: Arc<AtomicBool>,
    sampler: Option<JoinHandle<Vec<u64>>>,
}

impl RssPeaks {
    fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut peaks = vec![0u64; pids.len()];
            loop {
                for (peak, &pid) in peaks.iter_mut().zip(&pids) {
                    // A process that just exited is read once more by `finish`, which reports it.
                    if let Ok(rss) = rss_kib(pid) {
                        *peak = (*peak).max(rss);
                    }
                }
                if stopped.load(Ordering::Relaxed) {
                    return peaks;
                }
                std::thread::sleep(RSS_SAMPLE_EVERY);
            }
        });
        Self {
            stop,
            sampler: Some(sampler),
        }
    }

    /// The peaks, in the order of the pids given to `start` (empty if the sampler died).
    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler
            .take()
            .and_then(|sampler| sampler.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RssPeaks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// CPU of a set of processes between `start` and `finish`, and their peak resident memory over
/// that time.
#[derive(Debug)]
pub struct CpuMeter {
    processes: Vec<(String, u32, u64)>,
    rss: RssPeaks,
}

impl CpuMeter {
    pub fn start(processes: &[(String, u32)]) -> anyhow::Result<Self> {
        let processes: Vec<(String, u32, u64)> = processes
            .iter()
            .map(|(name, pid)| Ok((name.clone(), *pid, cpu_micros(*pid)?)))
            .collect::<anyhow::Result<_>>()?;
        let rss = RssPeaks::start(processes.iter().map(|(_, pid, _)| *pid).collect());
        Ok(Self { processes, rss })
    }

    pub fn finish(self) -> anyhow::Result<Vec<ProcessUsage>> {
        let peaks = self.rss.finish();
        self.processes
            .into_iter()
            .enumerate()
            .map(|(index, (name, pid, before))| {
                let now = rss_kib(pid)?;
                Ok(ProcessUsage {
                    cpu_us: cpu_micros(pid)?.saturating_sub(before),
                    rss_kib: peaks.get(index).copied().unwrap_or(0).max(now),
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
    fn a_waited_childs_cpu_is_counted() {
        let before = waited_children_cpu_micros();
        // A child that burns some CPU of its own (not sleeps) before it exits.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        assert!(waited_children_cpu_micros() > before);
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        cpu_micros(pid).unwrap();
    }

    #[test]
    fn the_meter_reports_the_peak_not_what_is_left_at_the_end() {
        let pid = std::process::id();
        let before = rss_kib(pid).unwrap();
        let meter = CpuMeter::start(&[("self".to_string(), pid)]).unwrap();
        let held = vec![1u8; 64 << 20];
        // Twenty sampling periods: even a sampler thread starved by a busy machine gets one.
        std::thread::sleep(RSS_SAMPLE_EVERY * 20);
        drop(std::hint::black_box(held));
        // 64 MiB is past glibc's mmap threshold: freeing it hands the pages back at once, so a
        // reading taken now alone would not see it.
        let usage = meter.finish().unwrap();
        assert!(
            usage[0].rss_kib >= before + 60 * 1024,
            "peak {} KiB, before {before} KiB",
            usage[0].rss_kib
        );
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
