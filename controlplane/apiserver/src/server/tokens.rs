//! The tokens the server accepts follow the `Token` objects in the store: every replica over
//! one etcd accepts a token as soon as any replica (or `token create`) stored it, and stops
//! accepting a deleted one as soon as its watch sees the deletion.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use sluice_apimachinery::meta::prepare_create;
use sluice_apimachinery::{KindSpec, StatusError};
use sluice_store::{Store, StoreError};
use tokio::sync::watch as signal;

use super::keys::{list_prefix, object_key};
use super::objects::{decode, encode};
use super::{stopped, ApiServer};
use crate::auth::{IssuedToken, TokenBook, TokenRecord};
use crate::kinds::{token, token_identity};

/// The kind tokens are stored as.
pub const TOKEN_KIND: &str = "Token";

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
                let identity = decode(row).ok().as_ref().and_then(token_identity);
                if let Some((sha256, identity)) = identity {
                    records.push(TokenRecord { sha256, identity });
                }
            }
            if !page.more {
                break page.revision;
            }
        };
        let (book, unusable) = TokenBook::new(records);
        if !unusable.is_empty() {
            tracing::warn!(
                count = unusable.len(),
                "stored tokens with an unusable digest were skipped"
            );
        }
        let book = Arc::new(book.at_revision(revision));
        self.tokens.rcu(|current| TokenBook::newer(current, &book));
        self.metrics.tokens.set(self.tokens.load().len() as i64);
        Ok(revision)
    }

    /// Keeps the book equal to the stored tokens until `stop`.
    pub async fn follow_tokens(self: Arc<Self>, mut stop: signal::Receiver<bool>) {
        let prefix = list_prefix(&token(), None);
        loop {
            let followed = async {
                let revision = self.load_tokens().await?;
                let mut changes = self.store.watch(&prefix, revision);
                while let Some(batch) = changes.next().await {
                    if !batch?.events.is_empty() {
                        self.load_tokens().await?;
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
