//! Shared by this crate's integration tests.

use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

// Used by some of the test binaries that include this module.
#[allow(dead_code)]
pub mod echo;

/// Runs `future` to completion on a fresh monoio runtime with timers: the legacy (epoll)
/// driver when `legacy`, io_uring otherwise.
pub fn block_on<F: std::future::Future>(legacy: bool, future: F) -> F::Output {
    if legacy {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("legacy runtime")
            .block_on(future)
    } else {
        RuntimeBuilder::<IoUringDriver>::new()
            .enable_timer()
            .build()
            .expect("io_uring runtime")
            .block_on(future)
    }
}
