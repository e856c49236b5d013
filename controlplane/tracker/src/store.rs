//! Redis access: one hash per agent, one field per node, values carrying their own expiry.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::Pipeline;
use tokio::sync::Mutex;

use crate::{now_unix_ms, AgentId, NodeEntry, TrackerError, TrackerMetrics, TrackerOptions};

/// Writes (one agent's or one record's) pipelined in one round trip to a single Redis: enough
/// to take thousands of agents back per second, few enough that a lookup queued behind them
/// waits one short round trip.
const WRITES_PER_ROUND_TRIP: usize = 500;
/// Agents' connection hashes read in one round trip by a listing.
const LIST_BATCH: usize = 16;

/// Where Redis is.
#[derive(Debug, Clone)]
pub enum RedisTarget {
    /// `redis://[user[:password]@]host:port[/db]`, `rediss://...` (TLS) or `unix:///path`.
    Single {
        url: String,
        /// CA for `rediss://` (else the system roots).
        ca_file: Option<PathBuf>,
    },
    /// Redis Cluster seed nodes.
    Cluster { urls: Vec<String> },
}

impl RedisTarget {
    pub(crate) fn single_client(&self) -> Result<redis::Client, TrackerError> {
        match self {
            RedisTarget::Single { url, ca_file } => match ca_file {
                Some(ca) => {
                    let root_cert = std::fs::read(ca).map_err(|error| {
                        TrackerError::Redis(format!("{}: {error}", ca.display()))
                    })?;
                    Ok(redis::Client::build_with_tls(
                        url.as_str(),
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(root_cert),
                        },
                    )?)
                }
                None => Ok(redis::Client::open(url.as_str())?),
            },
            // Pub/sub in a cluster works through any one node (PUBLISH is broadcast).
            RedisTarget::Cluster { urls } => Ok(redis::Client::open(
                urls.first()
                    .map(String::as_str)
                    .unwrap_or("redis://127.0.0.1"),
            )?),
        }
    }
}

enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

pub(crate) struct Store {
    target: RedisTarget,
    options: TrackerOptions,
    metrics: TrackerMetrics,
    connection: Mutex<Option<Connection>>,
    /// The agents index as a listing's first page read it, sorted: its later pages reuse it
    /// (see [`INDEX_KEPT`]).
    index: std::sync::Mutex<Option<(Instant, Arc<[AgentId]>)>>,
}

/// How long a listing's later pages reuse the index its first page read. Each page used to read
/// the whole index (SMEMBERS, then a sort): at 100,000 agents a full listing of 500-record pages
/// read and sorted it 200 times. A page that reuses it misses only agents whose first record
/// was written meanwhile, as a listing could already miss agents arriving between its pages.
const INDEX_KEPT: std::time::Duration = std::time::Duration::from_secs(5);

/// The hash of one agent. The agent id is in braces so that, in a cluster, all of an agent's
/// keys hash to one slot.
pub(crate) fn agent_key(prefix: &str, agent: AgentId) -> String {
    format!("{prefix}:tunnel:agent:{{{agent}}}")
}

/// Connection records of one agent: field `<node>/<connection id>`.
pub(crate) fn connections_key(prefix: &str, agent: AgentId) -> String {
    format!("{prefix}:tunnel:conns:{{{agent}}}")
}

/// Every agent id that has (or had) connection records, for cluster-wide listing.
pub(crate) fn agents_index_key(prefix: &str) -> String {
    format!("{prefix}:tunnel:agents")
}

pub(crate) fn arrivals_channel(prefix: &str) -> String {
    format!("{prefix}:tunnel:arrivals")
}

pub fn parse_entry(node: String, value: &str) -> Option<NodeEntry> {
    let (expires, address) = value.split_once('|')?;
    Some(NodeEntry {
        node,
        private_address: address.to_string(),
        expires_at_unix_ms: expires.parse().ok()?,
    })
}

