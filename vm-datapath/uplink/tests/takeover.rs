//! The uplink takeover against the real thing: a private OVS (userspace datapath) whose network
//! namespace plays the VM, a veth `eth0` from it to a peer namespace, real pings and TCP.
//! `take_over`/`restore` act on the calling thread's namespace, so they run through
//! `in_netns` on a thread inside the VM's namespace with a current-thread runtime there.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sluice_ovs::OvsdbClient;
use sluice_uplink::plan::{Op, Step};
use sluice_uplink::{NetlinkHost, TakenOver, UplinkError};
use test_support::{
    in_netns, unique_name, wait_until, ArpWatch, NetNs, OvsInstance, PingReport, PingTrain,
};

const BRIDGE: &str = "br0";
/// The peer's ping train: fine enough that an echo request often (in a fifth to a half of the
/// runs here) falls into the few milliseconds the uplink is down, when the peer's veth end has
/// lost carrier and flushed the VM's neighbour entry: the case the announcement is for. The
/// announcement itself is checked on every run (`ArpWatch`), since the race is not certain.
const PING_INTERVAL: Duration = Duration::from_millis(1);
/// The longest the peer may go without a reply while the uplink is taken over or restored, in
/// this rig, where the peer sits on the uplink's own veth and loses carrier during the rename.
/// Without the announcement a peer that had to resolve the VM again waits for its 1 s ARP retry
/// (about 1.03 s without a reply). With it, a clean-clone CI run on a loaded 2-core machine still
/// saw one 510 ms gap (51 echoes lost, ping backing off), unexplained so far; so this rig asserts
/// only that no outage reaches 2 s, and the announcement's effect is proven where it is certain:
/// the capture of the gratuitous ARP below and the neighbour-table test. The 300 ms bound is
/// asserted where the peer keeps its carrier (`sluice/tests/vm_lifecycle.rs`). Lost echoes are
/// printed, not asserted: iputils ping slows down while no reply comes, so their count says less
/// than the gap.
const MAX_GAP: Duration = Duration::from_secs(2);

struct Vm {
    ovs: OvsInstance,
    peer: NetNs,
    /// The peer's end of the VM's `eth0`.
    peer_dev: String,
    /// `10.x.y`, unique to this process.
    subnet: String,
}

impl Vm {
    fn ip(&self, host: u8) -> String {
        format!("{}.{host}", self.subnet)
    }

