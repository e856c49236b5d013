//! `sluice vm-agent --policies FILE|DIR`: the control-plane-less mode. The policies of a file
//! (or a directory of them) are enforced on the bridge's existing ports and hot reloaded; no
//! lifecycle, no uplink takeover.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use super::enforcer::Enforcer;
use super::{Datapath, Notify, VmAgentError};

/// How often the policy file's modification time is checked.
const RELOAD_POLL: Duration = Duration::from_millis(200);

pub async fn run(
    datapath: Datapath,
    path: PathBuf,
    ready: &AtomicBool,
    notify: Notify,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), VmAgentError> {
    let mut file_stamp = stamp(&path);
    let initial = sluice_policy::load::load_path(&path).map_err(VmAgentError::Policies)?;
    let mut enforcer = Enforcer::start(&datapath, initial).await?;
    ready.store(true, Ordering::Release);
    (notify.ready)();
    let mut reload_tick = tokio::time::interval(RELOAD_POLL);
    let mut stats_tick = tokio::time::interval(datapath.stats_interval);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            attention = enforcer.attention() => attention?,
            _ = reload_tick.tick() => {
                let now = stamp(&path);
                if now != file_stamp {
                    file_stamp = now;
                    reload(&mut enforcer, &path, &datapath).await;
                }
            }
            _ = stats_tick.tick() => {
                enforcer.poll_stats().await;
                enforcer.refresh_ports().await;
            }
        }
        enforcer.maintain().await;
    }
    (notify.stopping)();
    tracing::info!("stopping; the flows stay on the bridge");
    Ok(())
}

async fn reload(enforcer: &mut Enforcer, path: &Path, datapath: &Datapath) {
    let desired = match sluice_policy::load::load_path(path) {
        Ok(desired) => desired,
        Err(error) => {
            datapath.realize.reload_errors.inc();
            for file in &error.sources {
                for field in &file.errors {
                    tracing::error!(file = %file.origin, path = %field.path, reason = %field.reason, "policies refused; the last good policies stay");
                }
            }
            return;
        }
    };
    enforcer.apply(desired, &path.display().to_string()).await;
}

/// What a policy file looked like when last read: inode (a rename puts a new one in place),
/// modification time and length.
type FileStamp = (PathBuf, u64, Option<SystemTime>, u64);

/// The stamps of the policy file, or of every policy file of the directory: a file that
/// changes, appears or disappears changes the result. `None` when the path cannot be read.
fn stamp(path: &Path) -> Option<Vec<FileStamp>> {
    let files = if path.is_dir() {
        sluice_policy::load::policy_files(path).ok()?
    } else {
        vec![path.to_path_buf()]
    };
    Some(
        files
            .into_iter()
            .filter_map(|file| {
                let metadata = std::fs::metadata(&file).ok()?;
                Some((
                    file,
                    metadata.ino(),
                    metadata.modified().ok(),
                    metadata.len(),
                ))
            })
            .collect(),
    )
}
