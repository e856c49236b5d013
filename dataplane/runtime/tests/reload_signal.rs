//! SIGHUP as a reload request: every SIGHUP before the stop signal runs the reload callback on
//! the waiting thread, and the stop signal still ends the wait. One test in this file because
//! it signals its own process.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_runtime::{Lifecycle, StopSignals};
use test_support::wait_until;

fn raise(signal: i32) {
    // SAFETY: kill(2) on our own pid; the handler installed by the test turns it into a message.
    assert_eq!(unsafe { libc::kill(libc::getpid(), signal) }, 0);
}

#[test]
fn sighup_reloads_until_the_stop_signal() {
    let signals = StopSignals::install_with_reload().expect("install signal handlers");
    let reloads = Arc::new(AtomicUsize::new(0));
    let sender = {
        let reloads = reloads.clone();
        std::thread::spawn(move || {
            // One at a time: the kernel merges SIGHUPs that arrive before the first is taken.
            for expected in 1..=2 {
                raise(libc::SIGHUP);
                assert!(
                    wait_until(Duration::from_secs(10), || reloads.load(Ordering::SeqCst)
                        == expected),
                    "reload {expected} did not run"
                );
            }
            raise(libc::SIGTERM);
        })
    };
    let counted = reloads.clone();
    let stopped_by = signals.wait_with_reload(Arc::new(Lifecycle::new()), move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    sender.join().expect("the signalling thread");
    assert_eq!(stopped_by, "SIGTERM");
    assert_eq!(reloads.load(Ordering::SeqCst), 2);
}
