//! What the agent enforces, kept on disk so that a cold start without the control plane
//! enforces the last known policies at once (the seed's "disconnected agent": a transient
//! loss keeps the VM's policies unchanged, a restart included).
//!
//! The file holds the objects the control plane sent (as the watches showed them), not the
//! compiled set: loading goes through the same validation as objects from the API, and a newer
//! agent reads an older file by the API's rules, not by an internal format.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::VmAgentError;

const FILE: &str = "enforced.json";
/// A file larger than this is not the agent's (the API caps what it serves far below it).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The objects a VM's policies were built from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Enforced {
    /// The VM these were for: a state directory moved to another VM is not used.
    pub vm: String,
    pub address_groups: Vec<Value>,
    pub applied_to_groups: Vec<Value>,
    pub network_policies: Vec<Value>,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes `enforced` so that a crash at any point leaves either the old file or the new one:
/// a temporary file, synced, renamed over the old one, then the directory synced.
pub fn save(dir: &Path, enforced: &Enforced) -> Result<(), VmAgentError> {
    let io = |source| VmAgentError::SavedStateIo {
        path: path(dir),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let text = serde_json::to_vec(enforced).map_err(|source| VmAgentError::SavedStateFormat {
        path: path(dir),
        source,
    })?;
    let temporary = dir.join(format!(".{FILE}.tmp"));
    let mut file = std::fs::File::create(&temporary).map_err(io)?;
    file.write_all(&text).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, path(dir)).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|directory| directory.sync_all())
        .map_err(io)
}

/// The saved state for `vm`; `None` when there is none (or it is another VM's, logged).
pub fn load(dir: &Path, vm: &str) -> Result<Option<Enforced>, VmAgentError> {
    let path = path(dir);
    let metadata = match std::fs::metadata(&path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(VmAgentError::SavedStateIo { path, source }),
    };
    if metadata.len() > MAX_FILE_BYTES {
        return Err(VmAgentError::SavedStateTooLarge {
            path,
            limit: MAX_FILE_BYTES,
        });
    }
    let text = std::fs::read(&path).map_err(|source| VmAgentError::SavedStateIo {
        path: path.clone(),
        source,
    })?;
    let enforced: Enforced =
        serde_json::from_slice(&text).map_err(|source| VmAgentError::SavedStateFormat {
            path: path.clone(),
            source,
        })?;
    if enforced.vm != vm {
        tracing::warn!(file = %path.display(), saved_for = %enforced.vm, %vm,
            "the saved policies are another VM's; not used");
        return Ok(None);
    }
    Ok(Some(enforced))
}

/// Forgets the saved state (the VM is no longer agented).
pub fn remove(dir: &Path) -> Result<(), VmAgentError> {
    match std::fs::remove_file(path(dir)) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(VmAgentError::SavedStateIo {
            path: path(dir),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enforced(vm: &str) -> Enforced {
        Enforced {
            vm: vm.into(),
            address_groups: vec![json!({"metadata": {"name": "g"}})],
            applied_to_groups: vec![],
            network_policies: vec![json!({"metadata": {"name": "p", "generation": 2}})],
        }
    }

    #[test]
    fn saved_state_round_trips_and_is_kept_per_vm() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path(), "vm1").unwrap().is_none());
        save(dir.path(), &enforced("vm1")).unwrap();
        assert_eq!(load(dir.path(), "vm1").unwrap(), Some(enforced("vm1")));
        assert!(load(dir.path(), "vm2").unwrap().is_none(), "another VM's");
        save(dir.path(), &enforced("vm1")).unwrap();
        remove(dir.path()).unwrap();
        remove(dir.path()).unwrap();
        assert!(load(dir.path(), "vm1").unwrap().is_none());
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), b"{\"vm\": 7").unwrap();
        assert!(matches!(
            load(dir.path(), "vm1"),
            Err(VmAgentError::SavedStateFormat { .. })
        ));
    }
}