/// One unexpired connection record: field `<node>/<connection id>`, value
/// `<expires ms>|<since ms>|<version>`; anything else is skipped.
fn parse_record(
    agent: AgentId,
    field: &str,
    value: &str,
    now: u64,
) -> Option<crate::ConnectionRecord> {
    let (node, connection) = field.rsplit_once('/')?;
    let mut parts = value.splitn(3, '|');
    let expires = parts.next()?.parse::<u64>().ok()?;
    let since_unix_ms = parts.next()?.parse::<i64>().ok()?;
    let version = parts.next()?;
    let connection_id = connection.parse::<i64>().ok()?;
    if expires <= now {
        return None;
    }
    Some(crate::ConnectionRecord {
        agent,
        connection_id,
        version: version.to_string(),
        node: node.to_string(),
        since_unix_ms,
    })
}

impl Store {
    pub(crate) fn new(
        target: RedisTarget,
        options: TrackerOptions,
        metrics: TrackerMetrics,
    ) -> Self {
        Self {
            target,
            options,
            metrics,
            connection: Mutex::new(None),
            index: std::sync::Mutex::new(None),
        }
    }

    async fn connect(&self) -> Result<Connection, TrackerError> {
        Ok(match &self.target {
            RedisTarget::Single { .. } => {
                let client = self.target.single_client()?;
                // Fail fast while Redis is away: the tracker retries on its own schedule and the
                // data plane must not wait long for a lookup.
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_number_of_retries(1)
                    .set_max_delay(std::time::Duration::from_millis(500))
                    .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
                    .set_response_timeout(Some(std::time::Duration::from_secs(2)));
                Connection::Single(ConnectionManager::new_with_config(client, config).await?)
            }
            RedisTarget::Cluster { urls } => {
                let client = redis::cluster::ClusterClient::new(urls.clone())?;
                Connection::Cluster(client.get_async_connection().await?)
            }
        })
    }

    /// Runs a pipeline (a MULTI/EXEC when atomic), connecting first if needed; a failed call
    /// drops the connection so the next one reconnects.
    async fn run<T: redis::FromRedisValue>(
        &self,
        pipeline: &Pipeline,
        is_write: bool,
    ) -> Result<T, TrackerError> {
        let started = Instant::now();
        let mut guard = self.connection.lock().await;
        if guard.is_none() {
            match self.connect().await {
                Ok(connection) => *guard = Some(connection),
                Err(error) => {
                    self.metrics.errors.inc(0);
                    return Err(error);
                }
            }
        }
        let result = match guard.as_mut() {
            Some(Connection::Single(connection)) => pipeline.query_async(connection).await,
            Some(Connection::Cluster(connection)) => pipeline.query_async(connection).await,
            None => return Err(TrackerError::Stopped),
        };
        self.metrics
            .round_trip
            .observe(0, started.elapsed().as_secs_f64());
        match result {
            Ok(value) => {
                if is_write {
                    self.metrics.writes.inc(0);
                } else {
                    self.metrics.reads.inc(0);
                }
                Ok(value)
            }
            Err(error) => {
                self.metrics.errors.inc(0);
                if matches!(self.target, RedisTarget::Cluster { .. })
                    || error.is_connection_dropped()
                    || error.is_io_error()
                {
                    *guard = None;
                }
                Err(error.into())
            }
        }
    }

    fn value(&self) -> String {
        let expires = now_unix_ms() + self.options.ttl.as_millis() as u64;
        format!("{expires}|{}", self.options.private_address)
    }

