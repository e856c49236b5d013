use std::fmt;
use std::io;

use monoio::time::TimeDriver;
use monoio::{FusionRuntime, IoUringDriver, LegacyDriver, RuntimeBuilder};
use sluice_config::DriverChoice;

use crate::RuntimeError;

/// The I/O driver the workers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    IoUring,
    /// epoll through mio (monoio's "legacy" driver).
    Legacy,
}

impl Driver {
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Legacy => "legacy",
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of driver selection, decided once for all workers so they behave alike and the
/// metrics can name the driver before any worker starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSelection {
    pub driver: Driver,
    /// Set when `auto` wanted io_uring and fell back to epoll: the error io_uring setup gave.
    pub fallback_reason: Option<String>,
}

/// Resolves the configured choice on this machine. `auto` probes io_uring by building a real ring
/// of the configured size (the same call the workers make), so a kernel without io_uring, a
/// seccomp filter that blocks it, or a ring too large for the memory limits all fall back.
pub fn select_driver(
    choice: DriverChoice,
    uring_entries: u32,
) -> Result<DriverSelection, RuntimeError> {
    match choice {
        DriverChoice::Legacy => Ok(DriverSelection {
            driver: Driver::Legacy,
            fallback_reason: None,
        }),
        DriverChoice::Uring => {
            probe_uring(uring_entries).map_err(RuntimeError::UringRequired)?;
            Ok(DriverSelection {
                driver: Driver::IoUring,
                fallback_reason: None,
            })
        }
        DriverChoice::Auto => Ok(match probe_uring(uring_entries) {
            Ok(()) => DriverSelection {
                driver: Driver::IoUring,
                fallback_reason: None,
            },
            Err(error) => DriverSelection {
                driver: Driver::Legacy,
                fallback_reason: Some(error.to_string()),
            },
        }),
    }
}

fn probe_uring(entries: u32) -> io::Result<()> {
    with_cooperative_fallback(|cooperative| {
        RuntimeBuilder::<IoUringDriver>::new()
            .with_entries(entries)
            .uring_builder(ring_setup(cooperative))
            .build()
    })
    .map(drop)
}

/// The ring's setup flags. Cooperative task running (`IORING_SETUP_COOP_TASKRUN`, Linux 5.19)
/// lets the kernel finish a completion (a socket read that became ready) when the worker next
/// enters it, instead of interrupting the worker with an IPI to do it at once. monoio only
/// looks at completions when it enters the kernel anyway (park or submit), so the interrupt
/// bought nothing, and with the peers on another CPU it cost about a fifth of a gateway
/// worker's CPU (`irqentry_exit_to_user_mode` after reschedule IPIs; docs/PERFORMANCE.md).
fn ring_setup(cooperative: bool) -> io_uring::Builder {
    let mut builder = io_uring::IoUring::builder();
    if cooperative {
        builder.setup_coop_taskrun();
    }
    builder
}

/// Builds with cooperative task running, and without it where the kernel rejects the flag as
/// unknown (`EINVAL`, before 5.19). Any other error is the ring's own and is returned.
fn with_cooperative_fallback<T>(mut build: impl FnMut(bool) -> io::Result<T>) -> io::Result<T> {
    match build(true) {
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => build(false),
        built => built,
    }
}

pub(crate) type WorkerRuntime = FusionRuntime<TimeDriver<IoUringDriver>, TimeDriver<LegacyDriver>>;

/// Builds the runtime of one worker thread with the selected driver.
pub(crate) fn build_runtime(
    driver: Driver,
    uring_entries: u32,
) -> Result<WorkerRuntime, RuntimeError> {
    let built = match driver {
        Driver::IoUring => with_cooperative_fallback(|cooperative| {
            RuntimeBuilder::<IoUringDriver>::new()
                .with_entries(uring_entries)
                .uring_builder(ring_setup(cooperative))
                .enable_timer()
                .build()
        })
        .map(FusionRuntime::Uring),
        Driver::Legacy => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .map(FusionRuntime::Legacy),
    };
    built.map_err(|source| RuntimeError::Build { driver, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_is_taken_as_asked() {
        let selection = select_driver(DriverChoice::Legacy, 1024).expect("legacy always works");
        assert_eq!(selection.driver, Driver::Legacy);
        assert_eq!(selection.fallback_reason, None);
    }

    #[test]
    fn both_drivers_build_and_run_a_future() {
        for driver in [Driver::IoUring, Driver::Legacy] {
            let mut runtime = build_runtime(driver, 256).expect("runtime builds on this kernel");
            let value = runtime.block_on(async {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                7
            });
            assert_eq!(value, 7, "{driver}");
        }
    }

    #[test]
    fn a_kernel_without_cooperative_task_running_gets_a_plain_ring() {
        let mut tried = Vec::new();
        let built = with_cooperative_fallback(|cooperative| {
            tried.push(cooperative);
            if cooperative {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                Ok("plain")
            }
        });
        assert_eq!(built.expect("falls back"), "plain");
        assert_eq!(tried, [true, false]);
    }

    #[test]
    fn other_ring_errors_are_not_retried() {
        let mut tries = 0;
        let built: io::Result<()> = with_cooperative_fallback(|_| {
            tries += 1;
            Err(io::Error::from_raw_os_error(libc::ENOMEM))
        });
        assert_eq!(built.expect_err("fails").raw_os_error(), Some(libc::ENOMEM));
        assert_eq!(tries, 1);
    }

    #[test]
    fn this_kernel_accepts_cooperative_task_running() {
        ring_setup(true)
            .build(8)
            .expect("Linux 5.19 or later takes IORING_SETUP_COOP_TASKRUN");
    }

    #[test]
    fn names_are_stable_metric_labels() {
        assert_eq!(Driver::IoUring.to_string(), "io_uring");
        assert_eq!(Driver::Legacy.to_string(), "legacy");
    }
}
