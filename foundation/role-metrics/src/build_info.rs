//! `sluice_build_info{version,revision,driver} 1`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    revision: &'static str,
    driver: String,
}

/// The git commit this binary was built from (`build.rs`; "unknown" outside a git checkout).
pub const REVISION: &str = env!("SLUICE_REVISION");

/// Registers `sluice_build_info{version,revision,driver} 1` (`driver`: the data plane's
/// monoio driver, or `tokio` for the control plane and the VM agent). A gauge rather than an OpenMetrics info
/// metric so that scrapers of the classic Prometheus text format read it too.
pub fn register_build_info(registry: &mut Registry, version: &str, driver: &str) {
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&BuildLabels {
            version: version.to_string(),
            revision: REVISION,
            driver: driver.to_string(),
        })
        .set(1);
    registry.register(
        "sluice_build_info",
        "Version and git revision of the running binary and the I/O driver its workers use",
        build_info,
    );
}
