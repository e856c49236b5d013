//! Sampling the process's resources off the hot path, on a thread of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_config::{MemoryLimit, OverloadConfig};

use crate::machine::{Machine, Transition};

/// Last sample's figures, for `/metrics` (0 = unknown or no limit).
pub(crate) static LAST: [AtomicU64; 4] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];
pub(crate) const RSS: usize = 0;
pub(crate) const MEMORY_LIMIT: usize = 1;
pub(crate) const FDS: usize = 2;
pub(crate) const FD_LIMIT: usize = 3;

static STARTED: AtomicBool = AtomicBool::new(false);

/// One reading of the process's resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub rss_bytes: u64,
    /// `None`: memory is not watched.
    pub memory_limit: Option<u64>,
    pub open_fds: u64,
    /// `None`: `RLIMIT_NOFILE` is unlimited.
    pub fd_limit: Option<u64>,
}

impl Sample {
    /// The highest used/limit ratio of the watched resources (0 when none is limited).
    pub fn pressure(&self) -> f64 {
        let ratio = |used: u64, limit: Option<u64>| match limit {
            Some(limit) if limit > 0 => used as f64 / limit as f64,
            _ => 0.0,
        };
        ratio(self.rss_bytes, self.memory_limit).max(ratio(self.open_fds, self.fd_limit))
    }
}

/// The memory limit the monitor compares resident memory with.
pub fn resolve_memory_limit(config: MemoryLimit) -> Option<u64> {
    match config {
        MemoryLimit::Off => None,
        MemoryLimit::Bytes(bytes) => Some(bytes),
        MemoryLimit::Auto => cgroup_memory_limit(),
    }
}

/// The cgroup v2 `memory.max` of this process's cgroup, if one is set (the kernel's OOM killer
/// acts on it, so it is the limit that matters in a container).
pub fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/memory.max")).ok()?;
    max.trim().parse().ok()
}

/// Reads the process's resident memory and open descriptors now.
pub fn sample(memory_limit: Option<u64>) -> Sample {
    let fd_limit = fd_limit();
    Sample {
        rss_bytes: rss_bytes().unwrap_or(0),
        memory_limit,
        open_fds: open_fds_or_full(open_fds(), fd_limit),
        fd_limit,
    }
}

/// Since Linux 6.2 a stat of `/proc/self/fd` gives the number of open descriptors as its size
/// (a popcount of the descriptor bitmap, no descriptor taken): listing the directory instead
/// cost a node with 15,000 connections ~30 % of its idle CPU at 4 samples a second. Older
/// kernels report 0 there, so the listing stays as the fallback.
fn open_fds() -> std::io::Result<u64> {
    let size = std::fs::metadata("/proc/self/fd").map(|meta| meta.len());
    count_or_list(size, || {
        std::fs::read_dir("/proc/self/fd").map(|dir| dir.count() as u64)
    })
}

/// A process always has a descriptor open while it runs this, so a size of 0 (or an error)
/// means the kernel does not count: then the listing decides.
fn count_or_list(
    size: std::io::Result<u64>,
    list: impl FnOnce() -> std::io::Result<u64>,
) -> std::io::Result<u64> {
    match size {
        Ok(count) if count > 0 => Ok(count),
        _ => list(),
    }
}

