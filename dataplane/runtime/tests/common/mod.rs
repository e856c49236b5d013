//! A line-oriented test service and helpers shared by the runtime's integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use sluice_config::ListenerConfig;
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, Driver, DriverSelection, HandlerFactory, Lifecycle,
    RuntimeOptions, ServerBuilder, TcpStream as MonoioStream, WorkerContext,
};

pub const DRIVERS: [Driver; 2] = [Driver::IoUring, Driver::Legacy];

/// Answers each line `ping` with `pong from worker N`, `slow` after a pause, and panics on `panic`.
/// Like a real protocol handler it closes an idle connection when its listener starts draining.
#[derive(Debug, Clone, Default)]
pub struct LineService {
    pub slow: Duration,
    /// Counts `slow` requests that have begun, so tests can signal a stop while one is surely
    /// in flight.
    pub slow_started: Arc<AtomicUsize>,
}

impl LineService {
    pub fn new(slow: Duration) -> Self {
        Self {
            slow,
            slow_started: Arc::default(),
        }
    }
}

impl HandlerFactory for LineService {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(self.clone())
    }
}

impl ConnectionHandler for LineService {
    fn handle(
        self: Rc<Self>,
        mut stream: MonoioStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let mut pending = Vec::new();
            loop {
                let (read, buffer) = monoio::select! {
                    read = stream.read(Vec::with_capacity(256)) => read,
                    _ = conn.draining() => return,
                };
                match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => pending.extend_from_slice(&buffer),
                }
                while let Some(end) = pending.iter().position(|byte| *byte == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let reply = match &line[..line.len() - 1] {
                        b"slow" => {
                            self.slow_started.fetch_add(1, Ordering::SeqCst);
                            monoio::time::sleep(self.slow).await;
                            "done\n".to_string()
                        }
                        b"panic" => panic!("requested panic"),
                        _ => format!("pong from worker {}\n", conn.worker()),
                    };
                    let (written, _) = stream.write_all(reply.into_bytes()).await;
                    if written.is_err() {
                        return;
                    }
                    conn.request_served();
                    if conn.is_draining() {
                        return;
                    }
                }
            }
        })
    }
}

pub fn listener(address: &str) -> ListenerConfig {
    ListenerConfig {
        address: address.parse().expect("address"),
        backlog: 1024,
        max_connections_per_worker: 1024,
        limits: sluice_config::ConnectionLimits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            ..Default::default()
        },
        tls: None,
    }
}

pub fn builder(
    driver: Driver,
    workers: usize,
    drain_timeout: Duration,
) -> (ServerBuilder, Arc<Lifecycle>) {
    let lifecycle = Arc::new(Lifecycle::new());
    let options = RuntimeOptions {
        workers,
        driver: DriverSelection {
            driver,
            fallback_reason: None,
        },
        uring_entries: 256,
        drain_timeout,
    };
    (ServerBuilder::new(options, lifecycle.clone()), lifecycle)
}

/// A blocking client connection speaking the line protocol.
pub struct LineClient {
    reader: BufReader<TcpStream>,
}

impl LineClient {
    pub fn connect(address: SocketAddr) -> std::io::Result<Self> {
        let stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    pub fn send(&mut self, line: &str) -> std::io::Result<()> {
        self.reader
            .get_mut()
            .write_all(format!("{line}\n").as_bytes())
    }

    pub fn receive(&mut self) -> std::io::Result<String> {
        let mut reply = String::new();
        self.reader.read_line(&mut reply)?;
        Ok(reply)
    }

    pub fn call(&mut self, line: &str) -> std::io::Result<String> {
        self.send(line)?;
        self.receive()
    }
}
