use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{Lifecycle, RuntimeError};

/// SIGINT and SIGTERM, caught from the moment of installation so a stop that arrives during
/// start-up is not lost (nor kills the process without a drain).
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

    /// Blocks until the first stop signal, or until a worker thread died (`lifecycle.failed`,
    /// see [`Lifecycle::fail`]); returns its name ("worker failure" for the latter). A second
    /// signal later fires `lifecycle.abort`, cutting the drain short (as a second Ctrl-C does in
    /// most daemons).
    pub fn wait(mut self, lifecycle: Arc<Lifecycle>) -> &'static str {
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
        let first = self.signals.forever().next();
        if first.is_none() && lifecycle.has_failed() {
            return "worker failure";
        }
        let first = first.unwrap_or(SIGTERM);
        let spawned = std::thread::Builder::new()
            .name("sluice-signals".to_string())
            .spawn(move || {
                if self.signals.forever().next().is_some() {
                    tracing::warn!("second stop signal: cutting the drain short");
                    lifecycle.abort.fire();
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
        _ => "signal",
    }
}