    fn vm(&self, args: &[&str]) -> String {
        self.ovs
            .exec_in_netns(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// The VM's links, addresses and main-table routes, once IPv6 duplicate address detection
    /// has settled (a re-upped link's link-local address is tentative for a moment).
    fn snapshot(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = [
                self.vm(&["ip", "-j", "link", "show"]),
                self.vm(&["ip", "-j", "addr", "show"]),
                self.vm(&["ip", "-j", "-4", "route", "show", "table", "main"]),
                self.vm(&["ip", "-j", "-6", "route", "show", "table", "main"]),
                self.vm(&[
                    "cat",
                    "/proc/sys/net/ipv4/conf/eth0/rp_filter",
                    "/proc/sys/net/ipv4/conf/eth0/arp_ignore",
                    "/proc/sys/net/ipv6/conf/eth0/disable_ipv6",
                ]),
            ]
            .join("\n");
            if !text.contains("tentative") || Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A VM namespace (the OVS instance's) with `eth0` = `<subnet>.2/24` and a default route via
/// the peer's `.1`; the peer also answers on 198.51.100.1 (off-subnet: reached by the default
/// route); a netdev bridge with a NORMAL flow (the takeover installs no flows).
fn vm() -> Vm {
    let ovs = OvsInstance::start().expect("OVS starts");
    let peer = NetNs::new("peer").expect("peer namespace");
    let pid = std::process::id();
    let subnet = format!("10.{}.{}", (pid >> 8) & 0xff, pid & 0xff);
    let peer_dev = unique_name("p");
    let vm = Vm {
        ovs,
        peer,
        peer_dev: peer_dev.clone(),
        subnet,
    };
    vm.vm(&[
        "ip",
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        &peer_dev,
        "netns",
        vm.peer.name(),
    ]);
    vm.vm(&[
        "ip",
        "addr",
        "add",
        &format!("{}/24", vm.ip(2)),
        "dev",
        "eth0",
    ]);
    vm.vm(&["ip", "link", "set", "eth0", "up"]);
    vm.vm(&["ip", "route", "add", "default", "via", &vm.ip(1)]);
    let peer_cmds: [&[&str]; 4] = [
        &[
            "ip",
            "addr",
            "add",
            &format!("{}/24", vm.ip(1)),
            "dev",
            &peer_dev,
        ],
        &["ip", "addr", "add", "198.51.100.1/32", "dev", "lo"],
        &["ip", "link", "set", &peer_dev, "up"],
        // The peer's TCP must reach the userspace datapath with finished checksums (NOTES.md).
        &["ethtool", "-K", &peer_dev, "tx", "off"],
    ];
    for args in peer_cmds {
        vm.peer
            .run(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    run(async {
        let mut ovsdb = connect(&vm.ovs).await;
        ovsdb.create_bridge(BRIDGE).await.expect("bridge");
    });
    vm.ovs
        .ovs_ofctl(&[
            "-O",
            "OpenFlow13",
            "add-flow",
            BRIDGE,
            "priority=0,actions=NORMAL",
        ])
        .expect("NORMAL flow");
    assert!(
        vm.peer_ping(&vm.ip(2)),
        "the VM is reachable before the takeover"
    );
    vm
}

impl Vm {
    fn peer_ping(&self, ip: &str) -> bool {
        self.peer
            .exec(&["ping", "-c", "1", "-W", "2", ip])
            .is_ok_and(|o| o.status.success())
    }

    fn vm_ping(&self, ip: &str) -> bool {
        self.ovs
            .exec_in_netns(&["ping", "-c", "1", "-W", "2", ip])
            .is_ok()
    }

    fn start_ping(&self) -> PingTrain {
        PingTrain::start(self.peer.name(), &self.ip(2), PING_INTERVAL).expect("ping starts")
    }
}

/// How many replies show a ping train is running before the uplink changes: 20 echoes at
/// [`PING_INTERVAL`] is ~20 ms of an answering VM, so the change starts inside the train.
const REPLIES_BEFORE: u64 = 20;

/// Starts the uplink change only once the peer's pings are answered: a train that had not
/// started yet would show its start-up as a gap.
fn wait_train_running(ping: &PingTrain) {
    assert!(
        ping.wait_replies(REPLIES_BEFORE, Duration::from_secs(10)),
        "the peer's pings were not answered before the change ({} replies)",
        ping.replies()
    );
}

/// Stops a ping train half a second after the change. Not a synchronisation: it is the window
/// the peer keeps measuring, so a stall that begins as the change ends shows in the longest gap
/// (which runs to the stop).
fn stop_ping(ping: PingTrain) -> PingReport {
    std::thread::sleep(Duration::from_millis(500));
    ping.stop()
}

fn run<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

async fn connect(ovs: &OvsInstance) -> OvsdbClient {
    OvsdbClient::connect(ovs.db_socket(), Duration::from_secs(10))
        .await
        .expect("OVSDB")
}

/// `take_over` inside the VM's namespace.
fn take_over(vm: &Vm, bridge: &str) -> Result<TakenOver, UplinkError> {
    let socket = vm.ovs.db_socket();
    let bridge = bridge.to_string();
    in_netns(vm.ovs.netns(), move || {
        run(async move {
            let mut ovsdb = OvsdbClient::connect(socket, Duration::from_secs(10))
                .await
                .expect("OVSDB");
            sluice_uplink::take_over(&mut ovsdb, &bridge, "eth0").await
        })
    })
    .expect("thread in the VM namespace")
}

fn recover(vm: &Vm) -> Option<TakenOver> {
    let socket = vm.ovs.db_socket();
    in_netns(vm.ovs.netns(), move || {
        run(async move {
            let mut ovsdb = OvsdbClient::connect(socket, Duration::from_secs(10))
                .await
                .expect("OVSDB");
            sluice_uplink::recover(&mut ovsdb, BRIDGE).await
        })
    })
    .expect("thread in the VM namespace")
    .expect("recover")
}

fn restore(vm: &Vm) -> Result<(), UplinkError> {
    let socket = vm.ovs.db_socket();
    in_netns(vm.ovs.netns(), move || {
        run(async move {
            let mut ovsdb = OvsdbClient::connect(socket, Duration::from_secs(10))
                .await
                .expect("OVSDB");
            sluice_uplink::restore(&mut ovsdb, BRIDGE, "eth0").await
        })
    })
    .expect("thread in the VM namespace")
}

/// A TCP exchange from the peer to the VM: a listener inside the VM, a client in the peer.
fn tcp_works(vm: &Vm) -> bool {
    let listener = in_netns(vm.ovs.netns(), || TcpListener::bind("0.0.0.0:0"))
        .expect("thread")
        .expect("listener");
    let port = listener.local_addr().expect("port").port();
    let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
        let (mut stream, _) = listener.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut hello = [0u8; 5];
        stream.read_exact(&mut hello)?;
        stream.write_all(b"world")?;
        Ok(hello.to_vec())
    });
    let address: SocketAddr = format!("{}:{port}", vm.ip(2)).parse().expect("address");
    let client = in_netns(vm.peer.name(), move || -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"hello")?;
        let mut world = [0u8; 5];
        stream.read_exact(&mut world)?;
        Ok(world.to_vec())
    })
    .expect("thread");
    if client.is_err() {
        // Unblock the accept so the server thread ends.
        let _ = in_netns(vm.peer.name(), move || {
            TcpStream::connect_timeout(&address, Duration::from_millis(200))
        });
    }
    let served = server.join().expect("server thread");
    matches!((client, served), (Ok(w), Ok(h)) if w == b"world" && h == b"hello")
}

#[test]
fn a_failed_takeover_leaves_the_vm_exactly_as_it_was() {
    let vm = vm();
    // A Port named eth0 already exists (a patch port on another bridge: it touches no device),
    // so the internal port cannot be added after the uplink was renamed and bridged.
    vm.ovs
        .ovs_vsctl(&[
            "add-br",
            "brx",
            "--",
            "set",
            "bridge",
            "brx",
            "datapath_type=netdev",
            "--",
            "add-port",
            "brx",
            "eth0",
            "--",
            "set",
            "interface",
            "eth0",
            "type=patch",
            "options:peer=nowhere",
        ])
        .expect("conflicting port");
    let before = vm.snapshot();
    let error = take_over(&vm, BRIDGE).expect_err("the internal port conflicts");
    println!("injected failure: {error}");
    assert_eq!(
        error.step(),
        Some("add internal port eth0 to bridge br0"),
        "{error}"
    );
    assert!(
        error.to_string().contains("rolled back completely"),
        "{error}"
    );
    assert_eq!(
        vm.snapshot(),
        before,
        "the VM changed after a rolled-back takeover"
    );
    let ports = vm.ovs.ovs_vsctl(&["list-ports", BRIDGE]).expect("ports");
    assert_eq!(ports.trim(), "", "eth0~ must be gone from the bridge");
    assert!(vm.peer_ping(&vm.ip(2)));

    // A missing bridge is refused before anything changes.
    let error = take_over(&vm, "nobridge").expect_err("no such bridge");
    assert!(matches!(error, UplinkError::Observe { .. }), "{error}");
    assert_eq!(vm.snapshot(), before);
}

/// The internal port has the uplink's name, MAC, address and the default route; the VM
/// answers pings once and reaches off-subnet addresses.
fn assert_taken_over(vm: &Vm, taken: &TakenOver, mac: &str) {
    assert_eq!(vm.vm(&["cat", "/sys/class/net/eth0/address"]), *mac);
    let addr = vm.vm(&["ip", "-o", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains(&format!("{}/24", vm.ip(2))), "{addr}");
    let renamed = vm.vm(&["ip", "-o", "addr", "show", "dev", "eth0~"]);
    assert!(
        !renamed.contains("inet "),
        "only its IPv6 link-local address stays: {renamed}"
    );
    let default = vm.vm(&["ip", "route", "show", "default"]);
    assert!(
        default.contains(&format!("via {} dev eth0 ", vm.ip(1))),
        "{default}"
    );
    assert_eq!(
        vm.ovs
            .ovs_vsctl(&["port-to-br", "eth0~"])
            .expect("eth0~")
            .trim(),
        BRIDGE
    );
    assert_eq!(
        vm.ovs
            .ovs_vsctl(&["get", "Interface", "eth0", "type"])
            .expect("eth0")
            .trim(),
        "internal"
    );
    let offload = vm.vm(&["ethtool", "-k", "eth0"]);
    assert!(offload.contains("tx-checksumming: off"), "{offload}");
    assert_eq!(taken.renamed, "eth0~");
    assert_eq!(
        taken.addresses,
        vec![format!("{}/24", vm.ip(2)).parse().expect("cidr")]
    );
    assert!(vm.peer_ping(&vm.ip(2)));
    // The VM's stack answers once: through the bridge, not also straight off eth0~.
    let burst = vm
        .peer
        .run(&["ping", "-c", "10", "-i", "0.02", "-W", "1", &vm.ip(2)]);
    let burst = burst.expect("ping burst after the takeover");
    assert!(!burst.contains("DUP!"), "duplicated replies: {burst}");
    assert!(
        vm.vm_ping("198.51.100.1"),
        "the default route through the internal port"
    );
}

/// The peer's replies never stopped for as long as `MAX_GAP`.
fn assert_interruption_bounded(what: &str, report: &PingReport) {
    assert!(
        report.longest_gap < MAX_GAP,
        "{what}: the peer got no reply for {:?} ({report})",
        report.longest_gap
    );
}

#[test]
fn takeover_keeps_the_vm_reachable_and_restore_gives_it_back() {
    let vm = vm();
    let before = vm.snapshot();
    let mac = vm.vm(&["cat", "/sys/class/net/eth0/address"]);

    let ip: Ipv4Addr = vm.ip(2).parse().expect("ip");
    let counted = sluice_uplink::announcements();
    let garps = ArpWatch::start(vm.peer.name(), ip).expect("ARP capture");
    let ping = vm.start_ping();
    wait_train_running(&ping);
    let started = Instant::now();
    let taken = take_over(&vm, BRIDGE).expect("takeover");
    let took = started.elapsed();
    let report = stop_ping(ping);
    println!("takeover took {took:?}; ping every {PING_INTERVAL:?} from the peer: {report}");
    assert_interruption_bounded("takeover", &report);
    let mac_bytes = taken.mac;
    assert_eq!(
        garps.stop(),
        [mac_bytes],
        "one gratuitous ARP, from the VM's MAC"
    );
    let after = sluice_uplink::announcements();
    // The counters are process-wide and the other tests of this binary announce too, in
    // parallel: at least this one is counted, and none failed (the capture above proves once).
    assert!(
        after.sent > counted.sent && after.failed == counted.failed,
        "announced, without a failure: {counted:?} -> {after:?}"
    );

    assert_taken_over(&vm, &taken, &mac);
    assert!(
        tcp_works(&vm),
        "TCP from the peer to the VM through the bridge"
    );

    // Again: a no-op returning the same; after a restart: the same from OVSDB.
    let during = vm.snapshot();
    assert_eq!(take_over(&vm, BRIDGE).expect("second takeover"), taken);
    assert_eq!(vm.snapshot(), during);
    assert_eq!(recover(&vm), Some(taken));

    let garps = ArpWatch::start(vm.peer.name(), ip).expect("ARP capture");
    let ping = vm.start_ping();
    wait_train_running(&ping);
    restore(&vm).expect("restore");
    let report = stop_ping(ping);
    println!("restore: ping every {PING_INTERVAL:?} from the peer: {report}");
    assert_interruption_bounded("restore", &report);
    assert_eq!(garps.stop(), [mac_bytes], "the restore announces too");
    assert_eq!(
        vm.snapshot(),
        before,
        "restore must give back the VM as it was"
    );
    assert_eq!(
        vm.ovs
            .ovs_vsctl(&["list-ports", BRIDGE])
            .expect("ports")
            .trim(),
        ""
    );
    assert!(vm.peer_ping(&vm.ip(2)));
    assert!(vm.vm_ping("198.51.100.1"));
    restore(&vm).expect("restoring twice is fine");
    assert_eq!(recover(&vm), None);
}

/// The peer's neighbour entry for `ip`: `ip neigh` output, e.g. `10.1.2.2 lladdr 02:.. STALE`.
fn peer_neighbour(vm: &Vm, ip: &str) -> String {
    let args = ["ip", "neigh", "show", ip, "dev", &vm.peer_dev];
    vm.peer
        .run(&args)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// What the announcement is for, shown on the kernel's own neighbour table: a peer holding an
/// entry for each of the VM's addresses (here with a wrong MAC, so that the change is visible)
/// takes the announced MAC at once, for IPv4 from the gratuitous ARP and for IPv6 from the
/// unsolicited advertisement's override flag; without them it would keep the entry it has.
#[test]
fn the_announcement_updates_the_neighbours_entries() {
    let vm = vm();
    let (vm_v6, peer_v6) = ("fd00:5a::2", "fd00:5a::1");
    vm.vm(&[
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{vm_v6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    let peer_addr = [
        "ip",
        "-6",
        "addr",
        "add",
        &format!("{peer_v6}/64"),
        "dev",
        &vm.peer_dev,
        "nodad",
    ];
    vm.peer.run(&peer_addr).expect("peer IPv6");
    let wrong = "02:00:00:00:00:99";
    let ips = [vm.ip(2), vm_v6.to_string()];
    for ip in &ips {
        let args = [
            "ip",
            "neigh",
            "replace",
            ip,
            "lladdr",
            wrong,
            "dev",
            &vm.peer_dev,
            "nud",
            "stale",
        ];
        vm.peer.run(&args).expect("a stale entry");
        assert!(peer_neighbour(&vm, ip).contains(wrong));
    }
    let mac = vm.vm(&["cat", "/sys/class/net/eth0/address"]);
    let mac_bytes = sluice_uplink::record::parse_mac(mac.trim()).expect("MAC");
    let addresses = ips.iter().map(|ip| ip.parse().expect("ip")).collect();
    let step = Step {
        name: "announce".into(),
        op: Op::Announce {
            link: "eth0".into(),
            mac: mac_bytes,
            addresses,
        },
        undo: vec![],
    };
    let counted = sluice_uplink::announcements();
    let socket = vm.ovs.db_socket();
    in_netns(vm.ovs.netns(), move || {
        run(async move {
            let mut ovsdb = OvsdbClient::connect(socket, Duration::from_secs(10))
                .await
                .expect("OVSDB");
            let mut host = NetlinkHost::new(&mut ovsdb).expect("netlink");
            sluice_uplink::execute(&mut host, &[step]).await
        })
    })
    .expect("thread in the VM namespace")
    .expect("announce");
    assert_eq!(sluice_uplink::announcements().sent, counted.sent + 1);
    for ip in &ips {
        let ok = wait_until(Duration::from_secs(2), || {
            peer_neighbour(&vm, ip).contains(mac.trim())
        });
        assert!(ok, "the peer kept {}", peer_neighbour(&vm, ip));
    }
}
