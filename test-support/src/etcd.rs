use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::wait_until;

/// How often the members send progress notifications to idle watches: short, so tests of
/// progress reports need not wait etcd's default 10 minutes.
pub const ETCD_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// etcd's request limit in the fixtures: etcd's default (1.5 MiB) plus room for the key and
/// framing, so a value at the store's limit (etcd's default) fits in one request.
const MAX_REQUEST_BYTES: usize = 1536 * 1024 + 64 * 1024;

/// Whether the `etcd` binary can run here. Tests without it fail in CI and skip loudly
/// elsewhere: use [`etcd_or_skip`].
pub fn etcd_installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// How CI gets etcd, for the message of a test that finds it missing.
const ETCD_PROVIDED_BY: &str = "scripts/test.sh installs it: apt-get install etcd-server";

/// `true` when etcd is installed. When it is not: under `CI`, panics naming it
/// ([`crate::prerequisite`]); elsewhere says loudly that `test` did not run and returns `false`,
/// so the test returns at once.
#[must_use = "the test must return when etcd is missing"]
pub fn etcd_or_skip(test: &str) -> bool {
    crate::prerequisite::prerequisite_of(test, "etcd", etcd_installed(), ETCD_PROVIDED_BY)
}

/// Certificate files for etcd members whose client URLs speak TLS only and require a client
/// certificate signed by `ca` (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct EtcdTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A single real `etcd` member for one test, on free loopback ports in its own temporary
/// directory, killed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    pub fn start() -> std::io::Result<Self> {
        Ok(Self {
            cluster: EtcdCluster::start(1)?,
        })
    }

    /// A member whose client URL is `https://` and requires a client certificate.
    pub fn start_tls(tls: EtcdTlsFiles) -> std::io::Result<Self> {
        Ok(Self {
            cluster: EtcdCluster::start_with(1, Some(tls), None)?,
        })
    }

    /// A member whose backend refuses writes (NOSPACE) past `bytes` (`--quota-backend-bytes`),
    /// for the tests of what a full etcd means to the store and the API.
    pub fn start_with_quota(bytes: u64) -> std::io::Result<Self> {
        Ok(Self {
            cluster: EtcdCluster::start_with(1, None, Some(bytes))?,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), the member's client URL.
    pub fn endpoint(&self) -> String {
        self.cluster.endpoint(0)
    }

    pub fn dir(&self) -> &Path {
        self.cluster.dir()
    }
}

/// A cluster of real `etcd` members on loopback (`--initial-cluster`), each with its own data
/// directory, killed on drop; one member can be killed and restarted on its data.
///
/// Ports are chosen free and then handed to etcd, which another process may take in between:
/// a member that cannot bind exits at once, and the whole cluster is started again on new
/// ports (a member's peers must know its port from the start).
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    tls: Option<EtcdTlsFiles>,
    /// `--quota-backend-bytes`, when not etcd's default.
    quota_backend_bytes: Option<u64>,
}

#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    /// Plain HTTP `/health` and `/metrics`, whatever the client URL speaks.
    metrics: SocketAddr,
    child: Option<Child>,
}

/// Distinguishes the clusters of one test process (`--initial-cluster-token`).
static CLUSTERS: AtomicU64 = AtomicU64::new(0);

impl EtcdCluster {
    /// Starts `size` members and waits until every one reports healthy (a leader is elected).
    pub fn start(size: usize) -> std::io::Result<Self> {
        Self::start_with(size, None, None)
    }

    fn start_with(
        size: usize,
        tls: Option<EtcdTlsFiles>,
        quota_backend_bytes: Option<u64>,
    ) -> std::io::Result<Self> {
        let mut last_error = None;
        for _ in 0..5 {
            match Self::try_start(size, tls.clone(), quota_backend_bytes) {
                Ok(cluster) => return Ok(cluster),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| std::io::Error::other("etcd did not start")))
    }

