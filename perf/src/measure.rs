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

/// (utime, stime) in clock ticks from the text of `/proc/PID/stat` (all threads of the process).
/// Kept apart because a proxy's system time is mostly its socket calls, and the two shrink by
/// different means (fewer syscalls and copies against less work per request).
pub fn parse_stat_user_system_ticks(stat: &str) -> Result<(u64, u64), ProcError> {
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
    Ok((field(14)?, field(15)?))
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
    Ok(cpu_time(pid)?.total_us())
}

/// User and system CPU time of a process, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user_us: u64,
    pub system_us: u64,
}

impl CpuTime {
    pub fn total_us(self) -> u64 {
        self.user_us + self.system_us
    }

    /// What was spent between `before` and `self` (never below zero).
    pub fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            user_us: self.user_us.saturating_sub(before.user_us),
            system_us: self.system_us.saturating_sub(before.system_us),
        }
    }
}

/// User and system CPU used so far by process `pid`.
pub fn cpu_time(pid: u32) -> anyhow::Result<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (user, system) = parse_stat_user_system_ticks(&stat)?;
    let micros = |ticks: u64| ticks * 1_000_000 / clock_ticks_per_second();
    Ok(CpuTime {
        user_us: micros(user),
        system_us: micros(system),
    })
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
    /// User plus system time: `user_us + system_us`.
    pub cpu_us: u64,
    pub user_us: u64,
    pub system_us: u64,
    pub rss_kib: u64,
}

impl ProcessUsage {
    /// One process's usage from its CPU time over the interval and its peak RSS.
    pub fn new(name: &str, pid: u32, cpu: CpuTime, rss_kib: u64) -> Self {
        Self {
            name: name.to_string(),
            pid,
            cpu_us: cpu.total_us(),
            user_us: cpu.user_us,
            system_us: cpu.system_us,
            rss_kib,
        }
    }
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
    processes: Vec<(String, u32, CpuTime)>,
    rss: RssPeaks,
}

impl CpuMeter {
    pub fn start(processes: &[(String, u32)]) -> anyhow::Result<Self> {
        let processes: Vec<(String, u32, CpuTime)> = processes
            .iter()
            .map(|(name, pid)| Ok((name.clone(), *pid, cpu_time(*pid)?)))
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
                let peak = peaks.get(index).copied().unwrap_or(0).max(now);
                Ok(ProcessUsage::new(
                    &name,
                    pid,
                    cpu_time(pid)?.since(before),
                    peak,
                ))
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
    fn stat_cpu_is_user_and_system_time() {
        assert_eq!(parse_stat_user_system_ticks(STAT), Ok((731, 129)));
        assert_eq!(
            parse_stat_user_system_ticks("1 (x) S 1 2 3 4 5 6 7 8 9 10 11"),
            Err(ProcError::BadField(15))
        );
        assert_eq!(
            parse_stat_user_system_ticks("4242 sluice"),
            Err(ProcError::NoCommandEnd)
        );
        assert_eq!(
            parse_stat_user_system_ticks("1 (x) S 1 2"),
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
    fn the_meter_splits_user_and_system_time() {
        let pid = std::process::id();
        let meter = CpuMeter::start(&[("self".to_string(), pid)]).unwrap();
        // Kernel work (small writes to /dev/null), then user work (a loop), each until /proc
        // shows a tick of it, so both halves are non-zero however busy the machine is.
        let before = cpu_time(pid).unwrap();
        let mut null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cpu_time(pid).unwrap().system_us == before.system_us {
            for _ in 0..1000 {
                std::io::Write::write_all(&mut null, b"x").unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "no system time seen");
        }
        let mut sum = 0u64;
        while cpu_time(pid).unwrap().user_us == before.user_us {
            for _ in 0..100_000 {
                sum = std::hint::black_box(sum.wrapping_add(1));
            }
            assert!(std::time::Instant::now() < deadline, "no user time seen");
        }
        let usage = &meter.finish().unwrap()[0];
        assert_eq!(usage.cpu_us, usage.user_us + usage.system_us);
        assert!(usage.user_us > 0 && usage.system_us > 0, "{usage:?}");
    }

    #[test]
    fn cpu_time_since_an_earlier_reading() {
        let before = CpuTime {
            user_us: 10,
            system_us: 40,
        };
        let now = CpuTime {
            user_us: 25,
            system_us: 30,
        };
        assert_eq!(
            now.since(before),
            CpuTime {
                user_us: 15,
                system_us: 0
            }
        );
        assert_eq!(now.total_us(), 55);
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
            let _ = parse_stat_user_system_ticks(&text);
            let _ = parse_status_rss_kib(&text);
        }
    }
}
