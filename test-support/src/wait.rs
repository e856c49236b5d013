use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Polls `condition` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until something accepts TCP connections on `address`.
pub fn wait_for_tcp(address: SocketAddr, timeout: Duration) -> bool {
    wait_until(timeout, || {
        TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
    })
}
