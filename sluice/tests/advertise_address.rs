//! `sluice run --advertise-address IP:PORT` (issue 35, finding 5): one config file for every
//! node of a Kubernetes Deployment, each pod told its own address from the downward API
//! (`--advertise-address=$(POD_IP):8155`). A real node over a real redis-server publishes the
//! flag's address for its agent, not the file's, and keeps it across a reload; a flag the file
//! has no `tunnel` section for, and an address that is not `IP:PORT`, are refused with exit 2.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::process::Command;
use std::time::Duration;

use common::{agents_yaml, metric, start_agent, Secrets, BIN};
use test_support::{wait_until, GrpcBackend, RedisServer, SluiceLauncher};

#[test]
fn the_flag_replaces_the_files_address_in_redis_and_survives_a_reload() {
    let secrets = Secrets::new();
    let redis = RedisServer::start().unwrap();
    let private_secret = secrets.dir.path().join("private.secret");
    std::fs::write(&private_secret, "a private secret of at least 32 bytes!\n").unwrap();
    let yaml = format!(
        "listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  \
         external: {{address: '127.0.0.1:0'}}\n  private: {{address: '127.0.0.1:0'}}\n\
         tunnel:\n  node_name: adv-node\n  agents:\n{agents}  jwt: {{secret_file: '{jwt}'}}\n  \
         private_jwt: {{secret_file: '{private}'}}\n  advertise_address: '192.0.2.1:8155'\n\
         redis:\n  url: '{url}'\n  key_prefix: adv\n",
        agents = agents_yaml(&secrets),
        jwt = secrets.jwt_secret.display(),
        private = private_secret.display(),
        url = redis.url(),
    );
    let launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file("node.yaml", &yaml).unwrap();
    let node = launcher
        .args([
            "run",
            "--advertise-address",
            "198.51.100.7:8155",
            "--config",
        ])
        .arg(&config)
        .spawn()
        .unwrap();
    let backend = GrpcBackend::start().unwrap();
    let _agent = start_agent(&secrets, 7, &node, backend.address, 4, None);
    let published = || redis.command(&["HGETALL", "adv:tunnel:agent:{7}"]).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || published()
            .contains("198.51.100.7:8155")),
        "{}\n{}",
        published(),
        node.stderr()
    );
    assert!(!published().contains("192.0.2.1"), "{}", published());

    // A reload re-reads the file: the flag still wins, so nothing "changed" needs a restart.
    node.signal(libc::SIGHUP);
    let applied = "sluice_config_reloads_total{result=\"applied\"}";
    assert!(
        wait_until(Duration::from_secs(10), || metric(&node, applied)
            == Some(1.0)),
        "{}",
        node.stderr()
    );
    assert!(!node.stderr().contains("advertise_address changed"));
}

#[test]
fn the_flag_without_a_tunnel_section_or_with_a_host_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    let clusters = dir.path().join("clusters");
    std::fs::create_dir(&clusters).unwrap();
    std::fs::write(
        &config,
        format!(
            "listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  gateway: {{address: '127.0.0.1:0'}}\ngateway: {{clusters_dir: '{}'}}\n",
            clusters.display()
        ),
    )
    .unwrap();
    let run = |address: &str| {
        Command::new(BIN)
            .args(["run", "--advertise-address", address, "--config"])
            .arg(&config)
            .output()
            .unwrap()
    };
    let no_tunnel = run("10.0.0.1:8155");
    assert_eq!(no_tunnel.status.code(), Some(2), "{no_tunnel:?}");
    assert!(String::from_utf8_lossy(&no_tunnel.stderr)
        .contains("--advertise-address: the configuration has no `tunnel` section"));
    // Other nodes parse the advertised address as IP:PORT and skip anything else.
    for wrong in ["node-1.sluice:8155", "fd00::1:8155", "10.0.0.1"] {
        let refused = run(wrong);
        assert_eq!(refused.status.code(), Some(2), "{wrong}: {refused:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("--advertise-address"),
            "{refused:?}"
        );
    }
}
