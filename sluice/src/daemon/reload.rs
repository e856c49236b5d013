//! `sluice run` on SIGHUP: reads the config file again, validates it as `sluice check-config`
//! does, and applies what may change live (see `sluice_config::reload`). A valid file's live
//! fields are swapped in whole (snapshots the data plane loads per call; no core waits for the
//! reload); changed fields that need a restart are logged by name and left as they are; an
//! invalid file is logged with file, field and reason and changes nothing. Counted in
//! `sluice_config_reloads_total{result}`.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use sluice_config::reload::{apply_live, plan, ReloadPlan, ReloadResult};
use sluice_config::{Config, FieldError, InvalidConfig};
use sluice_tunnel::node::NodeShared;

use crate::logging::LogFilterHandle;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HashLabel {
    sha256: String,
}

/// The reload metrics, on the admin endpoint.
#[derive(Clone)]
struct ReloadMetrics {
    reloads: Family<ResultLabel, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    last_successful: Gauge,
    generation: Gauge,
    info: Family<HashLabel, Gauge>,
}

impl ReloadMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reloads: Family::default(),
            last_success: Gauge::default(),
            last_successful: Gauge::default(),
            generation: Gauge::default(),
            info: Family::default(),
        };
        for result in ReloadResult::ALL {
            metrics.count(result, 0);
        }
        registry.register(
            "sluice_config_reloads",
            "Configuration reloads (SIGHUP) by result: applied, restart_required (live fields applied, others need a restart), invalid (nothing applied)",
            metrics.reloads.clone(),
        );
        registry.register(
            "sluice_config_last_reload_success_timestamp_seconds",
            "When the configuration was last loaded successfully (start-up or reload), Unix seconds",
            metrics.last_success.clone(),
        );
        registry.register(
            "sluice_config_last_reload_successful",
            "1 if the last configuration reload was valid, 0 if it was refused",
            metrics.last_successful.clone(),
        );
        registry.register(
            "sluice_config_generation",
            "Configurations applied since start: 1 at start-up, one more per valid reload",
            metrics.generation.clone(),
        );
        registry.register(
            "sluice_config_info",
            "The configuration file in force, by the first 16 hex digits of its SHA-256",
            metrics.info.clone(),
        );
        metrics
    }

    fn count(&self, result: ReloadResult, by: u64) {
        self.reloads
            .get_or_create(&ResultLabel {
                result: result.label().to_string(),
            })
            .inc_by(by);
    }

    fn loaded(&self, digest: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |elapsed| elapsed.as_secs_f64());
        self.last_success.set(now);
        self.last_successful.set(1);
        self.generation.inc();
        self.info.clear();
        self.info
            .get_or_create(&HashLabel {
                sha256: digest.to_string(),
            })
            .set(1);
    }
}

/// The first 16 hex digits of the SHA-256 of `bytes`.
fn short_digest(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..8])
}

/// Reads and validates the config file; its text's digest with it.
fn load(path: &std::path::Path) -> Result<(Config, String), InvalidConfig> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| InvalidConfig {
        origin: origin.clone(),
        errors: vec![FieldError::new("", format!("cannot read file: {error}"))],
    })?;
    let config = sluice_config::load_str(&text, &origin)?;
    // The files it names too, as `check-config` and a start check them.
    super::preflight::check(&config, &origin)?;
    Ok((config, short_digest(text.as_bytes())))
}

/// What a reload may touch in the running process.
pub struct Reloader {
    path: PathBuf,
    /// Applies the command line's `--workers` / `--driver` to a reloaded file, as at start-up.
    overrides: super::Overrides,
    running: Config,
    node: Option<Arc<NodeShared>>,
    log: Option<LogFilterHandle>,
    metrics: ReloadMetrics,
}

impl Reloader {
    pub fn new(
        path: PathBuf,
        overrides: super::Overrides,
        running: Config,
        node: Option<Arc<NodeShared>>,
        log: Option<LogFilterHandle>,
        registry: &mut Registry,
    ) -> Self {
        let metrics = ReloadMetrics::register(registry);
        // The digest of the file as it is now; it was read a moment ago at start-up.
        let digest = std::fs::read(&path).map_or_else(|_| String::new(), |b| short_digest(&b));
        metrics.loaded(&digest);
        Self {
            path,
            overrides,
            running,
            node,
            log,
            metrics,
        }
    }

