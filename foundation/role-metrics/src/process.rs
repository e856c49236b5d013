//! `process_*` metrics with the names and meanings of Prometheus' client_golang process
//! collector, so the dashboards and alerts an operator already has for Go and Java services
//! work on every Sluice role unchanged.
//!
//! Hand-written because prometheus-client 0.25 has no process collector and the
//! `metrics-process` crate feeds the `metrics` facade, not a prometheus-client registry. Linux
//! only, read from procfs at scrape time (the admin thread, never the data path). The parsers are
//! pure functions over the files' text so they are tested on fixtures and on garbage.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[cfg(test)]
mod tests;

/// procfs reports CPU times in USER_HZ ticks, which the kernel fixes at 100 for user space on
/// every architecture Sluice builds for (client_golang's procfs hard-codes the same value).
const USER_HZ: f64 = 100.0;

/// A procfs file that could not be read or parsed. Never fatal: the families it feeds are left
/// out of that scrape and `sluice_process_read_errors_total{file}` counts it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: ProcFile, reason: String },
    #[error("{file}: field {field} is missing")]
    Missing { file: ProcFile, field: &'static str },
    #[error("{file}: field {field} is not a number")]
    Invalid { file: ProcFile, field: &'static str },
}

impl ProcError {
    pub fn file(&self) -> ProcFile {
        match self {
            Self::Read { file, .. } | Self::Missing { file, .. } | Self::Invalid { file, .. } => {
                *file
            }
        }
    }
}

/// The procfs files the collector reads; a fixed set, so it is also the error metric's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcFile {
    Stat,
    Status,
    Limits,
    Fd,
    SystemStat,
}

impl ProcFile {
    const ALL: [Self; 5] = [
        Self::Stat,
        Self::Status,
        Self::Limits,
        Self::Fd,
        Self::SystemStat,
    ];

    fn path(self) -> &'static str {
        match self {
            Self::Stat => "/proc/self/stat",
            Self::Status => "/proc/self/status",
            Self::Limits => "/proc/self/limits",
            Self::Fd => "/proc/self/fd",
            Self::SystemStat => "/proc/stat",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Stat => "stat",
            Self::Status => "status",
            Self::Limits => "limits",
            Self::Fd => "fd",
            Self::SystemStat => "system_stat",
        }
    }
}

impl std::fmt::Display for ProcFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// What `/proc/self/stat` gives: CPU times and the start time, in USER_HZ ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub utime: u64,
    pub stime: u64,
    pub starttime: u64,
}

/// Parses `/proc/self/stat`. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat, ProcError> {
    let file = ProcFile::Stat;
    let rest = text
        .rfind(')')
        .map(|end| &text[end + 1..])
        .ok_or(ProcError::Missing {
            file,
            field: "comm",
        })?;
    // After the command: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |index: usize, name: &'static str| -> Result<u64, ProcError> {
        let raw = fields
            .get(index - 3)
            .ok_or(ProcError::Missing { file, field: name })?;
        raw.parse()
            .map_err(|_| ProcError::Invalid { file, field: name })
    };
    Ok(Stat {
        utime: field(14, "utime")?,
        stime: field(15, "stime")?,
        starttime: field(22, "starttime")?,
    })
}

/// What `/proc/self/status` gives: memory in bytes and the thread count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
}

/// Parses `/proc/self/status` (`VmRSS`, `VmSize` in kB, `Threads`).
pub fn parse_status(text: &str) -> Result<Status, ProcError> {
    let file = ProcFile::Status;
    let value = |name: &'static str| -> Result<u64, ProcError> {
        let line = text
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .ok_or(ProcError::Missing { file, field: name })?;
        let mut words = line.split_ascii_whitespace();
        let number: u64 = words
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or(ProcError::Invalid { file, field: name })?;
        match words.next() {
            None => Ok(number),
            Some("kB") => number
                .checked_mul(1024)
                .ok_or(ProcError::Invalid { file, field: name }),
            Some(_) => Err(ProcError::Invalid { file, field: name }),
        }
    };
    Ok(Status {
        resident_bytes: value("VmRSS")?,
        virtual_bytes: value("VmSize")?,
        threads: value("Threads")?,
    })
}

