//! A TCP load balancer for tests: each accepted connection goes to the next backend in round
//! robin that accepts a connection, and bytes are copied both ways until either side closes.
//! It stands for the L4 load balancer in front of a fleet of nodes, so an agent that lists one
//! address lands on another node when its node drains.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the balancer tries one backend before the next.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Stops and closes every relayed connection on drop.
pub struct TcpBalancer {
    address: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    backends: Vec<SocketAddr>,
    next: AtomicUsize,
    stopping: AtomicBool,
    /// Both sockets of every relayed connection, shut down on drop.
    open: Mutex<Vec<TcpStream>>,
    /// Connections relayed, per backend index.
    relayed: Mutex<Vec<usize>>,
}

impl TcpBalancer {
    /// Listens on a free loopback port in front of `backends`.
    pub fn start(backends: Vec<SocketAddr>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            relayed: Mutex::new(vec![0; backends.len()]),
            backends,
            next: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("tcp-balancer".into())
            .spawn(move || accept_loop(listener, accepting))?;
        Ok(Self {
            address,
            shared,
            acceptor: Some(acceptor),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections relayed so far to each backend (in the order given to `start`).
    pub fn relayed(&self) -> Vec<usize> {
        self.shared
            .relayed
            .lock()
            .map(|relayed| relayed.clone())
            .unwrap_or_default()
    }
}

impl Drop for TcpBalancer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes the blocking accept.
        let _ = TcpStream::connect(self.address);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(open) = self.shared.open.lock() {
            for stream in open.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let shared = shared.clone();
        // Connecting may try every backend: not on the accept thread.
        let _ = std::thread::Builder::new()
            .name("tcp-balancer-conn".into())
            .spawn(move || relay(client, &shared));
    }
}

/// The next backend in round robin that accepts, trying each once.
fn pick(shared: &Shared) -> Option<(usize, TcpStream)> {
    let count = shared.backends.len();
    let start = shared.next.fetch_add(1, Ordering::Relaxed);
    (0..count).find_map(|offset| {
        let index = (start + offset) % count;
        TcpStream::connect_timeout(&shared.backends[index], CONNECT_TIMEOUT)
            .ok()
            .map(|stream| (index, stream))
    })
}

fn relay(client: TcpStream, shared: &Shared) {
    let Some((index, backend)) = pick(shared) else {
        // No backend up: the client sees its connection closed, as behind a real balancer.
        return;
    };
    if let Ok(mut relayed) = shared.relayed.lock() {
        relayed[index] += 1;
    }
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    let (Ok(client_copy), Ok(backend_copy)) = (client.try_clone(), backend.try_clone()) else {
        return;
    };
    if let Ok(mut open) = shared.open.lock() {
        open.retain(|stream| stream.peer_addr().is_ok());
        for stream in [&client, &backend] {
            if let Ok(clone) = stream.try_clone() {
                open.push(clone);
            }
        }
    }
    let upstream = std::thread::Builder::new()
        .name("tcp-balancer-up".into())
        .spawn(move || copy(client_copy, backend_copy));
    copy(backend, client);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
}

/// Copies until EOF or an error, then passes the end on (half-close) to the other side.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                if to.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
