//! The counters against the real kernel (runs as root): two network namespaces joined by a
//! veth pair, the programs on one end, exact traffic sent, exact counts read back; hooks
//! inspected with the kernel's own TCX query or `tc filter show`.

mod netns;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netns::{
    one_each, refused_connections, released, run_in, send_frame, udp, Netns, Pair, A_ADDR, B_ADDR,
};
use prometheus_client::registry::Registry;
use sluice_ebpf::{
    AttachMode, Counts, Direction, EbpfCounters, EbpfMetrics, Listener, Protocol, L4,
};

fn listeners() -> Vec<Listener> {
    vec![
        Listener {
            name: "refused".to_string(),
            port: 7000,
            protocol: L4::Tcp,
        },
        Listener {
            name: "sink".to_string(),
            port: 9000,
            protocol: L4::Udp,
        },
        Listener {
            name: "idle".to_string(),
            port: 7001,
            protocol: L4::Tcp,
        },
    ]
}

fn load(mode: AttachMode) -> EbpfCounters {
    EbpfCounters::load_with(&listeners(), mode).expect("the kernel loads the programs")
}

fn attach(pair: &Pair, counters: EbpfCounters) -> EbpfCounters {
    let vb = pair.vb.clone();
    pair.b.run(move || {
        let mut counters = counters;
        counters.attach(&vb).expect("attach");
        counters
    })
}

fn counts(packets: u64, bytes: u64, tcp_syn: u64) -> Counts {
    Counts {
        packets,
        bytes,
        tcp_syn,
        malformed: 0,
    }
}

// Frame sizes: Ethernet 14 + IPv4 20 + UDP 8 + payload; a Linux SYN carries 20 bytes of TCP
// options (MSS, SACK permitted, timestamps, window scale): 14 + 20 + 40 = 74; a RST/ACK none:
// 54; an ICMP echo of ping's default 56 bytes: 14 + 20 + 8 + 56 = 98.
const UDP_IN: (u64, u64) = (10, 100);
const UDP_OUT: (u64, u64) = (7, 200);
const CONNECTIONS: u64 = 5;
const PINGS: u64 = 3;

#[test]
fn counts_exactly_what_crosses_the_interface_per_direction() {
    let pair = Pair::new();
    let counters = attach(&pair, load(AttachMode::Auto));
    one_each(pair.programs_on_vb(counters.mode()));

    udp(
        &pair.a,
        A_ADDR,
        &pair.b,
        B_ADDR,
        9000,
        UDP_IN.0 as usize,
        UDP_IN.1 as usize,
    );
    udp(
        &pair.b,
        B_ADDR,
        &pair.a,
        A_ADDR,
        9001,
        UDP_OUT.0 as usize,
        UDP_OUT.1 as usize,
    );
    refused_connections(&pair.a, B_ADDR, 7000, CONNECTIONS as usize);
    pair.a.exec(&[
        "ping",
        "-c",
        &PINGS.to_string(),
        "-i",
        "0.2",
        "-W",
        "2",
        B_ADDR,
    ]);

    let snapshot = counters.read().expect("read");
    let vb = pair.vb.as_str();
    let get = |direction, protocol| snapshot.get(vb, direction, protocol);
    assert_eq!(
        get(Direction::Ingress, Protocol::Udp),
        counts(UDP_IN.0, UDP_IN.0 * (42 + UDP_IN.1), 0)
    );
    assert_eq!(
        get(Direction::Egress, Protocol::Udp),
        counts(UDP_OUT.0, UDP_OUT.0 * (42 + UDP_OUT.1), 0)
    );
    assert_eq!(
        get(Direction::Ingress, Protocol::Tcp),
        counts(CONNECTIONS, CONNECTIONS * 74, CONNECTIONS)
    );
    assert_eq!(
        get(Direction::Egress, Protocol::Tcp),
        counts(CONNECTIONS, CONNECTIONS * 54, 0)
    );
    assert_eq!(
        get(Direction::Ingress, Protocol::Icmp),
        counts(PINGS, PINGS * 98, 0)
    );
    assert_eq!(
        get(Direction::Egress, Protocol::Icmp),
        counts(PINGS, PINGS * 98, 0)
    );
    for direction in Direction::ALL {
        for protocol in [Protocol::Icmpv6, Protocol::Other] {
            assert_eq!(
                get(direction, protocol),
                Counts::default(),
                "{direction:?} {protocol:?}"
            );
        }
    }
    assert_eq!(snapshot.map_full, 0);
    assert_eq!(snapshot.attached, vec![pair.vb.clone()]);

    // Listener ports: ingress only, whether user space accepted anything or not.
    let refused = snapshot.listener("refused").expect("registered");
    assert_eq!(
        (refused.packets, refused.bytes, refused.syns),
        (CONNECTIONS, CONNECTIONS * 74, CONNECTIONS)
    );
    let sink = snapshot.listener("sink").expect("registered");
    assert_eq!(
        (sink.packets, sink.bytes, sink.syns),
        (UDP_IN.0, UDP_IN.0 * (42 + UDP_IN.1), 0)
    );
    let idle = snapshot.listener("idle").expect("registered");
    assert_eq!((idle.packets, idle.bytes, idle.syns), (0, 0, 0));

    // The same numbers on /metrics, read from the maps at scrape time; then detach.
    let shared = Arc::new(Mutex::new(counters));
    assert_on_metrics(&shared, vb);
    detach_releases(&pair, &shared);
}

