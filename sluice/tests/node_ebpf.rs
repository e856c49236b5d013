//! `ebpf.interfaces` on a node (issue 16): the node, in a network namespace of its own, counts
//! the traffic of its interface and, per data-plane listener, the connections that reach its
//! port: exactly the SYNs the test sent.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::time::Duration;

use common::{agents_yaml, Secrets, BIN};
use test_support::{
    assert_driver, http_get, in_netns, metric_value, on_both_drivers, wait_until, NetNs,
    SluiceLauncher,
};

// The programs count in the kernel, but the node that loads them and answers the connections
// runs on a monoio driver: once per driver.
on_both_drivers!(a_node_counts_its_listeners_syns_on_its_interface);

const CONNECTIONS: u32 = 20;

fn metrics(netns: &str, admin: SocketAddr) -> String {
    in_netns(netns, move || {
        http_get(admin, "/metrics").map(|answer| answer.body)
    })
    .unwrap()
    .unwrap_or_default()
}

fn a_node_counts_its_listeners_syns_on_its_interface(driver: &str) {
    let netns = NetNs::new("ebnod").unwrap();
    let secrets = Secrets::on(driver);
    let yaml = format!(
        "runtime: {{workers: 1, drain_timeout: 1s, driver: {driver}}}\n\
         listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  external: {{address: '127.0.0.1:0'}}\n\
         tunnel:\n  node_name: ebpf-node\n  agents:\n{}  jwt: {{secret_file: '{}'}}\n\
         ebpf:\n  interfaces: [lo]\n",
        agents_yaml(&secrets),
        secrets.jwt_secret.display()
    );
    let mut launcher = SluiceLauncher::new(BIN).unwrap();
    let config = launcher.write_file("node.yaml", &yaml).unwrap();
    let namespace = std::fs::File::open(format!("/run/netns/{}", netns.name())).unwrap();
    let fd = namespace.as_raw_fd();
    // SAFETY: setns(2) between fork and exec, on a descriptor opened before the fork; it only
    // moves the child into the test's namespace.
    unsafe {
        launcher.command_mut().pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let node = launcher
        .arg("run")
        .arg("--config")
        .arg(config)
        .spawn()
        .expect("node starts");
    let admin = node.address("admin");
    let external = node.address("external");
    let text = metrics(netns.name(), admin);
    assert_driver(&text, driver);
    // The node's log says why, should the kernel refuse the counters.
    assert_eq!(
        metric_value(&text, "sluice_ebpf_enabled"),
        Some(1.0),
        "{text}\n{}",
        node.stderr()
    );
    assert_eq!(
        metric_value(&text, "sluice_ebpf_attached_interfaces"),
        Some(1.0)
    );

    // Every TCP connection on `lo` is one SYN (without ACK) on its ingress, the scrapes of
    // /metrics included: the count before, the scrapes since, and ours are all there is in this
    // namespace, so the interface's count is known exactly.
    let syns_on_lo =
        "sluice_ebpf_tcp_syn_total{interface=\"lo\",direction=\"ingress\",protocol=\"tcp\"}";
    let lo_before = metric_value(&metrics(netns.name(), admin), syns_on_lo).expect(syns_on_lo);
    let scrapes = std::cell::Cell::new(0u32);
    let scrape = || {
        scrapes.set(scrapes.get() + 1);
        metrics(netns.name(), admin)
    };
    in_netns(netns.name(), move || {
        for _ in 0..CONNECTIONS {
            drop(TcpStream::connect_timeout(&external, Duration::from_secs(2)).unwrap());
        }
    })
    .unwrap();
    let syns = "sluice_ebpf_listener_syns_total{listener=\"external\"}";
    assert!(
        wait_until(Duration::from_secs(5), || metric_value(&scrape(), syns)
            == Some(f64::from(CONNECTIONS))),
        "expected {CONNECTIONS} SYNs to the external listener:\n{}",
        metrics(netns.name(), admin)
            .lines()
            .filter(|line| line.starts_with("sluice_ebpf"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let text = scrape();
    assert_eq!(
        metric_value(&text, "sluice_ebpf_listener_syns_total{listener=\"agent\"}"),
        Some(0.0),
        "nothing connected to the agent listener"
    );
    assert_eq!(
        metric_value(&text, syns_on_lo),
        Some(lo_before + f64::from(CONNECTIONS + scrapes.get())),
        "{CONNECTIONS} connections and {} scrapes since {lo_before} SYNs:\n{text}",
        scrapes.get()
    );
    // On `lo` each of those SYNs left by the same interface before it came in.
    assert_eq!(
        metric_value(
            &text,
            "sluice_ebpf_tcp_syn_total{interface=\"lo\",direction=\"egress\",protocol=\"tcp\"}"
        ),
        metric_value(&text, syns_on_lo),
        "{text}"
    );
}