/// Listing `/proc/self/fd` takes a descriptor itself, so at the limit it fails with EMFILE:
/// that is read as "at the limit", never as "no descriptors open" (which would turn the
/// actions off exactly when they matter).
fn open_fds_or_full(listed: std::io::Result<u64>, limit: Option<u64>) -> u64 {
    listed.unwrap_or_else(|_| limit.unwrap_or(0))
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

fn fd_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Starts the monitor thread (once per process; later calls do nothing). It runs for the life
/// of the process.
pub fn spawn_monitor(config: &OverloadConfig) -> std::io::Result<()> {
    if STARTED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let memory_limit = resolve_memory_limit(config.max_memory);
    let first = sample(memory_limit);
    tracing::info!(
        memory_limit = ?memory_limit,
        fd_limit = ?first.fd_limit,
        stop_accepting_percent = config.stop_accepting_percent,
        shed_new_requests_percent = config.shed_new_requests_percent,
        "overload monitor started"
    );
    let mut machine = Machine::new(config);
    // The first verdict is published before this returns, so a process that starts over a
    // limit never accepts a connection on the way to its first sample.
    step(&mut machine, first);
    let interval = config.interval;
    let spawned = std::thread::Builder::new()
        .name("sluice-overload".to_string())
        .spawn(move || loop {
            std::thread::sleep(interval);
            step(&mut machine, sample(memory_limit));
        });
    if let Err(error) = spawned {
        STARTED.store(false, Ordering::SeqCst);
        return Err(error);
    }
    Ok(())
}

fn step(machine: &mut Machine, now: Sample) {
    record(&now);
    for transition in machine.observe(now.pressure()).into_iter().flatten() {
        announce(transition, &now);
    }
}

fn record(sample: &Sample) {
    let figures = [
        sample.rss_bytes,
        sample.memory_limit.unwrap_or(0),
        sample.open_fds,
        sample.fd_limit.unwrap_or(0),
    ];
    for (slot, value) in LAST.iter().zip(figures) {
        slot.store(value, Ordering::Relaxed);
    }
}

fn announce(transition: Transition, sample: &Sample) {
    crate::publish(transition);
    let to = if transition.active {
        "active"
    } else {
        "inactive"
    };
    tracing::warn!(
        action = transition.action.label(),
        to,
        pressure = format_args!("{:.3}", sample.pressure()),
        rss_bytes = sample.rss_bytes,
        memory_limit = ?sample.memory_limit,
        open_fds = sample.open_fds,
        fd_limit = ?sample.fd_limit,
        "overload action {}",
        if transition.active { "on" } else { "off" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_is_the_highest_ratio_of_the_limited_resources() {
        let sample = Sample {
            rss_bytes: 50,
            memory_limit: Some(100),
            open_fds: 90,
            fd_limit: Some(100),
        };
        assert!((sample.pressure() - 0.9).abs() < 1e-9);
        let unlimited = Sample {
            memory_limit: None,
            fd_limit: None,
            ..sample
        };
        assert_eq!(unlimited.pressure(), 0.0);
        let memory = Sample {
            rss_bytes: 120,
            fd_limit: None,
            ..sample
        };
        assert!((memory.pressure() - 1.2).abs() < 1e-9);
    }

    #[test]
    fn an_unreadable_descriptor_list_counts_as_full() {
        let emfile = || Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(open_fds_or_full(emfile(), Some(256)), 256);
        assert_eq!(open_fds_or_full(Ok(40), Some(256)), 40);
        assert_eq!(open_fds_or_full(emfile(), None), 0);
    }

    #[test]
    fn a_counted_size_is_used_and_an_uncounted_one_falls_back_to_the_listing() {
        let listed = || Ok(7);
        assert_eq!(count_or_list(Ok(5), || panic!("not listed")).ok(), Some(5));
        assert_eq!(count_or_list(Ok(0), listed).ok(), Some(7));
        let enoent = Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(count_or_list(enoent, listed).ok(), Some(7));
        let emfile = || Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(count_or_list(Ok(0), emfile).is_err());
    }

    #[test]
    fn the_count_follows_descriptors_opened() {
        let before = open_fds().unwrap();
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let during = open_fds().unwrap();
        drop(files);
        // Other test threads may open or close a few descriptors meanwhile.
        assert!(
            during.abs_diff(before + 64) <= 8,
            "{before} before, {during} with 64 more"
        );
    }

    #[test]
    fn a_sample_of_this_process_sees_its_memory_and_descriptors() {
        let now = sample(Some(u64::MAX));
        assert!(now.rss_bytes > 0);
        assert!(now.open_fds >= 3, "stdin, stdout, stderr at least");
        assert!(now.pressure() < 1.0);
    }
}