fn attach_twice_then_detach(mode: AttachMode) {
    let pair = Pair::new();
    let mut counters = attach(&pair, attach(&pair, load(mode)));
    assert_eq!(counters.mode(), mode);
    one_each(pair.programs_on_vb(mode));
    assert_eq!(counters.attached(), vec![pair.vb.clone()]);
    let vb = pair.vb.clone();
    let counters_ref = &mut counters;
    pair.b
        .run(move || counters_ref.detach(&vb).expect("detach"));
    released(&pair, mode);
    assert!(counters.attached().is_empty());
    // Attached again after a detach, then dropped: drop releases the hooks too.
    let counters = attach(&pair, counters);
    one_each(pair.programs_on_vb(mode));
    drop(counters);
    released(&pair, mode);
}

#[test]
fn attach_is_idempotent_and_detach_releases_the_hooks_tcx() {
    attach_twice_then_detach(AttachMode::Tcx);
}

#[test]
fn attach_is_idempotent_and_detach_releases_the_hooks_netlink() {
    attach_twice_then_detach(AttachMode::Netlink);
}

fn restarts_leave_one_program_per_hook(mode: AttachMode) {
    let pair = Pair::new();
    // A restart: the old instance is gone before the new one attaches.
    let old = attach(&pair, load(mode));
    drop(old);
    let current = attach(&pair, load(mode));
    one_each(pair.programs_on_vb(mode));
    // An overlap: the new instance attaches while the old one still holds the hooks; it takes
    // them over, and the old one's later drop leaves the new one's programs in place.
    let newer = attach(&pair, load(mode));
    one_each(pair.programs_on_vb(mode));
    drop(current);
    one_each(pair.programs_on_vb(mode));
    // ... and they are the ones counting.
    udp(&pair.a, A_ADDR, &pair.b, B_ADDR, 9000, 3, 10);
    let snapshot = newer.read().expect("read");
    assert_eq!(
        snapshot.get(&pair.vb, Direction::Ingress, Protocol::Udp),
        counts(3, 3 * 52, 0)
    );
    drop(newer);
    released(&pair, mode);
}

#[test]
fn restarts_leave_one_program_per_hook_tcx() {
    restarts_leave_one_program_per_hook(AttachMode::Tcx);
}

#[test]
fn restarts_leave_one_program_per_hook_netlink() {
    restarts_leave_one_program_per_hook(AttachMode::Netlink);
}

#[test]
fn interfaces_of_another_namespace_are_refused() {
    let pair = Pair::new();
    let mut counters = attach(&pair, load(AttachMode::Auto));
    let va = pair.va.clone();
    let result = pair.a.run(move || counters.attach(&va).map(|()| counters));
    assert!(
        matches!(result, Err(sluice_ebpf::EbpfError::OtherNamespace { .. })),
        "{result:?}"
    );
}

