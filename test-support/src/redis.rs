use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_until;

/// A real `redis-server` for one test: no persistence, loopback TCP on a free port plus a unix
/// socket, killed and its directory removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    dir: tempfile::TempDir,
    pub address: SocketAddr,
    pub socket: PathBuf,
    /// With TLS, the TCP port speaks only TLS (the unix socket stays plain for the test's own
    /// commands).
    tls: Option<RedisTls>,
}

/// Certificate files for a `redis-server` that serves TLS.
#[derive(Debug, Clone)]
pub struct RedisTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl RedisServer {
    /// Starts `redis-server` from `PATH`, retrying with another port if the chosen one was taken
    /// between choosing and binding.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(None)
    }

    /// Starts `redis-server` with its TCP port speaking TLS only (`rediss://`).
    pub fn start_tls(tls: RedisTls) -> std::io::Result<Self> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<RedisTls>) -> std::io::Result<Self> {
        let mut last_error = None;
        for _ in 0..5 {
            match Self::try_start(tls.clone()) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
    }

    fn try_start(tls: Option<RedisTls>) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        // redis-server cannot report an OS-chosen port, so pick a free one and hand it over.
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let socket = dir.path().join("redis.sock");
        let child = Self::spawn(dir.path(), port, &socket, tls.as_ref())?;
        let mut server = Self {
            child,
            dir,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            socket,
            tls,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Kills the server and starts a fresh, empty one on the same port and socket (a restart
    /// without persistence, as after a crash).
    pub fn restart(&mut self) -> std::io::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        self.child = Self::spawn(
            self.dir.path(),
            self.address.port(),
            &self.socket,
            self.tls.as_ref(),
        )?;
        self.wait_ready()
    }

    /// Stops the server (until `restart`).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn wait_ready(&mut self) -> std::io::Result<()> {
        let ready = wait_until(Duration::from_secs(10), || {
            matches!(self.child.try_wait(), Ok(None)) && self.ping().is_ok()
        });
        if ready {
            Ok(())
        } else {
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            let _ = self.child.kill();
            Err(std::io::Error::other(format!(
                "redis-server did not become ready: {log}"
            )))
        }
    }

    fn spawn(
        dir: &Path,
        port: u16,
        socket: &Path,
        tls: Option<&RedisTls>,
    ) -> std::io::Result<Child> {
        let log = dir.join("redis.log");
        let mut command = Command::new("redis-server");
        match tls {
            None => {
                command.args(["--port", &port.to_string()]);
            }
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        command
            .args(["--bind", "127.0.0.1"])
            .arg("--unixsocket")
            .arg(socket)
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| {
                std::io::Error::other(format!(
                    "cannot run redis-server (apt install redis-server): {error}"
                ))
            })
    }

    /// `PING` over the unix socket; `Ok` when the answer is `+PONG`.
    pub fn ping(&self) -> std::io::Result<()> {
        let reply = self.command(&["PING"])?;
        if reply.starts_with("+PONG") {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "unexpected PING reply {reply:?}"
            )))
        }
    }

    /// Sends one command (RESP array of bulk strings) over the unix socket and returns the raw
    /// reply text. Enough for tests to inspect keys; Sluice itself uses the `redis` crate.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut buffer = [0u8; 64 * 1024];
        let read = stream.read(&mut buffer)?;
        Ok(String::from_utf8_lossy(&buffer[..read]).into_owned())
    }

    /// How many times the server has run `command` (from `INFO commandstats`), e.g. "hset".
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.command(&["INFO", "commandstats"]).unwrap_or_default();
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://` when the server speaks TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}", self.address)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three masters (no replicas) made of real `redis-server` processes and
/// joined with `redis-cli --cluster create`, killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
    pub addresses: Vec<SocketAddr>,
}

impl RedisCluster {
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut children = Vec::new();
        let mut addresses = Vec::new();
        let mut attempts = 0;
        while addresses.len() < 3 && attempts < 50 {
            attempts += 1;
            let index = addresses.len();
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            // The cluster bus listens on port + 10000: keep it below 65536.
            if port > 55_000 {
                continue;
            }
            let node_dir = dir.path().join(format!("node-{index}"));
            std::fs::create_dir_all(&node_dir)?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&node_dir)
                .arg("--logfile")
                .arg(node_dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            children.push(child);
            addresses.push(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        let mut cluster = Self {
            children,
            _dir: dir,
            addresses,
        };
        if cluster.addresses.len() < 3 {
            return Err(std::io::Error::other(
                "could not find three ports for the cluster",
            ));
        }
        let ready = wait_until(Duration::from_secs(10), || {
            cluster
                .addresses
                .iter()
                .all(|address| std::net::TcpStream::connect(address).is_ok())
        });
        if !ready {
            return Err(std::io::Error::other("cluster nodes did not start"));
        }
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(cluster.addresses.iter().map(ToString::to_string))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()?;
        if !output.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            )));
        }
        let first = cluster.addresses[0].port().to_string();
        let ok = wait_until(Duration::from_secs(20), || {
            Command::new("redis-cli")
                .args(["-p", &first, "cluster", "info"])
                .output()
                .is_ok_and(|output| {
                    String::from_utf8_lossy(&output.stdout).contains("cluster_state:ok")
                })
        });
        if !ok {
            cluster.children.iter_mut().for_each(|child| {
                let _ = child.kill();
            });
            return Err(std::io::Error::other(
                "the cluster did not reach cluster_state:ok",
            ));
        }
        Ok(cluster)
    }

    /// `redis://127.0.0.1:PORT` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.addresses
            .iter()
            .map(|address| format!("redis://{address}"))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