    /// Writes (or refreshes) this node's field for each agent: HSET + PEXPIRE in one MULTI/EXEC
    /// per agent, all pipelined; then announces the arrivals.
    pub(crate) async fn register(&self, agents: &[AgentId]) -> Result<(), TrackerError> {
        if agents.is_empty() {
            return Ok(());
        }
        let value = self.value();
        let ttl_ms = self.options.ttl.as_millis() as i64;
        let channel = arrivals_channel(&self.options.key_prefix);
        if self.is_cluster() {
            // A cluster routes a transaction to one slot's master: one per agent.
            for agent in agents {
                let key = agent_key(&self.options.key_prefix, *agent);
                let mut transaction = redis::pipe();
                transaction
                    .atomic()
                    .hset(&key, &self.options.node_name, &value)
                    .ignore()
                    .pexpire(&key, ttl_ms)
                    .ignore();
                self.run::<()>(&transaction, true).await?;
                let mut announce = redis::pipe();
                announce.publish(&channel, agent.to_string()).ignore();
                self.run::<()>(&announce, true).await?;
            }
            return Ok(());
        }
        for chunk in agents.chunks(WRITES_PER_ROUND_TRIP) {
            let mut pipeline = redis::pipe();
            for agent in chunk {
                let key = agent_key(&self.options.key_prefix, *agent);
                // One transaction per agent, all pipelined in one round trip.
                pipeline
                    .cmd("MULTI")
                    .ignore()
                    .hset(&key, &self.options.node_name, &value)
                    .ignore()
                    .pexpire(&key, ttl_ms)
                    .ignore()
                    .cmd("EXEC")
                    .ignore();
            }
            for agent in chunk {
                pipeline.publish(&channel, agent.to_string()).ignore();
            }
            self.run::<()>(&pipeline, true).await?;
        }
        Ok(())
    }

    fn is_cluster(&self) -> bool {
        matches!(self.target, RedisTarget::Cluster { .. })
    }

    /// Removes this node's field for each agent.
    pub(crate) async fn unregister(&self, agents: &[AgentId]) -> Result<(), TrackerError> {
        if agents.is_empty() {
            return Ok(());
        }
        // In a cluster each key may live on another master: one request per agent.
        let per_request = if self.is_cluster() {
            1
        } else {
            WRITES_PER_ROUND_TRIP
        };
        for chunk in agents.chunks(per_request) {
            let mut pipeline = redis::pipe();
            for agent in chunk {
                pipeline
                    .hdel(
                        agent_key(&self.options.key_prefix, *agent),
                        &self.options.node_name,
                    )
                    .ignore();
            }
            self.run::<()>(&pipeline, true).await?;
        }
        Ok(())
    }

    /// Writes connection records (HSET + PEXPIRE per agent key in one transaction, then the
    /// agent into the index set).
    pub(crate) async fn write_connections(
        &self,
        records: &[crate::ConnectionRecord],
    ) -> Result<(), TrackerError> {
        let ttl_ms = self.options.ttl.as_millis() as i64;
        let expires = now_unix_ms() + self.options.ttl.as_millis() as u64;
        let index = agents_index_key(&self.options.key_prefix);
        let fields = |record: &crate::ConnectionRecord| {
            let key = connections_key(&self.options.key_prefix, record.agent);
            let field = format!("{}/{}", self.options.node_name, record.connection_id);
            let value = format!("{expires}|{}|{}", record.since_unix_ms, record.version);
            (key, field, value)
        };
        if self.is_cluster() {
            // A cluster routes a transaction to one slot's master: one per record, and the
            // index (another slot) apart.
            for record in records {
                let mut transaction = redis::pipe();
                let (key, field, value) = fields(record);
                transaction
                    .atomic()
                    .hset(&key, field, value)
                    .ignore()
                    .pexpire(&key, ttl_ms)
                    .ignore();
                self.run::<()>(&transaction, true).await?;
                let mut add = redis::pipe();
                add.sadd(&index, record.agent).ignore();
                self.run::<()>(&add, true).await?;
            }
            return Ok(());
        }
        // One transaction per record, a chunk of them pipelined in one round trip: a node
        // restarting takes its agents back in batches, not one round trip each (issue 36).
        for chunk in records.chunks(WRITES_PER_ROUND_TRIP) {
            let mut pipeline = redis::pipe();
            for record in chunk {
                let (key, field, value) = fields(record);
                pipeline
                    .cmd("MULTI")
                    .ignore()
                    .hset(&key, field, value)
                    .ignore()
                    .pexpire(&key, ttl_ms)
                    .ignore()
                    .cmd("EXEC")
                    .ignore()
                    .sadd(&index, record.agent)
                    .ignore();
            }
            self.run::<()>(&pipeline, true).await?;
        }
        Ok(())
    }

