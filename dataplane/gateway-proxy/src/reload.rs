//! Hot reload: a thread watches the cluster directory (file names, sizes and modification
//! times, polled: no inotify dependency, and it also sees files replaced by rename) and loads it
//! again when anything changed. A valid directory becomes the new generation on every core at
//! once; an invalid one is logged with every error, counted, and the last good one stays.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::state::Gateway;

/// Stops the reloader thread when dropped.
#[derive(Debug)]
pub struct ReloaderHandle {
    /// Dropping it wakes the thread at once (its wait ends with "disconnected").
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ReloaderHandle {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let metadata = entry.metadata().ok()?;
                    Some((entry.path(), metadata.len(), metadata.modified().ok()))
                })
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    entries
}

/// Starts watching `gateway.dir` every `interval`.
pub fn spawn_reloader(
    gateway: Arc<Gateway>,
    interval: Duration,
) -> std::io::Result<ReloaderHandle> {
    let (stop, stopped) = channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sluice-gateway-reload".to_string())
        .spawn(move || {
            let mut seen = fingerprint(&gateway.dir);
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                let now = fingerprint(&gateway.dir);
                if now == seen {
                    continue;
                }
                seen = now;
                match gateway.reload() {
                    Ok(generation) => {
                        gateway.metrics.reloads_ok.inc();
                        tracing::info!(dir = %gateway.dir.display(), generation, "gateway clusters reloaded");
                    }
                    Err(error) => {
                        gateway.metrics.reloads_failed.inc();
                        tracing::error!(dir = %gateway.dir.display(), %error, "gateway reload rejected; the last good config stays");
                    }
                }
            }
        })?;
    Ok(ReloaderHandle {
        stop: Some(stop),
        thread: Some(thread),
    })
}
