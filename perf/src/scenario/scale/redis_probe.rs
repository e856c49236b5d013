//! What the agents part reads from Redis: `INFO` figures and the tracker's entries, over a
//! plain RESP connection (no client library: a few commands, pipelined), and a 3-master Redis
//! Cluster of its own for the cluster layout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::process::{free_port, wait_until, Managed};

/// Largest reply line or bulk string read (an `INFO` answer is a few KiB).
const MAX_REPLY_BYTES: usize = 1 << 20;

/// Where one Redis server listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// One RESP connection.
pub struct Resp {
    reader: BufReader<Box<dyn Stream>>,
}

/// A reply; arrays are flattened away, since nothing here reads one.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Text(String),
    Nil,
    Integer(i64),
    Error(String),
    Array(usize),
}

impl Resp {
    pub fn connect(endpoint: &Endpoint) -> anyhow::Result<Self> {
        let stream: Box<dyn Stream> = match endpoint {
            Endpoint::Unix(path) => {
                let stream = UnixStream::connect(path)?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                Box::new(stream)
            }
            Endpoint::Tcp(address) => {
                let stream = TcpStream::connect_timeout(address, Duration::from_secs(2))?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                Box::new(stream)
            }
        };
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    /// Sends every command, then reads one reply per command.
    pub fn pipeline(&mut self, commands: &[Vec<String>]) -> anyhow::Result<Vec<Reply>> {
        let mut out = Vec::new();
        for command in commands {
            out.extend_from_slice(format!("*{}\r\n", command.len()).as_bytes());
            for part in command {
                out.extend_from_slice(format!("${}\r\n{part}\r\n", part.len()).as_bytes());
            }
        }
        self.reader.get_mut().write_all(&out)?;
        (0..commands.len()).map(|_| self.reply()).collect()
    }

    pub fn command(&mut self, command: &[&str]) -> anyhow::Result<Reply> {
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let mut replies = self.pipeline(&[command])?;
        replies.pop().context("no reply")
    }

    fn reply(&mut self) -> anyhow::Result<Reply> {
        let mut line = String::new();
        (&mut self.reader)
            .take(MAX_REPLY_BYTES as u64)
            .read_line(&mut line)?;
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(line.len().min(1));
        Ok(match kind {
            "+" => Reply::Text(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Integer(rest.parse()?),
            "$" => {
                let length: i64 = rest.parse()?;
                if length < 0 {
                    return Ok(Reply::Nil);
                }
                let length = usize::try_from(length)?;
                if length > MAX_REPLY_BYTES {
                    bail!("a bulk reply of {length} bytes");
                }
                let mut body = vec![0u8; length + 2];
                self.reader.read_exact(&mut body)?;
                body.truncate(length);
                Reply::Text(String::from_utf8_lossy(&body).into_owned())
            }
            "*" => {
                let count: i64 = rest.parse()?;
                let count = usize::try_from(count.max(0))?;
                // Read and drop the elements: callers here only need to know it was one.
                for _ in 0..count {
                    self.reply()?;
                }
                Reply::Array(count)
            }
            _ => bail!("unexpected RESP line {line:?}"),
        })
    }

    /// `INFO <section>` as `field -> value`.
    pub fn info(&mut self, section: &str) -> anyhow::Result<Vec<(String, String)>> {
        match self.command(&["INFO", section])? {
            Reply::Text(text) => Ok(parse_info(&text)),
            other => bail!("INFO {section}: {other:?}"),
        }
    }
}

pub fn parse_info(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

pub fn info_number(info: &[(String, String)], field: &str) -> Option<f64> {
    info.iter()
        .find(|(k, _)| k == field)
        .and_then(|(_, v)| v.parse().ok())
}

/// Summed over the servers (one, or the cluster's masters).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RedisFigures {
    pub used_memory: f64,
    pub keys: f64,
    pub commands: f64,
}

pub fn figures(endpoints: &[Endpoint]) -> anyhow::Result<RedisFigures> {
    let mut total = RedisFigures::default();
    for endpoint in endpoints {
        let mut resp = Resp::connect(endpoint)?;
        let memory = resp.info("memory")?;
        let commandstats = resp.info("commandstats")?;
        let keyspace = resp.info("keyspace")?;
        total.used_memory += info_number(&memory, "used_memory").unwrap_or(0.0);
        total.commands += tracker_commands(&commandstats);
        total.keys += keyspace
            .iter()
            .filter_map(|(_, v)| {
                v.split(',')
                    .next()?
                    .strip_prefix("keys=")?
                    .parse::<f64>()
                    .ok()
            })
            .sum::<f64>();
    }
    Ok(total)
}

/// Commands executed, but not this harness's own (HGET, INFO and CLUSTER: the tracker sends
/// none of them), so what is counted is what the nodes' trackers asked.
pub fn tracker_commands(commandstats: &[(String, String)]) -> f64 {
    commandstats
        .iter()
        .filter(|(name, _)| {
            !matches!(
                name.as_str(),
                "cmdstat_hget" | "cmdstat_info" | "cmdstat_cluster" | "cmdstat_cluster|info"
            ) && !name.starts_with("cmdstat_cluster")
        })
        .filter_map(|(_, value)| {
            value
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

/// How many of `agents` have a field of `node` in their tracker hash (written by that node:
/// every node's lookup finds them there). Every server is asked for every key; a cluster
/// master that does not own the key answers MOVED, which counts for nothing.
pub fn agents_listed(
    endpoints: &[Endpoint],
    prefix: &str,
    node: &str,
    agents: &[u64],
) -> anyhow::Result<usize> {
    let mut listed = 0;
    for endpoint in endpoints {
        let mut resp = Resp::connect(endpoint)?;
        for chunk in agents.chunks(2_000) {
            let commands: Vec<Vec<String>> = chunk
                .iter()
                .map(|agent| {
                    vec![
                        "HGET".into(),
                        format!("{prefix}:tunnel:agent:{{{agent}}}"),
                        node.to_string(),
                    ]
                })
                .collect();
            listed += resp
                .pipeline(&commands)?
                .iter()
                .filter(|reply| matches!(reply, Reply::Text(_)))
                .count();
        }
    }
    Ok(listed)
}

/// Three `redis-server` masters joined by `redis-cli --cluster create`; stopped on drop.
pub struct Cluster {
    pub processes: Vec<Managed>,
    pub addresses: Vec<SocketAddr>,
}

pub fn start_cluster(dir: &Path, cpu: &str) -> anyhow::Result<Cluster> {
    let mut processes = Vec::new();
    let mut addresses = Vec::new();
    for index in 0..3 {
        let node_dir = dir.join(format!("redis-cluster-{index}"));
        std::fs::create_dir_all(&node_dir)?;
        let (port, bus) = (free_port()?, free_port()?);
        let args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            "nodes.conf".into(),
            "--cluster-port".into(),
            bus.to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            node_dir.display().to_string(),
        ];
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        let name = format!("redis-cluster-{index}");
        let mut process = Managed::spawn(&name, cpu, dir, "redis-server", &args)?;
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        wait_until(&name, Duration::from_secs(10), || {
            process.check_alive()?;
            Ok(Resp::connect(&Endpoint::Tcp(address)).is_ok())
        })?;
        processes.push(process);
        addresses.push(address);
    }
    let output = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(addresses.iter().map(ToString::to_string))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .context("redis-cli is needed for the cluster layout")?;
    if !output.status.success() {
        bail!(
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    wait_until("cluster_state:ok", Duration::from_secs(20), || {
        Ok(addresses.iter().all(|address| {
            Resp::connect(&Endpoint::Tcp(*address))
                .and_then(|mut resp| resp.command(&["CLUSTER", "INFO"]))
                .is_ok_and(
                    |reply| matches!(reply, Reply::Text(t) if t.contains("cluster_state:ok")),
                )
        }))
    })?;
    Ok(Cluster {
        processes,
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_parse_and_comments_are_skipped() {
        let info = parse_info("# Memory\r\nused_memory:1024\r\nused_memory_human:1.00K\r\n");
        assert_eq!(info_number(&info, "used_memory"), Some(1024.0));
        assert_eq!(info_number(&info, "used_memory_human"), None);
        assert_eq!(info_number(&info, "absent"), None);
    }

    #[test]
    fn the_harness_own_commands_are_not_counted() {
        let stats = parse_info(
            "# Commandstats\r\ncmdstat_hset:calls=10,usec=5,usec_per_call=0.5\r\n\
             cmdstat_hget:calls=400,usec=9\r\ncmdstat_info:calls=7,usec=1\r\n\
             cmdstat_cluster|info:calls=3,usec=1\r\ncmdstat_exec:calls=5,usec=1\r\n",
        );
        assert_eq!(tracker_commands(&stats), 15.0);
    }
}
