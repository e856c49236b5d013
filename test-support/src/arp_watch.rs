//! Watching a namespace's wire for gratuitous ARPs of one address, from a packet socket: the
//! proof that a VM announced that its address moved (see `vm-datapath/uplink/src/announce.rs`).

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use crate::in_netns;

/// Gratuitous ARPs (sender IP = target IP) of one address seen in a namespace while it runs.
#[derive(Debug)]
pub struct ArpWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<[u8; 6]>>,
}

impl ArpWatch {
    /// Starts watching in `netns`; returns once the capture socket is open.
    pub fn start(netns: &str, ip: Ipv4Addr) -> std::io::Result<ArpWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, listening) = mpsc::channel();
        let netns = netns.to_string();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            in_netns(&netns, move || capture_garps(ip, &stopping, &ready)).expect("peer thread")
        });
        listening
            .recv()
            .map_err(|_| std::io::Error::other("the ARP capture did not start"))?;
        Ok(ArpWatch { stop, thread })
    }

    /// The sender MACs of the gratuitous ARPs seen.
    pub fn stop(self) -> Vec<[u8; 6]> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("capture thread")
    }
}

fn capture_garps(ip: Ipv4Addr, stop: &AtomicBool, ready: &mpsc::Sender<()>) -> Vec<[u8; 6]> {
    const ETH_P_ARP: u16 = 0x0806;
    // SAFETY: socket(2) with constant arguments, checked; OwnedFd closes it.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(ETH_P_ARP.to_be()),
        )
    };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: SO_RCVTIMEO reads a timeval that lives across the call.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::addr_of!(timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
    ready.send(()).expect("the test waits");
    let mut senders = Vec::new();
    let mut frame = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: recv(2) into a buffer of the length given.
        let n = unsafe { libc::recv(socket.as_raw_fd(), frame.as_mut_ptr().cast(), 64, 0) };
        let arp = &frame[14..42];
        if n >= 42 && arp[14..18] == ip.octets() && arp[24..28] == ip.octets() {
            senders.push(arp[8..14].try_into().expect("6 bytes"));
        }
    }
    senders
}
