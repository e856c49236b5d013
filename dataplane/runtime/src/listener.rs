use std::net::{SocketAddr, TcpListener};

use sluice_config::ListenerConfig;
use socket2::{Domain, Protocol, Socket, Type};

use crate::RuntimeError;

/// Where a listener's connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On every data-plane worker, one `SO_REUSEPORT` socket each.
    Workers,
    /// On one dedicated thread that outlives the data plane's drain (the admin endpoint, so
    /// `/readyz` and `/metrics` answer while the workers drain).
    Dedicated,
}

/// Handle to a listener declared on a `ServerBuilder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerId(pub(crate) usize);

/// Binds `count` sockets to the same address with `SO_REUSEPORT`, one per worker. The first bind
/// resolves port 0 to a real port that the others then share, so "port 0" means one ephemeral
/// port for the listener, not one per core.
pub(crate) fn bind_sockets(
    name: &str,
    config: &ListenerConfig,
    count: usize,
) -> Result<(SocketAddr, Vec<TcpListener>), RuntimeError> {
    let bind_error = |address: SocketAddr, source: std::io::Error| RuntimeError::Bind {
        listener: name.to_string(),
        address,
        source,
    };
    let mut sockets = Vec::with_capacity(count);
    let mut address = config.address;
    for _ in 0..count.max(1) {
        let socket =
            bind_one(address, config.backlog).map_err(|source| bind_error(address, source))?;
        address = socket
            .local_addr()
            .map_err(|source| bind_error(address, source))?;
        sockets.push(socket);
    }
    Ok((address, sockets))
}

fn bind_one(address: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if address.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    // monoio's epoll driver needs non-blocking sockets; its io_uring driver works with them too.
    socket.set_nonblocking(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&address.into())?;
    socket.listen(backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(address: &str) -> ListenerConfig {
        ListenerConfig {
            address: address.parse().unwrap(),
            backlog: 64,
            max_connections_per_worker: 10,
            limits: sluice_config::ConnectionLimits {
                header_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(1),
                ..Default::default()
            },
            tls: None,
        }
    }

    #[test]
    fn port_zero_resolves_once_and_is_shared() {
        let (address, sockets) = bind_sockets("test", &config("127.0.0.1:0"), 3).unwrap();
        assert_ne!(address.port(), 0);
        assert_eq!(sockets.len(), 3);
        for socket in &sockets {
            assert_eq!(socket.local_addr().unwrap(), address);
        }
    }

    #[test]
    fn a_port_held_without_reuseport_fails_with_the_listener_name() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = holder.local_addr().unwrap().to_string();
        let error = bind_sockets("admin", &config(&taken), 2).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("cannot bind listener admin to {taken}")),
            "{message}"
        );
    }
}