    fn try_start(
        size: usize,
        tls: Option<EtcdTlsFiles>,
        quota_backend_bytes: Option<u64>,
    ) -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        // Hold every listener until all ports are chosen, so no two members get the same one.
        let listeners = (0..size * 3)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        let ports = listeners
            .iter()
            .map(|listener| listener.local_addr())
            .collect::<std::io::Result<Vec<_>>>()?;
        drop(listeners);
        let members = (0..size)
            .map(|index| Member {
                name: format!("m{index}"),
                client: ports[index * 3],
                peer: ports[index * 3 + 1],
                metrics: ports[index * 3 + 2],
                child: None,
            })
            .collect();
        let mut cluster = Self {
            members,
            dir,
            tls,
            quota_backend_bytes,
        };
        let token = format!(
            "sluice-test-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        for index in 0..size {
            cluster.spawn(index, &token)?;
        }
        for index in 0..size {
            cluster.wait_healthy(index)?;
        }
        Ok(cluster)
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|index| self.endpoint(index))
            .collect()
    }

    /// Member `index`'s client URL.
    pub fn endpoint(&self, index: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.members[index].client)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills member `index` at once (SIGKILL, as a crash), keeping its data directory.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its data directory and ports, and waits until it is
    /// healthy (back in the cluster).
    pub fn restart(&mut self, index: usize) -> std::io::Result<()> {
        self.kill(index);
        // The cluster token only matters for a new member; a restarted one reads its data.
        self.spawn(index, "restart")?;
        self.wait_healthy(index)
    }

    /// The member that is the leader now (`etcd_server_is_leader 1` on its metrics URL), if
    /// one answers so.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&index| {
            self.members[index].child.is_some()
                && get(self.members[index].metrics, "/metrics").is_ok_and(|body| {
                    body.lines()
                        .any(|line| line.trim() == "etcd_server_is_leader 1")
                })
        })
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}=http://{}", member.name, member.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    fn spawn(&mut self, index: usize, token: &str) -> std::io::Result<()> {
        let initial_cluster = self.initial_cluster();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(index))?;
        let client = self.endpoint(index);
        let member = &self.members[index];
        let peer = format!("http://{}", member.peer);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        if let Some(bytes) = self.quota_backend_bytes {
            command.args(["--quota-backend-bytes", &bytes.to_string()]);
        }
        let child = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", token])
            .args([
                "--listen-metrics-urls",
                &format!("http://{}", member.metrics),
            ])
            .args(["--initial-cluster-state", "new"])
            // Fast elections: a killed leader is replaced within a second.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--max-request-bytes", &MAX_REQUEST_BYTES.to_string()])
            .arg(format!(
                "--experimental-watch-progress-notify-interval={}ms",
                ETCD_PROGRESS_INTERVAL.as_millis()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| {
                std::io::Error::other(format!(
                    "cannot run etcd (apt-get install etcd-server): {error}"
                ))
            })?;
        self.members[index].child = Some(child);
        Ok(())
    }

    /// Waits until member `index` answers `/health` with a leader, or fails with its log when
    /// it exits (a port was taken) or never gets there.
    fn wait_healthy(&mut self, index: usize) -> std::io::Result<()> {
        let address = self.members[index].metrics;
        let mut exited = false;
        let healthy = wait_until(Duration::from_secs(30), || {
            exited = self.members[index]
                .child
                .as_mut()
                .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
            exited || health(address).is_ok_and(|body| body.contains("\"health\":\"true\""))
        });
        if healthy && !exited {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.log_path(index)).unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        Err(std::io::Error::other(format!(
            "etcd member {index} did not become healthy:\n{tail}"
        )))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

/// `GET /health` over plain HTTP/1.0 on a member's metrics URL; the raw answer.
fn health(address: SocketAddr) -> std::io::Result<String> {
    get(address, "/health")
}

/// `GET path` over plain HTTP/1.0 on a member's metrics URL; the raw answer.
fn get(address: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
