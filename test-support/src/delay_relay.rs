//! A userspace stand-in for `tc netem delay D loss P`: packets the hub routes to a TUN device are
//! read by a thread, dropped with probability P or held for D, and written back to the same TUN,
//! from where the kernel forwards them on. Real packets, real TCP retransmits and real RTTs; the
//! relay exists because the kernels here are built without `sch_netem`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Packets held at most at once; past it the relay drops (as a full netem queue does).
const MAX_HELD: usize = 10_000;
/// How long the relay sleeps in poll(2) at most, to notice its stop flag.
const POLL_MS: i32 = 5;

/// Counts of what the relay did, for a test's report.
#[derive(Debug, Default)]
pub struct RelayCounts {
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
}

/// The relay thread; stopped and joined on drop (the TUN device goes with its file).
#[derive(Debug)]
pub struct DelayRelay {
    stop: Arc<AtomicBool>,
    counts: Arc<RelayCounts>,
    thread: Option<JoinHandle<()>>,
}

impl DelayRelay {
    /// Creates TUN device `device` in namespace `netns` and relays through it. The device is
    /// down until the caller sets it up (and routes to it).
    pub fn start(netns: &str, device: &str, delay: Duration, loss: f64) -> std::io::Result<Self> {
        let netns_file = File::open(format!("/run/netns/{netns}"))?;
        let device = device.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(RelayCounts::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (thread_stop, thread_counts) = (stop.clone(), counts.clone());
        let thread = std::thread::spawn(move || {
            // SAFETY: setns(2) on an open namespace file; it moves only this thread.
            if unsafe { libc::setns(netns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let _ = ready_tx.send(Err(std::io::Error::last_os_error()));
                return;
            }
            let tun = match open_tun(&device) {
                Ok(tun) => tun,
                Err(error) => {
                    let _ = ready_tx.send(Err(error));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            relay(tun, delay, loss, &thread_stop, &thread_counts);
        });
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the relay thread died"))??;
        Ok(Self {
            stop,
            counts,
            thread: Some(thread),
        })
    }

    /// Packets forwarded after their delay, and packets dropped, so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counts.forwarded.load(Ordering::Relaxed),
            self.counts.dropped.load(Ordering::Relaxed),
        )
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens `/dev/net/tun` as a layer-3 device without packet information (each read is one IP
/// packet). The device belongs to the namespace of the calling thread.
fn open_tun(device: &str) -> std::io::Result<File> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // struct ifreq: the name (16 bytes) and then a union whose first member is the flags.
    let mut request = [0u8; 40];
    let name = device.as_bytes();
    if name.len() >= 16 {
        return Err(std::io::Error::other(format!(
            "device name {device} too long"
        )));
    }
    request[..name.len()].copy_from_slice(name);
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as u16;
    request[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, for which `request` has room (40 bytes).
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, request.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Non-blocking: the loop polls with a timeout and must also send held packets on time.
    // SAFETY: fcntl on our own open descriptor.
    unsafe {
        let status = libc::fcntl(tun.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(tun.as_raw_fd(), libc::F_SETFL, status | libc::O_NONBLOCK);
    }
    Ok(tun)
}

/// Reads packets, drops or holds them, writes them back when due; until `stop`.
fn relay(mut tun: File, delay: Duration, loss: f64, stop: &AtomicBool, counts: &RelayCounts) {
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut random = Xorshift::seeded();
    let mut buffer = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // One delay for every packet: due times rise in arrival order, so the front is next.
        while held.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, packet)) = held.pop_front() {
                let _ = tun.write(&packet);
                counts.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
        let wait_ms = held.front().map_or(POLL_MS, |(due, _)| {
            let until = due.saturating_duration_since(now).as_millis();
            i32::try_from(until).unwrap_or(POLL_MS).clamp(0, POLL_MS)
        });
        let mut poll = libc::pollfd {
            fd: tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for an open descriptor.
        if unsafe { libc::poll(&mut poll, 1, wait_ms) } <= 0 {
            continue;
        }
        while let Ok(read) = tun.read(&mut buffer) {
            if read == 0 {
                break;
            }
            if random.chance(loss) || held.len() >= MAX_HELD {
                counts.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            held.push_back((Instant::now() + delay, buffer[..read].to_vec()));
        }
    }
}

/// A small PRNG for the loss decision (xorshift64*): no crate needed, seeded from the clock.
struct Xorshift(u64);

impl Xorshift {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |since| since.as_nanos() as u64);
        Self(nanos | 1)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let value = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (value as f64 / (1u64 << 53) as f64) < p
    }
}

#[cfg(test)]
mod tests {
    use super::Xorshift;

    #[test]
    fn the_loss_decision_drops_about_the_asked_share() {
        let mut random = Xorshift::seeded();
        let drops = (0..100_000).filter(|_| random.chance(0.05)).count();
        assert!((4_000..6_000).contains(&drops), "{drops} of 100000");
        assert!(!(0..1000).any(|_| random.chance(0.0)));
        assert!((0..1000).all(|_| random.chance(1.0)));
    }
}
