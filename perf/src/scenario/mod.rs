//! The scenarios `perf/run.sh SCENARIO` runs.

pub mod access_log;
pub mod controlplane;
pub mod ebpf;
pub mod gateway;
mod gateway_report;
mod gateway_setup;
mod gateway_tunnel;
pub mod idle;
pub mod policy;
pub mod scale;
pub mod scaling;
pub mod soak;
pub mod tunnel;
mod tunnel_report;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::sluice::SluiceBinary;

/// What every scenario gets from the command line.
#[derive(Debug)]
pub struct Harness {
    pub sluice: SluiceBinary,
    /// The `sluice-apiserver-sim` binary (gateway scenario).
    pub apiserver_sim: PathBuf,
    /// The `sluice-perf-pingora` binary (`perf/peers/pingora/`) for the gateway and tunnel
    /// scenarios' Pingora case; `None`: that case is skipped (`perf/run.sh` builds it on full
    /// runs only).
    pub pingora: Option<PathBuf>,
    /// `perf/results/<scenario>` (or `<scenario>-smoke`).
    pub out: PathBuf,
    pub workspace: PathBuf,
    pub smoke: bool,
    pub client_cpu: String,
    pub proxy_cpu: String,
    pub upstream_cpu: String,
    /// Cases to run (empty: all).
    pub only: Vec<String>,
    /// Concurrency levels replacing the plan's (empty: the plan's).
    pub levels: Vec<(u32, u32)>,
    /// Requests per run replacing the plan's.
    pub requests: Option<u64>,
    /// Workload name fragments to run (gateway; empty: all).
    pub workloads: Vec<String>,
    /// Measured duration of each run replacing the plan's (gateway).
    pub seconds: Option<std::time::Duration>,
    /// How long the soak runs (default: 30, 1 with `--smoke`).
    pub minutes: Option<f64>,
    /// Soak: write the report again from the samples of an earlier run in `out`.
    pub resummarize: bool,
}

/// Writes `text` to `out/name`, creating directories.
pub fn write_output(out: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let path = out.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// `out/raw`, emptied: the check of a run (`perf/check-smoke`) reads every record in it, so a
/// record an earlier run left there must not survive to pass for this run's.
pub fn fresh_raw_dir(out: &Path) -> anyhow::Result<PathBuf> {
    let raw = out.join("raw");
    match std::fs::remove_dir_all(&raw) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(error).with_context(|| format!("cannot empty {}", raw.display()));
        }
    }
    std::fs::create_dir_all(&raw)?;
    Ok(raw)
}

/// `out/work`, emptied: generated configs, secrets and process logs of this run, kept after it
/// for a look at what happened (results are not committed).
pub fn fresh_work_dir(out: &Path) -> anyhow::Result<PathBuf> {
    let dir = out.join("work");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(std::fs::canonicalize(dir)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fresh_raw_dir_holds_no_record_of_an_earlier_run() {
        let out = tempfile::tempdir().unwrap();
        let stale = out.path().join("raw/etcd-50.json");
        std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
        std::fs::write(&stale, "{\"writes_acked\": 1}").unwrap();
        let raw = super::fresh_raw_dir(out.path()).unwrap();
        assert_eq!(raw, out.path().join("raw"));
        assert_eq!(std::fs::read_dir(&raw).unwrap().count(), 0);
        // Also when no earlier run left anything.
        let empty = tempfile::tempdir().unwrap();
        assert!(super::fresh_raw_dir(empty.path()).unwrap().is_dir());
    }
}
