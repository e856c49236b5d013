use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{Lifecycle, RuntimeError};

/// SIGINT and SIGTERM, caught from the moment of installation so a stop that arrives during
/// start-up is not lost (nor kills the process without a drain); with
/// [`StopSignals::install_with_reload`] also SIGHUP, the reload request (`systemctl reload`).
#[derive(Debug)]
pub struct StopSignals {
    signals: Signals,
}

impl StopSignals {
    pub fn install() -> Result<Self, RuntimeError> {
        Signals::new([SIGINT, SIGTERM])
            .map(|signals| Self { signals })
            .map_err(RuntimeError::Signals)
    }

    /// [`Self::install`] plus SIGHUP, which [`Self::wait_with_reload`] turns into reloads. A
    /// SIGHUP that arrives during start-up waits and is handled once the process serves.
    pub fn install_with_reload() -> Result<Self, RuntimeError> {
        Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map(|signals| Self { signals })
            .map_err(RuntimeError::Signals)
    }

    /// Blocks until the first stop signal, or until a worker thread died (`lifecycle.failed`,
    /// see [`Lifecycle::fail`]); returns its name ("worker failure" for the latter). A second
    /// signal later fires `lifecycle.abort`, cutting the drain short (as a second Ctrl-C does in
    /// most daemons).
    pub fn wait(self, lifecycle: Arc<Lifecycle>) -> &'static str {
        self.wait_with_reload(lifecycle, || {})
    }

    /// [`Self::wait`], calling `reload` on this thread for every SIGHUP before the stop signal
    /// (one at a time: SIGHUPs that arrive during a reload are merged by the kernel into one
    /// more). After the stop signal a SIGHUP is ignored.
    pub fn wait_with_reload(
        mut self,
        lifecycle: Arc<Lifecycle>,
        mut reload: impl FnMut(),
    ) -> &'static str {
        let handle = self.signals.handle();
        let failed = lifecycle.failed.clone();
        let watcher = std::thread::Builder::new()
            .name("sluice-failure".to_string())
            .spawn(move || {
                failed.wait_blocking();
                handle.close();
            });
        if let Err(error) = watcher {
            tracing::warn!(%error, "cannot watch for worker failures");
        }
        let first = loop {
            match self.signals.forever().next() {
                Some(SIGHUP) => reload(),
                other => break other,
            }
        };
        if first.is_none() && lifecycle.has_failed() {
            return "worker failure";
        }
        let first = first.unwrap_or(SIGTERM);
        let spawned = std::thread::Builder::new()
            .name("sluice-signals".to_string())
            .spawn(move || {
                for signal in self.signals.forever() {
                    if signal == SIGHUP {
                        tracing::warn!("SIGHUP while stopping: no reload");
                        continue;
                    }
                    tracing::warn!("second stop signal: cutting the drain short");
                    lifecycle.abort.fire();
                    break;
                }
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot watch for a second stop signal");
        }
        name(first)
    }
}

fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
