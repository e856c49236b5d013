//! The control plane as vm1 sees it: a TCP forwarder listening on 127.0.0.1:6443 *inside*
//! vm1's namespace and copying each connection to the control plane's real address on the
//! host's loopback.
//!
//! Why a forwarder rather than a route: the control plane's generated serving certificate names
//! 127.0.0.1 (and localhost), and the demo keeps its listener on the host's loopback. The agent
//! inside vm1 has its own loopback and no path to the host at all (vm1's only link goes to vm2),
//! so the one address it can dial and verify is 127.0.0.1 in its own namespace. A socket's
//! namespace is fixed when it is created, so one thread enters vm1's namespace just to create
//! the listening socket; the tokio runtime that accepts on it and dials the control plane stays
//! in the host's namespace.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::sync::{oneshot, Semaphore};

/// Where the agent inside vm1 finds the control plane.
pub const VM_SIDE: &str = "127.0.0.1:6443";
/// At most this many forwarded connections at once (the agent needs a handful: its watches
/// and runtime-info reports); more wait to be accepted.
const MAX_CONNECTIONS: usize = 32;

/// The running forwarder; stopped (listener closed, connections cut) on drop.
#[derive(Debug)]
pub struct Forwarder {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Binds `address` in the network namespace `/run/netns/<netns>` from a short-lived thread
/// (setns changes only the calling thread, which ends right after).
fn bind_in_netns(netns: &str, address: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let path = format!("/run/netns/{netns}");
    let thread = std::thread::Builder::new()
        .name("sluice-up-vm-bind".into())
        .spawn(move || -> anyhow::Result<std::net::TcpListener> {
            let namespace =
                std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            // SAFETY: setns(2) with a valid descriptor of a network namespace file; it moves
            // only this thread, which creates one socket and ends.
            if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error()).context("setns into vm1");
            }
            let listener = std::net::TcpListener::bind(address)
                .with_context(|| format!("binding {address} in {path}"))?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .context("spawning the namespace thread")?;
    match thread.join() {
        Ok(result) => result,
        Err(_) => bail!("the namespace thread panicked"),
    }
}

impl Forwarder {
    /// Listens on [`VM_SIDE`] inside `netns` and forwards to `target`.
    pub fn start(netns: &str, target: SocketAddr) -> anyhow::Result<Self> {
        let vm_side: SocketAddr = VM_SIDE.parse().context("the forwarder's address")?;
        let listener = bind_in_netns(netns, vm_side)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("the forwarder's runtime")?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("sluice-up-vm-forward".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            eprintln!("sluice up: the VM demo's forwarder cannot start: {error}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = stopped => {}
                        () = accept_loop(listener, target) => {}
                    }
                });
                // Dropping the runtime here cancels the connections still being copied.
            })
            .context("spawning the forwarder thread")?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, target: SocketAddr) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((mut inbound, _)) = listener.accept().await else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
            drop(slot);
        });
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
