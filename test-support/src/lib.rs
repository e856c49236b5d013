//! Fixtures shared by Sluice's integration tests. Everything here starts real things (processes,
//! sockets, certificates) on loopback and cleans them up on drop; nothing is a mock.

mod arp_watch;
mod certs;
mod controlplane;
mod curl_watch;
mod delay_relay;
mod ed25519;
mod etcd;
pub mod examples;
mod gateway_rig;
mod grpc;
pub mod heap_profile;
mod http;
pub mod metric_names;
mod netns;
mod netns_thread;
mod ovs;
mod partition;
mod ping_train;
mod prerequisite;
mod process;
pub mod raw_h2;
mod redis;
mod rolling_load;
mod seccomp;
mod tcp_balancer;
pub mod thread_allocations;
mod vm_agent;
mod vm_lan;
mod wait;

pub use sluice_apiserver_sim::{
    ApiServer, ApiServerOptions, Caller, RecordedRequest, SubjectAccessRule, TokenUser,
};

/// Simulator options with the server certificate and client CA of `certs`.
pub fn apiserver_options(certs: &Certificates) -> ApiServerOptions {
    ApiServerOptions::new(&certs.server_cert, &certs.server_key, &certs.ca_cert)
}
pub use arp_watch::ArpWatch;
pub use certs::{not_after_by_openssl, Certificates, ClientCert};
pub use controlplane::{kubectl_with, ControlPlane};
pub use curl_watch::CurlWatch;
pub use ed25519::Ed25519Keys;
pub use etcd::{
    etcd_installed, etcd_or_skip, EtcdCluster, EtcdServer, EtcdTlsFiles, ETCD_PROGRESS_INTERVAL,
};
pub use gateway_rig::{
    code_and_body, curl_at, gateway_config_yaml, gateway_curl, run_on_driver,
    upstream_cluster_yaml, write_clusters_dir, HEALTH_CHECK_FAST, SERVE_LOOPBACK,
};
pub use grpc::{python_script, spawn_tunnel_client, tunnel_client, GrpcBackend};
pub use http::{http_get, HttpResponse};
pub use netns::{NetNs, VethPort};
pub use netns_thread::in_netns;
pub use ovs::{unique_name, OvsInstance};
pub use partition::{DelayRelay, Host, Network};
pub use ping_train::{PingReport, PingTrain};
pub use prerequisite::{is_root, prerequisite, program_on_path, ROOT_IN_CI};
pub use process::{SluiceLauncher, SluiceProcess};
pub use redis::{RedisCluster, RedisServer, RedisTls};
pub use rolling_load::RollingLoad;
pub use seccomp::{block_io_uring_for_command, block_io_uring_in_this_thread};
pub use tcp_balancer::TcpBalancer;
pub use vm_agent::{metric_value, VmAgentProcess};
pub use vm_lan::VmLan;
pub use wait::{wait_for_tcp, wait_until};

/// The monoio drivers every data-plane case runs on, by their config names.
pub const DRIVERS: [&str; 2] = ["uring", "legacy"];

/// Runs each named test body, a `fn(driver: &str)`, once per monoio driver: for `fn calls(driver)`
/// it defines the tests `calls::io_uring` and `calls::legacy` (a module and a function may share
/// a name). One body, two processes' worth of fixtures: the cases stay independent, so a failure
/// names its driver.
#[macro_export]
macro_rules! on_both_drivers {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn io_uring() {
                super::$name("uring")
            }
            #[test]
            fn legacy() {
                super::$name("legacy")
            }
        }
    )+};
}

/// Asserts that a Sluice process's `/metrics` text says it runs on `driver` (`uring` or
/// `legacy`): a case meant for one driver must not silently run on the other.
pub fn assert_driver(metrics: &str, driver: &str) {
    // The metric names the driver as the runtime does: `io_uring` for the config's `uring`.
    let label = if driver == "uring" {
        "io_uring"
    } else {
        driver
    };
    let series = format!("driver=\"{label}\"}} 1");
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("sluice_build_info{") && line.ends_with(&series)),
        "the process does not run on the {driver} driver:\n{metrics}"
    );
}

use std::path::PathBuf;

/// The workspace root (where `Cargo.toml` with `[workspace]` lives), found from the current
/// directory (cargo runs tests in their package's directory). Not `env!("CARGO_MANIFEST_DIR")`:
/// a build directory shared by several checkouts could hand one checkout's paths to another.
pub fn workspace_root() -> PathBuf {
    let start = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    start
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.contains("[workspace]"))
        })
        .map(PathBuf::from)
        .unwrap_or(start)
}

/// The Python interpreter of the test venv that `scripts/test.sh` creates (grpcio, PyJWT,
/// kubernetes, prometheus-client). `SLUICE_PYTHON` overrides it.
pub fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_PYTHON") {
        return PathBuf::from(path);
    }
    let venv = workspace_root().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh once (it creates the test venv) or set SLUICE_PYTHON",
        venv.display()
    );
    venv
}