    /// Removes this node's records of the given (agent, connection id) pairs.
    pub(crate) async fn remove_connections(
        &self,
        connections: &[(AgentId, i64)],
    ) -> Result<(), TrackerError> {
        // A cluster takes a pipeline whose keys are in different slots only one at a time.
        let per_round_trip = if self.is_cluster() {
            1
        } else {
            WRITES_PER_ROUND_TRIP
        };
        for chunk in connections.chunks(per_round_trip) {
            let mut pipeline = redis::pipe();
            for (agent, connection_id) in chunk {
                pipeline
                    .hdel(
                        connections_key(&self.options.key_prefix, *agent),
                        format!("{}/{connection_id}", self.options.node_name),
                    )
                    .ignore();
            }
            self.run::<()>(&pipeline, true).await?;
        }
        Ok(())
    }

    /// Up to `limit` unexpired connection records in the cluster, in the order of
    /// (agent, node, connection id), after `after`. Agents' hashes are read [`LIST_BATCH`] to a
    /// round trip (one on a Redis Cluster, where they lie in different slots) and the reading stops once the page is full, so a listing holds one page and
    /// at most that many agents' hashes (each bounded by nodes x
    /// `tunnel.max_connections_per_agent`), never every record; a page of 500 agents is about
    /// 32 round trips, not 500. Agents left with no record are dropped from the index.
    pub(crate) async fn list_connections(
        &self,
        after: Option<&crate::ConnectionKey>,
        limit: usize,
    ) -> Result<Vec<crate::ConnectionRecord>, TrackerError> {
        let index = agents_index_key(&self.options.key_prefix);
        let agents = self.sorted_index(&index, after.is_none()).await?;
        let first = after.map_or(AgentId::MIN, |after| after.agent);
        let from = agents.partition_point(|agent| *agent < first);
        let now = now_unix_ms();
        let mut records = Vec::new();
        // A cluster takes a pipeline whose keys are in different slots only one at a time.
        let per_round_trip = if self.is_cluster() { 1 } else { LIST_BATCH };
        let mut next = from;
        while records.len() < limit && next < agents.len() {
            // An agent in the index has a record or is dropped from it: reading more agents
            // than records are still wanted would read hashes the page has no room for.
            let take = per_round_trip
                .min(limit - records.len())
                .min(agents.len() - next);
            let batch = &agents[next..next + take];
            next += take;
            let mut read = redis::pipe();
            for agent in batch {
                read.hgetall(connections_key(&self.options.key_prefix, *agent));
            }
            let hashes: Vec<Vec<(String, String)>> = self.run(&read, false).await?;
            let mut emptied = redis::pipe();
            let mut any_emptied = false;
            for (agent, fields) in batch.iter().zip(hashes) {
                let mut of_agent: Vec<crate::ConnectionRecord> = fields
                    .iter()
                    .filter_map(|(field, value)| parse_record(*agent, field, value, now))
                    .collect();
                if of_agent.is_empty() {
                    emptied.srem(&index, *agent).ignore();
                    any_emptied = true;
                    continue;
                }
                of_agent.retain(|record| record.is_after(after));
                of_agent.sort_by_key(crate::ConnectionRecord::key);
                let room = limit.saturating_sub(records.len());
                records.extend(of_agent.into_iter().take(room));
            }
            if any_emptied {
                self.run::<()>(&emptied, true).await?;
            }
        }
        Ok(records)
    }

