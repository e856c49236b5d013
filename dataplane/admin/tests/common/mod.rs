//! Builds a server with the admin endpoint (dedicated thread) and the runtime tests' line
//! service (worker cores), as the daemon wires them.
#![allow(dead_code)]

#[path = "../../../runtime/tests/common/mod.rs"]
mod runtime_common;

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sluice_admin::{AdminEndpoint, AdminMetrics, AdminOptions};
use sluice_runtime::{Driver, Lifecycle, ListenerStats, Placement, RunningServer};

pub use runtime_common::{LineClient, DRIVERS};

pub struct Harness {
    pub running: RunningServer,
    pub lifecycle: Arc<Lifecycle>,
    pub admin: SocketAddr,
    pub data: SocketAddr,
    pub data_stats: ListenerStats,
    /// Slow requests the data-plane service has begun.
    pub slow_started: Arc<AtomicUsize>,
}

pub fn start(driver: Driver, slow: Duration, admin_options: AdminOptions) -> Harness {
    let (mut server, lifecycle) = runtime_common::builder(driver, 2, Duration::from_secs(10));
    let data = server
        .bind(
            "echo",
            &runtime_common::listener("127.0.0.1:0"),
            Placement::Workers,
        )
        .expect("bind data listener");
    let admin = server
        .bind(
            "admin",
            &runtime_common::listener("127.0.0.1:0"),
            Placement::Dedicated,
        )
        .expect("bind admin listener");
    let mut registry = Registry::default();
    sluice_admin::register_build_info(&mut registry, "9.9.9", driver.as_str());
    server.register_metrics(&mut registry);
    let metrics = AdminMetrics::register(&mut registry);
    let service = runtime_common::LineService::new(slow);
    let slow_started = service.slow_started.clone();
    server.serve(data, service);
    server.serve(
        admin,
        AdminEndpoint::new(Arc::new(registry), metrics, admin_options),
    );
    let (admin_address, data_address, data_stats) = (
        server.local_addr(admin),
        server.local_addr(data),
        server.stats(data),
    );
    let running = server.start().expect("server starts");
    Harness {
        running,
        lifecycle,
        admin: admin_address,
        slow_started,
        data: data_address,
        data_stats,
    }
}

pub fn default_options() -> AdminOptions {
    AdminOptions {
        header_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(30),
    }
}
