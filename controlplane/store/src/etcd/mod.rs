//! The etcd v3 backend: the [`Store`] trait mapped one to one onto etcd.
//!
//! A key's `mod_revision` is etcd's, so `resourceVersion`s are etcd revisions as in
//! kube-apiserver; etcd's revisions start at 1 (its empty initial state) and, in a cluster
//! shared with other users, also move with their writes. Writes are etcd transactions whose
//! compares carry the preconditions, lists are etcd ranges at a revision, watches are etcd
//! watches with `prev_kv` and progress notifications, and compaction is etcd's.
//!
//! Each member has a client of its own (see `members.rs`): a request that fails for a reason of
//! its member's goes to the next member within the request's deadline, and a write whose
//! outcome that failure left unknown is checked by its next attempt rather than applied twice
//! (see `writes.rs`); a watch whose member fails resumes on the next from its last revision.
//!
//! etcd does not report its compaction point; [`EtcdStore`] finds it by probing which
//! revisions can still be read (see [`Shared::compact_revision`]), which keeps compaction free
//! of extra writes and so leaves revisions exactly as etcd numbers them.

mod convert;
mod keys;
mod members;
mod retry;
mod watch;
mod writes;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_client::{ConnectOptions, GetOptions, TxnOpResponse};

use self::convert::{etcd_revision, failure, key_value, revision, Failure};
use self::keys::Namespace;
pub use self::members::{EtcdOp, EtcdStats};
use self::members::{Member, Members};
use self::retry::Attempts;
use crate::error::StoreError;
use crate::types::{KeyValue, ListPage};
use crate::{Store, WatchStream, DEFAULT_MAX_VALUE_BYTES};

/// How often an idle connection is pinged, and how long an unanswered ping may take, before
/// the connection counts as lost (kube-apiserver's values): a dead member behind a silent
/// network must not hold a watch forever.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach etcd and what to keep there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:2379`, `https://…` with TLS);
    /// requests go to one of them and move to the next when it fails.
    pub endpoints: Vec<String>,
    /// Prepended to every key, so that several stores can share a cluster: no store's prefix
    /// may be a prefix of another's.
    pub prefix: String,
    /// How long connecting to a member may take.
    pub dial_timeout: Duration,
    /// How long one request (a read, a write, opening a watch) may take, its attempts on
    /// several members included, before it fails as [`StoreError::Unavailable`]; a watch's
    /// stream itself has no deadline.
    pub request_timeout: Duration,
    /// Larger values are refused with [`StoreError::ValueTooLarge`] before reaching etcd, as
    /// by the embedded store. etcd's `--max-request-bytes` must leave room above it for the
    /// key and the request's framing.
    pub max_value_bytes: usize,
    /// TLS towards etcd, when its client URLs are `https://`.
    pub tls: Option<EtcdTls>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            prefix: "/sluice".to_owned(),
            dial_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            tls: None,
        }
    }
}

/// PEM files for TLS towards etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed the members' certificates.
    pub ca: PathBuf,
    /// A client certificate, for members that require one (`--client-cert-auth`).
    pub client: Option<EtcdClientCert>,
}

/// A client certificate and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdClientCert {
    /// The certificate (chain).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// What the store's handle and its watch streams share.
pub(crate) struct Shared {
    members: Members,
    namespace: Namespace,
    request_timeout: Duration,
    /// A revision known to be at or before etcd's compaction point (it only grows): where the
    /// search for the compaction point starts.
    compacted_at_least: AtomicU64,
}

/// The etcd [`Store`]. Cheap to share as `Arc<dyn Store>`; dropping it ends every watch's
/// stream with [`StoreError::Unavailable`], as the embedded store does.
pub struct EtcdStore {
    shared: Arc<Shared>,
    max_value_bytes: usize,
    /// Dropped with the store: watches see their receiver close and end.
    _open: tokio::sync::watch::Sender<()>,
    open: tokio::sync::watch::Receiver<()>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("namespace", &self.shared.namespace)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster and checks that it answers (within `dial_timeout` and
    /// `request_timeout`), so a wrong address or certificate fails at start-up.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        // A member without a leader refuses requests and ends its watches at once (etcd's
        // require-leader), instead of holding them until the deadline: they fail over.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.dial_timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        let connect = Members::connect(&config.endpoints, &options);
        let members = tokio::time::timeout(config.dial_timeout, connect)
            .await
            .map_err(|_| StoreError::unavailable("connecting to etcd timed out"))??;
        let shared = Shared {
            members,
            namespace: Namespace::new(&config.prefix),
            request_timeout: config.request_timeout,
            compacted_at_least: AtomicU64::new(0),
        };
        shared.current_revision().await?;
        let (sender, open) = tokio::sync::watch::channel(());
        Ok(EtcdStore {
            shared: Arc::new(shared),
            max_value_bytes: config.max_value_bytes,
            _open: sender,
            open,
        })
    }

