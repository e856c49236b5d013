//! The etcd v3 backend: the [`Store`] trait mapped one to one onto etcd.
//!
//! A key's `mod_revision` is etcd's, so `resourceVersion`s are etcd revisions as in
//! kube-apiserver; etcd's revisions start at 1 (its empty initial state) and, in a cluster
//! shared with other users, also move with their writes. Writes are etcd transactions whose
//! compares carry the preconditions, lists are etcd ranges at a revision, watches are etcd
//! watches with `prev_kv` and progress notifications, and compaction is etcd's.
//!
//! etcd does not report its compaction point; [`EtcdStore`] finds it by probing which
//! revisions can still be read (see [`Shared::compact_revision`]), which keeps compaction free
//! of extra writes and so leaves revisions exactly as etcd numbers them.

mod convert;
mod keys;
mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchClient,
};

use self::convert::{etcd_revision, failure, key_value, revision, Failure};
use self::keys::Namespace;
use crate::checks::check_write;
use crate::error::StoreError;
use crate::types::{KeyValue, ListPage};
use crate::{Store, WatchStream, DEFAULT_MAX_VALUE_BYTES};

/// How often an idle connection is pinged, and how long an unanswered ping may take, before
/// the connection counts as lost (kube-apiserver's values): a dead member behind a silent
/// network must not hold a watch forever.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response accepted: a list without a limit or a watch catching up may carry
/// many values of up to etcd's request size each (kube-apiserver lifts gRPC's 4 MiB too).
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

