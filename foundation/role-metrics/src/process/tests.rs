use prometheus_client::registry::Registry;
use proptest::prelude::*;

use super::*;

/// A real `/proc/self/stat` line of a process whose name holds spaces and a `)`.
const STAT: &str = "4242 (sluice (w) 1) S 1 4242 4242 0 -1 4194560 2913 0 0 0 \
    1234 567 0 0 20 0 9 0 1540849 3133440 394 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 \
    17 1 0 0 0 0 0\n";

const STATUS: &str = "Name:\tsluice\nUmask:\t0022\nState:\tS (sleeping)\n\
    VmPeak:\t  912340 kB\nVmSize:\t  901120 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";

const LIMITS: &str =
    "Limit                     Soft Limit           Hard Limit           Units     \n\
    Max cpu time              unlimited            unlimited            seconds   \n\
    Max open files            65536                524288               files     \n";

#[test]
fn stat_fields_are_counted_after_the_last_parenthesis() {
    assert_eq!(
        parse_stat(STAT),
        Ok(Stat {
            utime: 1234,
            stime: 567,
            starttime: 1540849,
        })
    );
}

#[test]
fn status_gives_bytes_and_threads() {
    assert_eq!(
        parse_status(STATUS),
        Ok(Status {
            resident_bytes: 20480 * 1024,
            virtual_bytes: 901120 * 1024,
            threads: 9,
        })
    );
}

#[test]
fn limits_give_the_soft_open_files_limit_or_unlimited() {
    assert_eq!(parse_max_open_files(LIMITS), Ok(Some(65536)));
    let unlimited = LIMITS.replace("65536 ", "unlimited");
    assert_eq!(parse_max_open_files(&unlimited), Ok(None));
}

#[test]
fn boot_time_is_read_from_btime() {
    let text = "cpu  1 2 3 4\nintr 5\nbtime 1795900228\nprocesses 9\n";
    assert_eq!(parse_boot_time(text), Ok(1795900228));
}

#[test]
fn missing_and_malformed_fields_are_named() {
    let truncated = &STAT[..STAT.find(" 1234").unwrap()];
    assert_eq!(
        parse_stat(truncated),
        Err(ProcError::Missing {
            file: ProcFile::Stat,
            field: "utime"
        })
    );
    assert_eq!(
        parse_status(&STATUS.replace("VmRSS:\t   20480", "VmRSS:\t   lots")),
        Err(ProcError::Invalid {
            file: ProcFile::Status,
            field: "VmRSS"
        })
    );
    assert_eq!(
        parse_status(&STATUS.replace("Threads", "Thread")),
        Err(ProcError::Missing {
            file: ProcFile::Status,
            field: "Threads"
        })
    );
    let error = parse_max_open_files("Max cpu time unlimited\n").unwrap_err();
    assert_eq!(error.file(), ProcFile::Limits);
    assert!(error.to_string().contains("/proc/self/limits"), "{error}");
}

#[test]
fn this_process_is_sampled_with_plausible_values() {
    let sample = sample();
    let status = sample.status.expect("status");
    assert!(status.resident_bytes > 0 && status.virtual_bytes >= status.resident_bytes);
    assert!(status.threads >= 1);
    assert!(sample.open_fds.expect("fds") >= 3);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = sample.start_time_seconds.expect("start time");
    // Started before now and less than a day ago (a test process).
    assert!(
        start <= now + 1.0 && start > now - 86_400.0,
        "{start} vs {now}"
    );
    assert!(sample.cpu_seconds.expect("cpu") >= 0.0);
}

#[test]
fn the_collector_exports_the_client_golang_names() {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "process_threads ",
        "sluice_process_read_errors_total{file=\"stat\"} ",
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(name)),
            "{name} missing from:\n{text}"
        );
    }
}

proptest! {
    /// Whatever procfs (or a corrupted fixture) holds, the parsers answer with a value or a
    /// typed error naming their file, never a panic.
    #[test]
    fn garbage_gives_a_typed_error_never_a_panic(text in "\\PC{0,400}") {
        for (result, file) in [
            (parse_stat(&text).map(|_| ()), ProcFile::Stat),
            (parse_status(&text).map(|_| ()), ProcFile::Status),
            (parse_max_open_files(&text).map(|_| ()), ProcFile::Limits),
            (parse_boot_time(&text).map(|_| ()), ProcFile::SystemStat),
        ] {
            if let Err(error) = result {
                prop_assert_eq!(error.file(), file);
            }
        }
    }

    /// Garbage spliced into real files: still no panic.
    #[test]
    fn corrupted_fixtures_never_panic(cut in 0usize..400, junk in "[ ()a-z0-9:\\n\\t-]{0,40}") {
        for fixture in [STAT, STATUS, LIMITS] {
            let cut = cut.min(fixture.len());
            let Some(head) = fixture.get(..cut) else { continue };
            let text = format!("{head}{junk}{}", &fixture[cut..]);
            let _ = parse_stat(&text);
            let _ = parse_status(&text);
            let _ = parse_max_open_files(&text);
        }
    }
}
