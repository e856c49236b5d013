use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_until;

/// A real `redis-server` for one test: no persistence, loopback TCP on a free port plus a unix
/// socket, killed and its directory removed on drop.
///
/// The unix socket lives in the test's own directory, so nothing can take it from the test:
/// clients that speak unix sockets (Sluice's tracker does) should use [`RedisServer::unix_url`].
/// The TCP port is chosen free and then handed to redis-server, which another process may take
/// in between: start-up is retried with a new port when redis-server cannot bind it.
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
        // A port taken between choosing and binding makes redis-server exit at once (seen by
        // `wait_ready`): choose another.
        for _ in 0..10 {
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
        let mut exited = false;
        let ready = wait_until(Duration::from_secs(10), || {
            exited = !matches!(self.child.try_wait(), Ok(None));
            exited || self.ping().is_ok()
        });
        if ready && !exited {
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
        stream.write_all(resp_request(args).as_bytes())?;
        read_reply(&mut stream)
    }

    /// How many times the server has run `command` (from `INFO commandstats`), e.g. "hset".
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.command(&["INFO", "commandstats"]).unwrap_or_default();
        command_calls_in(&info, command)
    }

    /// `redis+unix:///path/to/redis.sock`: the server's own socket, which no other process can
    /// take between start and use (plain text, also for a TLS server).
    pub fn unix_url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
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
///
/// Each node needs a client port and a cluster bus port; both are chosen free and handed to
/// redis-server (`cluster-port`), which another process may take in between: a node that
/// cannot bind exits at once and is started again on new ports.
#[derive(Debug)]
pub struct RedisCluster {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
    pub addresses: Vec<SocketAddr>,
}

/// Two distinct free loopback ports (chosen by the OS, released before use).
fn two_free_ports() -> std::io::Result<(u16, u16)> {
    let first = TcpListener::bind("127.0.0.1:0")?;
    let second = TcpListener::bind("127.0.0.1:0")?;
    Ok((first.local_addr()?.port(), second.local_addr()?.port()))
}

impl RedisCluster {
    pub fn start() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut cluster = Self {
            children: Vec::new(),
            _dir: dir,
            addresses: Vec::new(),
        };
        for index in 0..3 {
            let node_dir = cluster._dir.path().join(format!("node-{index}"));
            std::fs::create_dir_all(&node_dir)?;
            let mut last_error = None;
            for _ in 0..10 {
                match Self::start_node(&node_dir) {
                    Ok((child, address)) => {
                        cluster.children.push(child);
                        cluster.addresses.push(address);
                        last_error = None;
                        break;
                    }
                    Err(error) => last_error = Some(error),
                }
            }
            if let Some(error) = last_error {
                return Err(error);
            }
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
        let ok = wait_until(Duration::from_secs(20), || {
            cluster.addresses.iter().all(|address| {
                resp_command(*address, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            })
        });
        if !ok {
            return Err(std::io::Error::other(
                "the cluster did not reach cluster_state:ok",
            ));
        }
        Ok(cluster)
    }

    /// Starts one cluster node on fresh ports and waits until it answers as itself (its
    /// `process_id`, not some other server that took the port). Fails when it exits (a port
    /// was taken) or never answers.
    fn start_node(node_dir: &Path) -> std::io::Result<(Child, SocketAddr)> {
        let (port, bus_port) = two_free_ports()?;
        let _ = std::fs::remove_file(node_dir.join("nodes.conf"));
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                &bus_port.to_string(),
            ])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(node_dir)
            .arg("--logfile")
            .arg(node_dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let own = format!("process_id:{}", child.id());
        let mut exited = false;
        let ready = wait_until(Duration::from_secs(10), || {
            exited = !matches!(child.try_wait(), Ok(None));
            exited
                || resp_command(address, &["INFO", "server"]).is_ok_and(|info| info.contains(&own))
        });
        if ready && !exited {
            Ok((child, address))
        } else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(node_dir.join("redis.log")).unwrap_or_default();
            Err(std::io::Error::other(format!(
                "redis cluster node did not start on {port}/{bus_port}: {log}"
            )))
        }
    }

    /// `redis://127.0.0.1:PORT` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.addresses
            .iter()
            .map(|address| format!("redis://{address}"))
            .collect()
    }

    /// How many times the masters together have run `command` (from `INFO commandstats`),
    /// e.g. "hgetall".
    pub fn command_calls(&self, command: &str) -> u64 {
        self.addresses
            .iter()
            .map(|address| {
                let info = resp_command(*address, &["INFO", "commandstats"]).unwrap_or_default();
                command_calls_in(&info, command)
            })
            .sum()
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

/// `calls=` of `cmdstat_<command>` in `INFO commandstats` text.
fn command_calls_in(info: &str, command: &str) -> u64 {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// One command over TCP (RESP array of bulk strings); the raw reply text.
fn resp_command(address: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(resp_request(args).as_bytes())?;
    read_reply(&mut stream)
}

fn resp_request(args: &[&str]) -> String {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    request
}

/// Reads one reply: a bulk string is read to its announced length (INFO replies can span
/// several reads), anything else is one read.
fn read_reply(stream: &mut impl Read) -> std::io::Result<String> {
    let mut reply = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    loop {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&reply);
        let Some(header_end) = text.find("\r\n") else {
            continue;
        };
        let complete = match text.strip_prefix('$') {
            Some(length) => length[..header_end - 1]
                .parse::<usize>()
                .map_or(true, |length| reply.len() >= header_end + 2 + length + 2),
            None => true,
        };
        if complete {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}
