//! Fixtures of the counters' tests: namespaces joined by a veth pair, traffic, hook listings.

use std::fs::File;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use aya::programs::{SchedClassifier, TcAttachType};
use sluice_ebpf::AttachMode;

pub const A_ADDR: &str = "10.77.0.1";
pub const B_ADDR: &str = "10.77.0.2";

pub fn run(command: &mut Command) -> String {
    let output = command.output().expect("command runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}x{n}", std::process::id() % 0x10_0000)
}

/// A network namespace, deleted on drop (with the veth end inside it).
pub struct Netns(pub String);

impl Netns {
    pub fn new(prefix: &str) -> Self {
        let ns = Netns(unique(prefix));
        run(Command::new("ip").args(["netns", "add", &ns.0]));
        // No IPv6: no router solicitations or ND in the counts.
        // (through /proc/sys: procps's sysctl is not on every image)
        ns.exec(&[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && \
             echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
        ]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn exec(&self, args: &[&str]) -> String {
        run(Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args))
    }

    /// Runs `body` on a thread inside this namespace.
    pub fn run<T: Send>(&self, body: impl FnOnce() -> T + Send) -> T {
        run_in(&self.0, body)
    }
}

/// Runs `body` on a thread inside the namespace `name` (made by `ip netns add`).
pub fn run_in<T: Send>(name: &str, body: impl FnOnce() -> T + Send) -> T {
    {
        let file = File::open(format!("/run/netns/{name}")).expect("netns file");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: setns(2) on an open namespace file; it moves only this thread.
                    let entered = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
                    body()
                })
                .join()
                .expect("the thread in the namespace")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Namespace `a` (va, 10.77.0.1) and `b` (vb, 10.77.0.2), veth between, static ARP.
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
    pub va: String,
    pub vb: String,
}

impl Pair {
    pub fn new() -> Self {
        let (a, b) = (Netns::new("sea"), Netns::new("seb"));
        let (va, vb) = (unique("va"), unique("vb"));
        run(Command::new("ip").args([
            "link", "add", &va, "netns", &a.0, "type", "veth", "peer", "name", &vb, "netns", &b.0,
        ]));
        for (ns, dev, addr) in [(&a, &va, A_ADDR), (&b, &vb, B_ADDR)] {
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ns.exec(&["ip", "link", "set", dev, "up"]);
        }
        // Permanent neighbours: no ARP on the wire while we count.
        let mac = |ns: &Netns, dev: &str| {
            ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")])
                .trim()
                .to_string()
        };
        let (mac_a, mac_b) = (mac(&a, &va), mac(&b, &vb));
        a.exec(&[
            "ip",
            "neigh",
            "replace",
            B_ADDR,
            "lladdr",
            &mac_b,
            "dev",
            &va,
            "nud",
            "permanent",
        ]);
        b.exec(&[
            "ip",
            "neigh",
            "replace",
            A_ADDR,
            "lladdr",
            &mac_a,
            "dev",
            &vb,
            "nud",
            "permanent",
        ]);
        Pair { a, b, va, vb }
    }

    /// Names of the programs on `vb`'s (ingress, egress) hooks.
    pub fn programs_on_vb(&self, mode: AttachMode) -> (Vec<String>, Vec<String>) {
        let vb = self.vb.clone();
        match mode {
            AttachMode::Netlink => (
                self.tc_filters(&vb, "ingress"),
                self.tc_filters(&vb, "egress"),
            ),
            _ => self.b.run(move || {
                (
                    tcx_names(&vb, TcAttachType::Ingress),
                    tcx_names(&vb, TcAttachType::Egress),
                )
            }),
        }
    }

    /// BPF filters on a clsact hook, by program name (`tc filter show`). A failing `tc` or a
    /// line it cannot read panics: read as "no filters", either would pass every "released"
    /// check whatever the hook holds.
    pub fn tc_filters(&self, dev: &str, hook: &str) -> Vec<String> {
        let shown = run(Command::new("ip").args([
            "netns", "exec", &self.b.0, "tc", "filter", "show", "dev", dev, hook,
        ]));
        shown
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| {
                filter_name(line).unwrap_or_else(|| {
                    panic!(
                        "`tc filter show dev {dev} {hook}`: unreadable line {line:?} in\n{shown}"
                    )
                })
            })
            .collect()
    }
}