    /// The agents index, sorted: read from Redis for a listing's first page (`fresh`), else
    /// the one read last if it is at most [`INDEX_KEPT`] old.
    async fn sorted_index(&self, index: &str, fresh: bool) -> Result<Arc<[AgentId]>, TrackerError> {
        let kept = || {
            self.index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        if !fresh {
            if let Some((read_at, agents)) = kept() {
                if read_at.elapsed() < INDEX_KEPT {
                    return Ok(agents);
                }
            }
        }
        let read_at = Instant::now();
        let mut members = redis::pipe();
        members.smembers(index);
        let (mut agents,): (Vec<AgentId>,) = self.run(&members, false).await?;
        agents.sort_unstable();
        let agents: Arc<[AgentId]> = agents.into();
        let mut kept = self
            .index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Two listings starting together: the later read is kept, whichever answer came last.
        if kept.as_ref().is_none_or(|(kept_at, _)| *kept_at < read_at) {
            *kept = Some((read_at, agents.clone()));
        }
        Ok(agents)
    }

    /// Unexpired nodes of an agent.
    pub(crate) async fn lookup(&self, agent: AgentId) -> Result<Vec<NodeEntry>, TrackerError> {
        let mut pipeline = redis::pipe();
        pipeline.hgetall(agent_key(&self.options.key_prefix, agent));
        let (fields,): (Vec<(String, String)>,) = self.run(&pipeline, false).await?;
        let now = now_unix_ms();
        let mut entries: Vec<NodeEntry> = fields
            .into_iter()
            .filter_map(|(node, value)| parse_entry(node, &value))
            .filter(|entry| entry.expires_at_unix_ms > now)
            .collect();
        entries.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(entries)
    }

    /// Removes expired fields (of any node, e.g. one that was killed) from the hashes of the
    /// agents this node holds, as kas' GC does for the keys it knows. Each removal is a
    /// compare-and-delete script (delete only if the value is still the expired one), so a field
    /// its node refreshed in the meantime is kept; unlike WATCH it works the same in a cluster.
    /// Returns how many fields were removed.
    pub(crate) async fn collect_garbage(&self, agents: &[AgentId]) -> Result<usize, TrackerError> {
        const COMPARE_AND_DELETE: &str =
            "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0";
        let mut removed = 0;
        let now = now_unix_ms();
        for agent in agents {
            let key = agent_key(&self.options.key_prefix, *agent);
            let mut read = redis::pipe();
            read.hgetall(&key);
            let (fields,): (Vec<(String, String)>,) = self.run(&read, false).await?;
            for (node, value) in fields {
                let expired = parse_entry(node.clone(), &value)
                    .is_none_or(|entry| entry.expires_at_unix_ms <= now);
                if !expired {
                    continue;
                }
                let mut delete = redis::pipe();
                delete
                    .cmd("EVAL")
                    .arg(COMPARE_AND_DELETE)
                    .arg(1)
                    .arg(&key)
                    .arg(&node)
                    .arg(&value);
                let (count,): (usize,) = self.run(&delete, true).await?;
                removed += count;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_put_the_agent_in_a_hash_tag() {
        assert_eq!(agent_key("sluice", 7), "sluice:tunnel:agent:{7}");
        assert_eq!(arrivals_channel("p"), "p:tunnel:arrivals");
    }

    #[test]
    fn entries_parse_or_are_skipped() {
        assert_eq!(
            parse_entry("a".into(), "123|10.0.0.1:8155"),
            Some(NodeEntry {
                node: "a".into(),
                private_address: "10.0.0.1:8155".into(),
                expires_at_unix_ms: 123
            })
        );
        assert_eq!(parse_entry("a".into(), "garbage"), None);
        assert_eq!(parse_entry("a".into(), "x|y"), None);
    }

    #[test]
    fn records_parse_unexpired_or_are_skipped() {
        let record = parse_record(7, "node-a/42", "200|100|v1|x", 150).unwrap();
        assert_eq!(
            (
                record.node.as_str(),
                record.connection_id,
                record.version.as_str()
            ),
            ("node-a", 42, "v1|x")
        );
        assert_eq!(record.since_unix_ms, 100);
        assert!(
            parse_record(7, "node-a/42", "200|100|v1", 250).is_none(),
            "expired"
        );
        assert!(parse_record(7, "node-a", "200|100|v1", 150).is_none());
        assert!(parse_record(7, "node-a/x", "200|100|v1", 150).is_none());
        assert!(parse_record(7, "node-a/1", "200|v1", 150).is_none());
    }
}
