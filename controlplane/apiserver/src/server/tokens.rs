//! The tokens the server accepts follow the `Token` objects in the store: every replica over
//! one etcd accepts a token as soon as any replica (or `token create`) stored it, and stops
//! accepting a deleted one as soon as its watch sees the deletion.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use sluice_apimachinery::meta::prepare_create;
use sluice_apimachinery::{KindSpec, StatusError};
use sluice_store::{Event, KeyValue, Store, StoreError};
use tokio::sync::watch as signal;

use super::keys::{list_prefix, object_key};
use super::objects::{decode, encode};
use super::{stopped, ApiServer};
use crate::auth::{IssuedToken, TokenBook, TokenChange, TokenRecord};
use crate::kinds::{token, token_identity};

/// The kind tokens are stored as.
pub const TOKEN_KIND: &str = "Token";

/// The token a stored Token object holds, if it decodes to one.
fn token_record(stored: &KeyValue) -> Option<TokenRecord> {
    let (sha256, identity) = token_identity(&decode(stored).ok()?)?;
    Some(TokenRecord { sha256, identity })
}

fn token_change(event: &Event) -> TokenChange {
    match event {
        Event::Put { kv, .. } => TokenChange::Put {
            key: kv.key.clone(),
            revision: kv.mod_revision,
            record: token_record(kv),
        },
        Event::Delete { prev, revision } => TokenChange::Delete {
            key: prev.key.clone(),
            revision: *revision,
        },
    }
}

fn warn_unusable(unusable: &[TokenRecord]) {
    if !unusable.is_empty() {
        tracing::warn!(
            count = unusable.len(),
            "stored tokens with an unusable digest were skipped"
        );
    }
}

/// Pause before following the tokens again after the store failed.
const RETRY: Duration = Duration::from_secs(1);

/// Creates an object directly in the store, with the API's metadata rules and validation (for
/// what a control plane writes itself: its first admin token, `sluice up`'s demo objects).
pub async fn create_object(
    store: &dyn Store,
    spec: &KindSpec,
    object: serde_json::Value,
) -> Result<serde_json::Value, StatusError> {
    let mut random = [0u8; 16];
    getrandom::getrandom(&mut random)
        .map_err(|error| StatusError::internal(format!("no random bytes for a uid: {error}")))?;
    let object = prepare_create(spec, object, None, SystemTime::now(), &hex::encode(random))?;
    let name = sluice_apimachinery::meta::object_name(&object).to_string();
    let stored = store
        .create(&object_key(spec, None, &name), encode(&object))
        .await
        .map_err(|error| super::objects::store_status(spec, &name, error))?;
    decode(&stored)
}

/// Stores an issued token as a `Token` object named `name` (its text is never stored).
pub async fn store_token(
    store: &dyn Store,
    name: &str,
    issued: &IssuedToken,
) -> Result<(), StatusError> {
    let spec = token();
    let object = serde_json::json!({
        "apiVersion": spec.api_version(),
        "kind": spec.kind,
        "metadata": {"name": name},
        "spec": {
            "role": issued.record.identity.role.as_str(),
            "subject": issued.record.identity.subject,
            "tokenSha256": issued.record.sha256,
        },
    });
    create_object(store, &spec, object).await.map(|_| ())
}

impl ApiServer {
    /// Reads every stored token into the server's book; returns the revision read at.
    pub async fn load_tokens(&self) -> Result<u64, StoreError> {
        let prefix = list_prefix(&token(), None);
        let mut records = Vec::new();
        let mut cursor: Option<String> = None;
        let revision = loop {
            let page = self
                .store
                .list(&prefix, cursor.as_deref(), 1000, None)
                .await?;
            for row in &page.items {
                cursor = Some(row.key.clone());
                if let Some(record) = token_record(row) {
                    records.push((row.key.clone(), row.mod_revision, record));
                }
            }
            if !page.more {
                break page.revision;
            }
        };
        let (book, unusable) = TokenBook::stored(records);
        warn_unusable(&unusable);
        let book = Arc::new(book.at_revision(revision));
        self.tokens.rcu(|current| TokenBook::newer(current, &book));
        self.metrics.tokens.set(self.tokens.load().len() as i64);
        Ok(revision)
    }

    /// Applies a batch of the token watch to the book: only the changed objects are decoded
    /// (reading every token per change made storing T tokens cost T^2 decodes).
    fn apply_token_events(&self, events: &[Event], revision: u64) {
        let changes: Vec<TokenChange> = events.iter().map(token_change).collect();
        let mut unusable = Vec::new();
        self.tokens.rcu(|current| {
            let (book, skipped) = current.applied(&changes, revision);
            unusable = skipped;
            Arc::new(book)
        });
        warn_unusable(&unusable);
        self.metrics.tokens.set(self.tokens.load().len() as i64);
    }

    /// Read-your-write for `token create`: the created token works on this replica as soon as
    /// its create is answered, not only once the token watch has seen it (other replicas
    /// follow their watch). Skipped when the watch has already seen the create (a deletion
    /// right after it may have been applied too).
    pub(crate) fn add_created_token(&self, stored: &KeyValue) {
        let change = TokenChange::Put {
            key: stored.key.clone(),
            revision: stored.mod_revision,
            record: token_record(stored),
        };
        self.tokens.rcu(|current| {
            if current.revision() >= stored.mod_revision {
                return Arc::clone(current);
            }
            // The book's revision stays the watch's: a create is applied ahead of it only.
            let (book, _) = current.applied(std::slice::from_ref(&change), 0);
            Arc::new(book)
        });
        self.metrics.tokens.set(self.tokens.load().len() as i64);
    }

    /// Keeps the book equal to the stored tokens until `stop`.
    pub async fn follow_tokens(self: Arc<Self>, mut stop: signal::Receiver<bool>) {
        let prefix = list_prefix(&token(), None);
        loop {
            let followed = async {
                let revision = self.load_tokens().await?;
                let mut changes = self.store.watch(&prefix, revision);
                while let Some(batch) = changes.next().await {
                    let batch = batch?;
                    if !batch.events.is_empty() {
                        self.apply_token_events(&batch.events, batch.revision);
                    }
                }
                Ok::<(), StoreError>(())
            };
            tokio::select! {
                _ = stopped(&mut stop) => return,
                outcome = followed => {
                    if let Err(error) = outcome {
                        tracing::warn!(%error, "following the stored tokens failed; retrying");
                    }
                }
            }
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }
}