/// Parses the soft `Max open files` limit from `/proc/self/limits`; `None` when unlimited.
pub fn parse_max_open_files(text: &str) -> Result<Option<u64>, ProcError> {
    let file = ProcFile::Limits;
    let field = "Max open files";
    let soft = text
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_ascii_whitespace().next())
        .ok_or(ProcError::Missing { file, field })?;
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse()
        .map(Some)
        .map_err(|_| ProcError::Invalid { file, field })
}

/// Parses the boot time (`btime`, Unix seconds) from `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Result<u64, ProcError> {
    let file = ProcFile::SystemStat;
    let field = "btime";
    let raw = text
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .ok_or(ProcError::Missing { file, field })?;
    raw.trim()
        .parse()
        .map_err(|_| ProcError::Invalid { file, field })
}

/// One scrape's worth of values; `None` where the source could not be read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub status: Option<Status>,
    pub open_fds: Option<u64>,
    /// `Some(None)`: read, and unlimited.
    pub max_fds: Option<Option<u64>>,
}

static READ_ERRORS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

fn note<T>(result: Result<T, ProcError>) -> Option<T> {
    result
        .map_err(|error| {
            let index = ProcFile::ALL
                .iter()
                .position(|file| *file == error.file())
                .unwrap_or(0);
            READ_ERRORS[index].fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "process metrics: source skipped");
        })
        .ok()
}

fn read(file: ProcFile) -> Result<String, ProcError> {
    std::fs::read_to_string(file.path()).map_err(|error| ProcError::Read {
        file,
        reason: error.to_string(),
    })
}

fn count_fds() -> Result<u64, ProcError> {
    let file = ProcFile::Fd;
    let entries = std::fs::read_dir(file.path()).map_err(|error| ProcError::Read {
        file,
        reason: error.to_string(),
    })?;
    // The directory handle read_dir holds is itself an entry; client_golang counts it too.
    Ok(entries.count() as u64)
}

/// Reads this process's procfs files now.
pub fn sample() -> Sample {
    let stat = note(read(ProcFile::Stat).and_then(|text| parse_stat(&text)));
    let boot = note(read(ProcFile::SystemStat).and_then(|text| parse_boot_time(&text)));
    Sample {
        cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
        start_time_seconds: stat
            .zip(boot)
            .map(|(s, boot)| boot as f64 + s.starttime as f64 / USER_HZ),
        status: note(read(ProcFile::Status).and_then(|text| parse_status(&text))),
        open_fds: note(count_fds()),
        max_fds: note(read(ProcFile::Limits).and_then(|text| parse_max_open_files(&text))),
    }
}

/// Registered by every role: `registry.register_collector(Box::new(ProcessCollector))`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<f64>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else { return Ok(()) };
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = sample();
        if let Some(seconds) = sample.cpu_seconds {
            let metric = ConstCounter::new(seconds);
            let help = "Total user and system CPU time spent in seconds";
            // The text encoder appends `_total` to counters.
            metric.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                help,
                None,
                metric.metric_type(),
            )?)?;
        }
        let status = sample.status;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                status.map(|s| s.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                status.map(|s| s.virtual_bytes as f64),
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                status.map(|s| s.threads as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                sample.open_fds.map(|n| n as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit; +Inf when unlimited)",
                sample
                    .max_fds
                    .map(|limit| limit.map_or(f64::INFINITY, |n| n as f64)),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                sample.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            gauge(&mut encoder, name, help, value)?;
        }
        let mut errors = encoder.encode_descriptor(
            "sluice_process_read_errors",
            "procfs files the process_* metrics could not read or parse, by file",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (file, count) in ProcFile::ALL.iter().zip(&READ_ERRORS) {
            let labels = [("file", file.label())];
            ConstCounter::new(count.load(Ordering::Relaxed))
                .encode(errors.encode_family(&labels.as_slice())?)?;
        }
        Ok(())
    }
}