const CHILD_NETNS: &str = "SLUICE_EBPF_TEST_CHILD_NETNS";
const CHILD_DEV: &str = "SLUICE_EBPF_TEST_CHILD_DEV";
const CHILD_MODE: &str = "SLUICE_EBPF_TEST_CHILD_MODE";

/// The child process `killed_processes_...` starts is this test binary again, with the three
/// variables above set: [`child_entry`] runs it from `.init_array`, before libtest's `main`, so
/// the child never reaches the tests. Not a `#[test]` that returns without its environment: that
/// one passed, without running anything, in every ordinary run.
extern "C" fn child_entry() {
    let (Some(netns), Some(dev), Some(mode)) = (
        std::env::var_os(CHILD_NETNS),
        std::env::var_os(CHILD_DEV),
        std::env::var_os(CHILD_MODE),
    ) else {
        return;
    };
    hold_the_hooks(
        &netns.to_string_lossy(),
        &dev.to_string_lossy(),
        if mode == "netlink" {
            AttachMode::Netlink
        } else {
            AttachMode::Tcx
        },
    );
    std::process::exit(0);
}

#[used]
#[link_section = ".init_array"]
static RUN_THE_CHILD_BEFORE_THE_TESTS: extern "C" fn() = child_entry;

/// The child's body: attaches in `netns`, says so, then waits to be killed. A panic here aborts
/// the child (it runs in an `extern "C"` function), which the parent sees as never attaching.
fn hold_the_hooks(netns: &str, dev: &str, mode: AttachMode) {
    let dev = dev.to_string();
    let counters = run_in(netns, move || {
        let mut counters = load(mode);
        counters.attach(&dev).expect("attach in the child");
        counters
    });
    // Straight to fd 1, unbuffered: the parent waits for this line.
    let mut stdout = std::io::stdout();
    std::io::Write::write_all(&mut stdout, b"attached\n").expect("stdout");
    std::io::Write::flush(&mut stdout).expect("stdout");
    // Not a synchronisation: the child holds the hooks until the parent kills it; the minute
    // only bounds a child whose parent died.
    std::thread::sleep(Duration::from_secs(60));
    drop(counters);
}

/// A failed assertion must not leave the child holding hooks for a minute.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn killed_processes_leave_one_program_per_hook(mode: AttachMode, label: &str) {
    use std::io::BufRead;
    let pair = Pair::new();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().expect("test binary"))
            // `child_entry` takes over before libtest starts; should it not, this filter
            // matches no test, so the child never runs the suite again.
            .args(["--exact", "the_child_runs_from_init_array"])
            .env(CHILD_NETNS, &pair.b.0)
            .env(CHILD_DEV, &pair.vb)
            .env(CHILD_MODE, label)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the child"),
    );
    let stdout = child.0.stdout.take().expect("piped");
    let attached = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("attached"));
    assert!(attached, "the child never attached");
    one_each(pair.programs_on_vb(mode));
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    // TCX links die with their last fd; a netlink filter stays until a new instance replaces it.
    match mode {
        AttachMode::Netlink => one_each(pair.programs_on_vb(mode)),
        _ => released(&pair, mode),
    }
    let counters = attach(&pair, load(mode));
    one_each(pair.programs_on_vb(mode));
    udp(&pair.a, A_ADDR, &pair.b, B_ADDR, 9000, 2, 10);
    let snapshot = counters.read().expect("read");
    assert_eq!(
        snapshot.get(&pair.vb, Direction::Ingress, Protocol::Udp),
        counts(2, 2 * 52, 0)
    );
    drop(counters);
    released(&pair, mode);
}

#[test]
fn killed_processes_leave_one_program_per_hook_tcx() {
    killed_processes_leave_one_program_per_hook(AttachMode::Tcx, "tcx");
}

#[test]
fn killed_processes_leave_one_program_per_hook_netlink() {
    killed_processes_leave_one_program_per_hook(AttachMode::Netlink, "netlink");
}