/// One line of `tc filter show`: `Some(None)` for a chain's header (`filter protocol all pref
/// 49152 bpf chain 0`), `Some(Some(name))` for a BPF filter (`... handle 0x1 NAME direct-action
/// ...`), `None` for anything else.
fn filter_name(line: &str) -> Option<Option<String>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    if words.first() != Some(&"filter") || !words.contains(&"bpf") {
        return None;
    }
    match words.iter().position(|word| *word == "handle") {
        None => Some(None),
        Some(handle) => words.get(handle + 2).map(|name| Some(name.to_string())),
    }
}

pub fn tcx_names(dev: &str, hook: TcAttachType) -> Vec<String> {
    let (_, programs) = SchedClassifier::query_tcx(dev, hook).expect("TCX query");
    programs
        .iter()
        .map(|info| info.name_as_str().unwrap_or("?").to_string())
        .collect()
}

/// Waits (up to 2 s) until `vb`'s hooks are free: a closed link fd is released only once no
/// process forked meanwhile (a concurrent test's `ip`/`tc`) still holds a copy of it.
pub fn released(pair: &Pair, mode: AttachMode) {
    let mut left = pair.programs_on_vb(mode);
    for _ in 0..40 {
        if left == (vec![], vec![]) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
        left = pair.programs_on_vb(mode);
    }
    panic!("programs left on the hooks: {left:?}");
}

pub fn one_each(names: (Vec<String>, Vec<String>)) {
    assert_eq!(
        names,
        (
            vec!["sluice_ingress".to_string()],
            vec!["sluice_egress".to_string()]
        ),
        "exactly one of our programs per hook"
    );
}

/// Sends `count` UDP datagrams of `size` payload bytes from `from` to `to_addr:port`, where a
/// socket bound in `to` receives them all (so they did cross).
pub fn udp(
    from: &Netns,
    from_addr: &str,
    to: &Netns,
    to_addr: &str,
    port: u16,
    count: usize,
    size: usize,
) {
    let target: SocketAddr = format!("{to_addr}:{port}").parse().expect("address");
    let receiver = to.run(move || UdpSocket::bind(target).expect("bind the receiver"));
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let source: SocketAddr = format!("{from_addr}:0").parse().expect("address");
    let sender = from.run(move || UdpSocket::bind(source).expect("bind the sender"));
    let payload = vec![0x5a; size];
    let mut buffer = vec![0; size + 1];
    for _ in 0..count {
        sender.send_to(&payload, target).expect("send");
        assert_eq!(receiver.recv(&mut buffer).expect("receive"), size);
    }
}

/// `count` TCP connections to a port nothing listens on: each is one SYN, answered by a RST.
pub fn refused_connections(from: &Netns, to_addr: &str, port: u16, count: usize) {
    let target: SocketAddr = format!("{to_addr}:{port}").parse().expect("address");
    from.run(move || {
        for _ in 0..count {
            let error = TcpStream::connect_timeout(&target, Duration::from_secs(5))
                .expect_err("nothing listens");
            assert_eq!(error.kind(), ErrorKind::ConnectionRefused);
        }
    });
}

/// Sends one raw Ethernet frame out of `dev` (AF_PACKET), from the calling thread's namespace.
pub fn send_frame(dev: &str, frame: &[u8]) {
    let name = std::ffi::CString::new(dev).expect("name");
    // SAFETY: plain socket(2)/bind(2)/send(2) on a zeroed sockaddr_ll and a live buffer; the fd
    // is closed before returning.
    unsafe {
        let ifindex = libc::if_nametoindex(name.as_ptr());
        assert_ne!(ifindex, 0, "no {dev}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let mut address: libc::sockaddr_ll = std::mem::zeroed();
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_ifindex = ifindex as i32;
        let bound = libc::bind(
            fd,
            &address as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        let sent = libc::send(fd, frame.as_ptr() as *const libc::c_void, frame.len(), 0);
        libc::close(fd);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        assert_eq!(sent, frame.len() as isize);
    }
}
