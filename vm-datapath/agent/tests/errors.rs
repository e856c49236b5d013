//! What stops the agent before it enforces anything comes back as a typed error that says
//! whether a restart with the same options may help (no OVS needed: each case fails before the
//! bridge is touched, or at the first OVSDB connection).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use sluice_vm_agent::{Notify, VmAgentError, VmAgentOptions};

fn options(dir: &std::path::Path, admin: SocketAddr) -> VmAgentOptions {
    VmAgentOptions {
        bridge: "br-test".into(),
        policies: None,
        lifecycle: None,
        ovs_rundir: dir.to_path_buf(),
        db_socket: Some(dir.join("no-ovsdb-here.sock")),
        admin,
        stats_interval: Duration::from_secs(2),
        reject_meter: sluice_policy_engine::RejectMeter {
            rate: 100,
            burst: 200,
        },
        ebpf: false,
        notify: Notify::NONE,
    }
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[test]
fn no_policy_source_is_final() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let error = sluice_vm_agent::run(options(dir.path(), any_port()))
        .expect_err("an agent without policies does not run");
    assert!(
        matches!(error, VmAgentError::NoPolicySource),
        "got {error:?}"
    );
    assert!(!error.retryable());
}

#[test]
fn a_taken_admin_address_names_it_and_may_be_retried() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let taken = TcpListener::bind(any_port()).expect("a loopback port");
    let address = taken.local_addr().expect("its address");
    let mut options = options(dir.path(), address);
    options.policies = Some(PathBuf::from("policies.yaml"));
    let error = sluice_vm_agent::run(options).expect_err("the admin address is taken");
    match &error {
        VmAgentError::AdminBind { address: named, .. } => assert_eq!(*named, address),
        other => panic!("expected AdminBind, got {other:?}"),
    }
    assert!(error.retryable());
    assert!(error.to_string().contains(&address.to_string()), "{error}");
}

#[test]
fn an_unreachable_ovsdb_may_be_retried() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut options = options(dir.path(), any_port());
    options.policies = Some(dir.path().join("policies.yaml"));
    let error = sluice_vm_agent::run(options).expect_err("there is no OVSDB");
    assert!(matches!(error, VmAgentError::Ovsdb { .. }), "got {error:?}");
    assert!(error.retryable());
}