#[test]
fn truncated_headers_are_counted_as_malformed() {
    let pair = Pair::new();
    let counters = attach(&pair, load(AttachMode::Auto));
    let mac = |ns: &Netns, dev: &str| -> Vec<u8> {
        ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")])
            .trim()
            .split(':')
            .map(|byte| u8::from_str_radix(byte, 16).expect("hex"))
            .collect()
    };
    let mut ipv4 = mac(&pair.b, &pair.vb);
    ipv4.extend(mac(&pair.a, &pair.va));
    ipv4.extend([0x08, 0x00]);
    let mut vlan_tcp = ipv4.clone();
    // IPv4 cut after 10 of its 20 header bytes.
    ipv4.extend([0x45, 0, 0, 30, 0, 0, 0, 0, 64, 6]);
    // VLAN-tagged IPv4 whose 20-byte header says TCP, with 4 bytes of TCP header.
    vlan_tcp.truncate(12);
    vlan_tcp.extend([0x81, 0x00, 0x00, 0x07, 0x08, 0x00]);
    vlan_tcp.extend([
        0x45, 0, 0, 24, 0, 0, 0, 0, 64, 6, 0, 0, 10, 77, 0, 1, 10, 77, 0, 2,
    ]);
    vlan_tcp.extend([0x1b, 0x58, 0x1b, 0x58]);
    let va = pair.va.clone();
    let frames = [ipv4.clone(), vlan_tcp.clone()];
    pair.a.run(move || {
        for frame in &frames {
            send_frame(&va, frame);
        }
    });
    let snapshot = counters.read().expect("read");
    assert_eq!(
        snapshot.get(&pair.vb, Direction::Ingress, Protocol::Other),
        Counts {
            packets: 1,
            bytes: ipv4.len() as u64,
            tcp_syn: 0,
            malformed: 1
        }
    );
    assert_eq!(
        snapshot.get(&pair.vb, Direction::Ingress, Protocol::Tcp),
        Counts {
            packets: 1,
            // The receive path moves the tag into skb->vlan_tci before tc: not in skb->len.
            bytes: vlan_tcp.len() as u64 - 4,
            tcp_syn: 0,
            malformed: 1
        }
    );
}

/// The counts of `counts_exactly_...` as `/metrics` shows them, read at scrape time.
fn assert_on_metrics(shared: &Arc<Mutex<EbpfCounters>>, vb: &str) {
    let metrics = EbpfMetrics::live(Arc::clone(shared));
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        format!("sluice_ebpf_packets_total{{interface=\"{vb}\",direction=\"ingress\",protocol=\"udp\"}} 10\n"),
        format!("sluice_ebpf_tcp_syn_total{{interface=\"{vb}\",direction=\"ingress\",protocol=\"tcp\"}} 5\n"),
        "sluice_ebpf_listener_syns_total{listener=\"refused\"} 5\n".to_string(),
        "sluice_ebpf_enabled 1\n".to_string(),
        "sluice_ebpf_attached_interfaces 1\n".to_string(),
    ] {
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }
}

/// Detach: the hooks are free, the interface's counters gone from reads and from the map.
fn detach_releases(pair: &Pair, shared: &Arc<Mutex<EbpfCounters>>) {
    let mut counters = shared.lock().expect("lock");
    let vb_name = pair.vb.clone();
    let counters_ref = &mut *counters;
    pair.b
        .run(move || counters_ref.detach(&vb_name).expect("detach"));
    released(pair, counters.mode());
    let after = counters.read().expect("read");
    assert!(
        after.interfaces.is_empty() && after.attached.is_empty(),
        "{after:?}"
    );
    assert!(matches!(
        counters.detach(&pair.vb),
        Err(sluice_ebpf::EbpfError::NotAttached(_))
    ));
    // Attached again (same ifindex): it starts from zero, so detach deleted its keys.
    let vb_name = pair.vb.clone();
    let counters_ref = &mut *counters;
    pair.b
        .run(move || counters_ref.attach(&vb_name).expect("attach again"));
    let again = counters.read().expect("read");
    assert!(again.interfaces.is_empty(), "{again:?}");
    assert_eq!(again.attached, vec![pair.vb.clone()]);
}