    /// The counters of failovers and retries, for the metrics.
    pub fn stats(&self) -> Arc<EtcdStats> {
        self.shared.members.stats.clone()
    }
}

/// The client TLS settings from the PEM files of `tls`.
fn tls_options(tls: &EtcdTls) -> Result<etcd_client::TlsOptions, StoreError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|error| {
            StoreError::unavailable(format!("cannot read {}: {error}", path.display()))
        })
    };
    let mut options = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
    if let Some(client) = &tls.client {
        let identity = etcd_client::Identity::from_pem(read(&client.cert)?, read(&client.key)?);
        options = options.identity(identity);
    }
    Ok(options)
}

/// A request's answer, with what its attempts tell about it.
pub(crate) struct Answer<T> {
    pub(crate) value: T,
    /// An earlier attempt failed after it may have reached etcd: a write may have been applied
    /// by it, and a failed compare may be that write's own doing.
    pub(crate) uncertain: bool,
    /// The member that answered.
    pub(crate) member: usize,
}

impl Shared {
    /// Runs a request that is safe to send again (a read, a watch's start), on the next member
    /// after a transient failure, within the request timeout.
    async fn read<T, F, R>(&self, op: EtcdOp, request: F) -> Result<T, Failure>
    where
        F: FnMut(&Member) -> R,
        R: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run(op, request).await.map(|answer| answer.value)
    }

    /// Runs `request` on the preferred member; after a transient failure (see
    /// [`retry::transient`]) prefers the next member and tries again, until an answer, a final
    /// failure or the request timeout. The caller makes a repeated request safe (writes are
    /// compare-and-swap transactions whose failed compare [`Answer::uncertain`] explains).
    async fn run<T, F, R>(&self, op: EtcdOp, mut request: F) -> Result<Answer<T>, Failure>
    where
        F: FnMut(&Member) -> R,
        R: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempts = Attempts::new(Instant::now(), self.request_timeout, self.members.len());
        let mut uncertain = false;
        loop {
            let Some(limit) = attempts.limit(Instant::now()) else {
                return Err(self.timed_out());
            };
            let (index, member) = self.members.pick();
            let (error, timed_out) = match tokio::time::timeout(limit, request(member)).await {
                Ok(Ok(value)) => {
                    return Ok(Answer {
                        value,
                        uncertain,
                        member: index,
                    })
                }
                Ok(Err(error)) if retry::transient(&error) => {
                    (StoreError::unavailable(error), false)
                }
                Ok(Err(error)) => return Err(failure(error)),
                Err(_) => (self.timed_out_after(limit), true),
            };
            uncertain = true;
            self.members.failed(index);
            match attempts.failed(Instant::now(), timed_out) {
                Some(pause) => {
                    self.members.stats.retried(op);
                    tokio::time::sleep(pause).await;
                }
                None => return Err(Failure::Other(error)),
            }
        }
    }

    fn timed_out(&self) -> Failure {
        Failure::Other(self.timed_out_after(self.request_timeout))
    }

    fn timed_out_after(&self, limit: Duration) -> StoreError {
        StoreError::unavailable(format!("etcd did not answer within {limit:?}"))
    }

    /// The store error of a failed request at revision `requested` (0: none).
    async fn explain(&self, failure: Failure, requested: u64) -> StoreError {
        let looked_up = match failure {
            Failure::Compacted => self
                .compact_revision()
                .await
                .map(|compact_revision| StoreError::Compacted { compact_revision }),
            Failure::FutureRevision => self
                .current_revision()
                .await
                .map(|current| StoreError::FutureRevision { requested, current }),
            Failure::TooLarge => Ok(StoreError::unavailable("etcd refused a too large request")),
            Failure::Other(error) => Ok(error),
        };
        looked_up.unwrap_or_else(|error| error)
    }

    /// Reads nothing at revision `at` (0: now); returns etcd's revision then.
    async fn probe(&self, at: u64) -> Result<u64, Failure> {
        let mut options = GetOptions::new().with_count_only();
        if at > 0 {
            options = options.with_revision(etcd_revision(at));
        }
        let response = self
            .read(EtcdOp::Read, |member| {
                let mut kv = member.kv.clone();
                let (key, options) = (self.namespace.key(""), options.clone());
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        Ok(response
            .header()
            .map_or(0, |header| revision(header.revision())))
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        match self.probe(0).await {
            Ok(current) => Ok(current),
            Err(Failure::Other(error)) => Err(error),
            Err(_) => Err(StoreError::unavailable(
                "etcd refused to read its current state",
            )),
        }
    }

    /// Whether the state at `at` can still be read (`at` at most the current revision).
    async fn readable(&self, at: u64) -> Result<bool, StoreError> {
        match self.probe(at).await {
            Ok(_) | Err(Failure::FutureRevision) => Ok(true),
            Err(Failure::Compacted) => Ok(false),
            Err(Failure::TooLarge) => Err(StoreError::unavailable("etcd refused a probe")),
            Err(Failure::Other(error)) => Err(error),
        }
    }

    /// etcd's compaction point: the oldest readable revision, found by bisection between the
    /// last one known and the current revision (a few dozen empty reads at most). Reported as
    /// 0 while revision 1, etcd's empty initial state, is readable: nothing was dropped.
    async fn compact_revision(&self) -> Result<u64, StoreError> {
        let known = self.compacted_at_least.load(Ordering::Acquire);
        let current = self.current_revision().await?;
        let mut unreadable = known.max(1);
        if self.readable(unreadable).await? {
            return Ok(if unreadable == 1 { known } else { unreadable });
        }
        // Invariant: `unreadable` is compacted, `readable` is not.
        let mut readable = current;
        while readable - unreadable > 1 {
            let middle = unreadable + (readable - unreadable) / 2;
            if self.readable(middle).await? {
                readable = middle;
            } else {
                unreadable = middle;
            }
        }
        self.note_compaction(readable);
        Ok(readable)
    }

    /// Remembers that etcd is compacted at least to `revision`.
    fn note_compaction(&self, revision: u64) {
        self.compacted_at_least
            .fetch_max(revision, Ordering::AcqRel);
    }

    /// The key-value of the `index`th answer of a transaction (a read or a deletion's
    /// previous state), if it has one.
    fn first_kv(
        &self,
        responses: &[TxnOpResponse],
        index: usize,
    ) -> Result<Option<KeyValue>, StoreError> {
        let kv = match responses.get(index) {
            Some(TxnOpResponse::Get(get)) => get.kvs().first(),
            Some(TxnOpResponse::Delete(delete)) => delete.prev_kvs().first(),
            _ => None,
        };
        kv.map(|kv| key_value(&self.namespace, kv)).transpose()
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let etcd_key = self.shared.namespace.key(key);
        let read = self.shared.read(EtcdOp::Read, |member| {
            let mut kv = member.kv.clone();
            let etcd_key = etcd_key.clone();
            async move { kv.get(etcd_key, None).await }
        });
        match read.await {
            Ok(response) => response
                .kvs()
                .first()
                .map(|kv| key_value(&self.shared.namespace, kv))
                .transpose(),
            Err(failure) => Err(self.shared.explain(failure, 0).await),
        }
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        at_revision: Option<u64>,
    ) -> Result<ListPage, StoreError> {
        let (start, end) = self.shared.namespace.list_range(prefix, start_after);
        let mut options = GetOptions::new().with_range(end);
        if limit > 0 {
            options = options.with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        if let Some(at) = at_revision {
            // Revision 0 is "now" to etcd; the store's revision 0 is the empty state before
            // any write, which etcd keeps as revision 1.
            options = options.with_revision(etcd_revision(at.max(1)));
        }
        let read = self.shared.read(EtcdOp::Read, |member| {
            let mut kv = member.kv.clone();
            let (start, options) = (start.clone(), options.clone());
            async move { kv.get(start, Some(options)).await }
        });
        let response = match read.await {
            Ok(response) => response,
            Err(failure) => {
                let requested = at_revision.unwrap_or(0);
                return Err(self.shared.explain(failure, requested).await);
            }
        };
        let items = response
            .kvs()
            .iter()
            .map(|kv| key_value(&self.shared.namespace, kv))
            .collect::<Result<Vec<_>, _>>()?;
        let now = response
            .header()
            .map_or(0, |header| revision(header.revision()));
        Ok(ListPage {
            items,
            revision: at_revision.unwrap_or(now),
            more: response.more(),
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError> {
        self.create_key(key, value).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        self.update_key(key, value, expected_mod_revision).await
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        self.delete_key(key, expected_mod_revision).await
    }

    fn watch(&self, prefix: &str, after_revision: u64) -> WatchStream {
        watch::stream(
            self.shared.clone(),
            self.open.clone(),
            prefix,
            after_revision,
        )
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.shared.current_revision().await
    }

    async fn compact_revision(&self) -> Result<u64, StoreError> {
        self.shared.compact_revision().await
    }

    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        if revision == 0 || revision <= self.shared.compacted_at_least.load(Ordering::Acquire) {
            return Ok(());
        }
        // Compacting twice to one revision is harmless: etcd refuses the second as compacted.
        let compact = self.shared.read(EtcdOp::Write, |member| {
            let mut kv = member.kv.clone();
            async move { kv.compact(etcd_revision(revision), None).await }
        });
        match compact.await {
            Ok(_) => {
                self.shared.note_compaction(revision);
                Ok(())
            }
            // At or before the compaction point: nothing to do, as for the embedded store. It
            // is still news to this client, which bisection cannot find when `revision` is 1:
            // compacted at 1 reads the same as never compacted.
            Err(Failure::Compacted) => {
                self.shared.note_compaction(revision);
                Ok(())
            }
            Err(failure) => Err(self.shared.explain(failure, revision).await),
        }
    }
}