/// How to reach etcd and what to keep there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`http://host:2379`, `https://…` with TLS); the
    /// client balances over them and moves to another when one fails.
    pub endpoints: Vec<String>,
    /// Prepended to every key, so that several stores can share a cluster: no store's prefix
    /// may be a prefix of another's.
    pub prefix: String,
    /// How long connecting to a member may take.
    pub dial_timeout: Duration,
    /// How long one request (a read, a write, opening a watch) may take before it fails as
    /// [`StoreError::Unavailable`]; a watch's stream itself has no deadline.
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
    kv: KvClient,
    watch: WatchClient,
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
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.dial_timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        let connect = etcd_client::Client::connect(&config.endpoints, Some(options));
        let client = tokio::time::timeout(config.dial_timeout, connect)
            .await
            .map_err(|_| StoreError::unavailable("connecting to etcd timed out"))?
            .map_err(StoreError::unavailable)?;
        let shared = Shared {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            watch: client
                .watch_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
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

    /// Runs one transaction on `key`; `value_len` explains etcd's size refusal.
    async fn txn(&self, txn: Txn, value_len: usize) -> Result<TxnResponse, StoreError> {
        let mut kv = self.shared.kv.clone();
        match self.shared.call(kv.txn(txn)).await {
            Ok(response) => Ok(response),
            Err(Failure::TooLarge) => Err(StoreError::ValueTooLarge {
                size: value_len,
                max: self.max_value_bytes,
            }),
            Err(other) => Err(self.shared.explain(other, 0).await),
        }
    }

    /// A conditional update or delete: `then` runs when `key` exists (with mod_revision
    /// `expected` when given), else the key's state is read to say why not.
    async fn conditional(
        &self,
        key: &str,
        expected: Option<u64>,
        then: Vec<TxnOp>,
        value_len: usize,
    ) -> Result<TxnResponse, StoreError> {
        let etcd_key = self.shared.namespace.key(key);
        // Version 0 means absent; without this compare a missing key would match an
        // expected mod_revision of 0 and be created by an update.
        let mut compares = vec![Compare::version(etcd_key.clone(), CompareOp::Greater, 0)];
        if let Some(expected) = expected {
            let expected = etcd_revision(expected);
            compares.push(Compare::mod_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                expected,
            ));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(then)
            .or_else(vec![TxnOp::get(etcd_key, None)]);
        let response = self.txn(txn, value_len).await?;
        if response.succeeded() {
            return Ok(response);
        }
        match self.shared.first_kv(&response.op_responses(), 0)? {
            None => Err(StoreError::NotFound {
                key: key.to_owned(),
            }),
            Some(current) => Err(StoreError::Conflict {
                current: Box::new(current),
            }),
        }
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

/// Reads are tried this many times when etcd is unavailable: with a member down, the client's
/// balancer still picks it for some requests (etcd-client issue 39), and a read is safe to
/// send again. Writes are not retried: one that reached etcd before the error would apply twice.
const READ_ATTEMPTS: u32 = 4;
const READ_RETRY_PAUSE: Duration = Duration::from_millis(50);

impl Shared {
    /// Runs a read, again on an unavailable etcd (see [`READ_ATTEMPTS`]).
    async fn read<T, F, R>(&self, mut request: F) -> Result<T, Failure>
    where
        F: FnMut() -> R,
        R: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 1;
        loop {
            match self.call(request()).await {
                Err(Failure::Other(StoreError::Unavailable { .. })) if attempt < READ_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(READ_RETRY_PAUSE).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Runs one request with the request timeout.
    async fn call<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(answer) => answer.map_err(failure),
            Err(_) => Err(Failure::Other(StoreError::unavailable(format!(
                "etcd did not answer within {:?}",
                self.request_timeout
            )))),
        }
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
            .read(|| {
                let mut kv = self.kv.clone();
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

/// The revision a transaction committed at.
fn header_revision(response: &TxnResponse) -> Result<u64, StoreError> {
    response
        .header()
        .map(|header| revision(header.revision()))
        .ok_or(StoreError::Corrupt {
            revision: 0,
            reason: "etcd answered a transaction without a header",
        })
}

/// The state a successful write reported, which etcd's answer must carry.
fn required(kv: Option<KeyValue>) -> Result<KeyValue, StoreError> {
    kv.ok_or(StoreError::Corrupt {
        revision: 0,
        reason: "etcd's answer to a write lacks the key's state",
    })
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let etcd_key = self.shared.namespace.key(key);
        let read = self.shared.read(|| {
            let mut kv = self.shared.kv.clone();
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
        let read = self.shared.read(|| {
            let mut kv = self.shared.kv.clone();
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
        check_write(key, Some(&value), self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(etcd_key, value.to_vec(), None)]);
        let response = self.txn(txn, value.len()).await?;
        if !response.succeeded() {
            return Err(StoreError::AlreadyExists {
                key: key.to_owned(),
            });
        }
        let revision = header_revision(&response)?;
        Ok(KeyValue {
            key: key.to_owned(),
            value,
            create_revision: revision,
            mod_revision: revision,
            version: 1,
        })
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        check_write(key, Some(&value), self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        // The new state's revisions are read back in the same transaction, without the value
        // (the caller has it).
        let then = vec![
            TxnOp::put(etcd_key.clone(), value.to_vec(), None),
            TxnOp::get(etcd_key, Some(GetOptions::new().with_keys_only())),
        ];
        let length = value.len();
        let response = self
            .conditional(key, expected_mod_revision, then, length)
            .await?;
        let written = required(self.shared.first_kv(&response.op_responses(), 1)?)?;
        Ok(KeyValue { value, ..written })
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        check_write(key, None, self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        let then = vec![TxnOp::delete(
            etcd_key,
            Some(DeleteOptions::new().with_prev_key()),
        )];
        let response = self
            .conditional(key, expected_mod_revision, then, 0)
            .await?;
        required(self.shared.first_kv(&response.op_responses(), 0)?)
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
        let mut kv = self.shared.kv.clone();
        match self
            .shared
            .call(kv.compact(etcd_revision(revision), None))
            .await
        {
            Ok(_) => {
                self.shared.note_compaction(revision);
                Ok(())
            }
            // At or before the compaction point: nothing to do, as for the embedded store.
            Err(Failure::Compacted) => Ok(()),
            Err(failure) => Err(self.shared.explain(failure, revision).await),
        }
    }
}