    /// One reload (SIGHUP), between `RELOADING=1` and `READY=1`.
    pub fn reload(&mut self) {
        crate::notify::reloading("sluice");
        let result = self.reload_file();
        self.metrics.count(result, 1);
        crate::notify::reloaded("sluice", result.label());
    }

    fn reload_file(&mut self) -> ReloadResult {
        let file = self.path.display().to_string();
        let (mut new, digest) = match load(&self.path) {
            Ok(loaded) => loaded,
            Err(invalid) => {
                self.metrics.last_successful.set(0);
                for error in &invalid.errors {
                    tracing::error!(file, field = %error.path, reason = %error.reason, "configuration reload refused: {}: {error}", invalid.origin);
                }
                tracing::error!(
                    file,
                    errors = invalid.errors.len(),
                    "configuration reload refused; the last good configuration stays in force"
                );
                return ReloadResult::Invalid;
            }
        };
        (self.overrides)(&mut new);
        let plan = plan(&self.running, &new);
        for field in &plan.restart {
            tracing::warn!(file, field = %field, "configuration reload: {field} changed and needs a restart; not applied (the running value stays)");
        }
        self.apply(&plan, &new);
        self.running = apply_live(&self.running, &new);
        self.metrics.loaded(&digest);
        tracing::info!(
            file,
            sha256 = %digest,
            applied = ?plan.live,
            needs_restart = ?plan.restart,
            "configuration reloaded"
        );
        ReloadResult::of(&plan)
    }

    /// Swaps the live fields in: each is one atomic store or snapshot swap.
    fn apply(&self, plan: &ReloadPlan, new: &Config) {
        if plan.live.contains(&"logging.level") {
            match self.log.as_ref().map(|log| log.set(&new.logging.level)) {
                Some(Ok(true)) => {}
                Some(Ok(false)) => {
                    tracing::warn!("logging.level changed but RUST_LOG overrides it; not applied")
                }
                Some(Err(error)) => {
                    tracing::error!(%error, "logging.level could not be applied")
                }
                None => {}
            }
        }
        if plan.live.contains(&"gateway.access_log") || plan.live.contains(&"tunnel.access_log") {
            match super::access_log::apply(new) {
                Ok(()) => tracing::info!(applied = ?plan.live, "access logs switched"),
                Err(error) => tracing::error!(%error, "the access log writer could not start"),
            }
        }
        let (Some(node), Some(tunnel)) = (&self.node, &new.tunnel) else {
            return;
        };
        if plan.live.contains(&"tunnel.jwt") {
            node.set_jwt(&tunnel.jwt);
            tracing::info!(secret_file = %tunnel.jwt.secret_file.display(), "tunnel.jwt: client JWTs are checked with the reloaded key from now on");
        }
        // With `agents_from` the control plane's feed owns the agent list.
        if plan.live.contains(&"tunnel.agents") && tunnel.agents_from.is_none() {
            let revoked = node.set_agents(&tunnel.agents);
            tracing::info!(agents = tunnel.agents.len(), revoked = ?revoked, "tunnel.agents reloaded");
        }
        if plan.live.contains(&"tunnel.max_wait") {
            node.set_max_wait(tunnel.max_wait);
            tracing::info!(max_wait = ?tunnel.max_wait, "tunnel.max_wait reloaded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_short_and_stable() {
        assert_eq!(short_digest(b""), "e3b0c44298fc1c14");
        assert_ne!(short_digest(b"a"), short_digest(b"b"));
    }

    #[test]
    fn a_refused_reload_is_counted_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, "logging: {level: info}\n").unwrap();
        let running = sluice_config::load_file(&path).unwrap();
        let mut registry = Registry::default();
        let mut reloader = Reloader::new(
            path.clone(),
            Box::new(|_| {}),
            running.clone(),
            None,
            None,
            &mut registry,
        );
        std::fs::write(&path, "runtime: {workers: none}\n").unwrap();
        assert_eq!(reloader.reload_file(), ReloadResult::Invalid);
        assert_eq!(reloader.running, running);
        assert_eq!(reloader.metrics.last_successful.get(), 0);
        assert_eq!(reloader.metrics.generation.get(), 1);
        std::fs::write(&path, "logging: {level: debug}\nruntime: {workers: 3}\n").unwrap();
        assert_eq!(reloader.reload_file(), ReloadResult::RestartRequired);
        assert_eq!(reloader.running.logging.level, "debug");
        assert_eq!(reloader.running.runtime.workers, running.runtime.workers);
        assert_eq!(reloader.metrics.generation.get(), 2);
        assert_eq!(reloader.metrics.last_successful.get(), 1);
    }
}
