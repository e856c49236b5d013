//! What a VM agent reads depends on other objects than the ones it asked for: a policy is in
//! its span through the applied-to groups the policy names, an address group through the
//! policies naming it. So a VM agent's watch follows every policy object and, after each
//! change, sends the difference in what the agent may see: an object entering its span is
//! ADDED, one leaving it DELETED, even when the object itself did not change.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use sluice_apimachinery::list::{bookmark_event, error_event, WatchEventType};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::{Event, StoreError};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::keys::list_prefix;
use super::objects::{decode, store_status, without_version};
use super::visibility::Visibility;
use super::watch::{line, Watch, STORE_RETRIES, STORE_RETRY_PAUSE};
use super::ApiServer;
use crate::kinds::{applied_to_group, network_policy, SpanIndex};

/// Every policy object, by store key, at one revision.
#[derive(Default)]
pub(crate) struct PolicyObjects {
    objects: BTreeMap<String, Value>,
    revision: u64,
}

impl PolicyObjects {
    fn apply(&mut self, event: &Event) {
        match event {
            Event::Put { kv, .. } => {
                if let Ok(object) = decode(kv) {
                    self.objects.insert(kv.key.clone(), object);
                }
            }
            Event::Delete { prev, .. } => {
                self.objects.remove(&prev.key);
            }
        }
    }

    fn index(&self) -> SpanIndex {
        let groups = list_prefix(&applied_to_group(), None);
        let policies = list_prefix(&network_policy(), None);
        SpanIndex::new(
            under(&self.objects, &groups).map(|(_, object)| object),
            under(&self.objects, &policies).map(|(_, object)| object),
        )
    }
}

fn policy_prefix() -> String {
    // Every policy kind shares the group's key prefix.
    let groups = list_prefix(&applied_to_group(), None);
    groups
        .trim_end_matches('/')
        .rsplit_once('/')
        .map(|(group, _)| format!("{group}/"))
        .unwrap_or(groups)
}

impl ApiServer {
    /// The spans of the stored policy objects now.
    pub(crate) async fn span_index(&self) -> Result<SpanIndex, StatusError> {
        Ok(self.policy_objects(None).await?.index())
    }

    async fn policy_objects(&self, at: Option<u64>) -> Result<PolicyObjects, StatusError> {
        let page = self
            .store
            .list(&policy_prefix(), None, 0, at)
            .await
            .map_err(|error| store_status(&network_policy(), "", error))?;
        let mut objects = PolicyObjects {
            revision: page.revision,
            ..PolicyObjects::default()
        };
        for row in &page.items {
            objects.objects.insert(row.key.clone(), decode(row)?);
        }
        Ok(objects)
    }

    /// Starts a VM agent's watch: the state at `after` (now when `None`), then its changes.
    pub(crate) async fn span_watch(
        &self,
        watch: Watch,
        vm: String,
        after: Option<u64>,
        sender: mpsc::Sender<Bytes>,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), StatusError> {
        let objects = self.policy_objects(after).await?;
        let prefix = watch.prefix.clone();
        let shown = shown(&watch, &vm, &objects, &prefix);
        let span = SpanWatch {
            watch,
            vm,
            prefix,
            objects,
            shown,
        };
        tokio::spawn(span.run(after.is_none(), sender, permit));
        Ok(())
    }
}

struct SpanWatch {
    watch: Watch,
    vm: String,
    /// The watched resource's key prefix.
    prefix: String,
    objects: PolicyObjects,
    /// What the agent has been sent of the watched resource, by key.
    shown: BTreeMap<String, Value>,
}

impl SpanWatch {
    async fn run(
        mut self,
        send_initial: bool,
        sender: mpsc::Sender<Bytes>,
        _permit: OwnedSemaphorePermit,
    ) {
        let _open = self.watch.open();
        let mut first = true;
        let mut alive = true;
        if send_initial {
            for object in self.shown.values() {
                alive = alive
                    && self
                        .watch
                        .send(&sender, WatchEventType::Added, object, &mut first)
                        .await;
            }
        }
        let deadline = tokio::time::sleep(self.watch.duration);
        tokio::pin!(deadline);
        let mut outages = 0;
        let mut stream = self
            .watch
            .store
            .watch(&policy_prefix(), self.objects.revision);
        while alive {
            let item = tokio::select! {
                _ = &mut deadline => break,
                _ = sender.closed() => break,
                item = stream.next() => item,
            };
            match item {
                None => break,
                Some(Ok(batch)) if batch.events.is_empty() => {
                    if self.watch.options.allow_watch_bookmarks {
                        let bookmark = line(&bookmark_event(&self.watch.spec, batch.revision));
                        alive = sender.send(bookmark).await.is_ok();
                    }
                }
                Some(Ok(batch)) => {
                    outages = 0;
                    for event in &batch.events {
                        self.objects.apply(event);
                    }
                    self.objects.revision = batch.revision;
                    alive = self.send_changes(batch.revision, &sender, &mut first).await;
                }
                Some(Err(StoreError::Lagged { last_revision })) => {
                    stream = self.watch.store.watch(&policy_prefix(), last_revision);
                }
                Some(Err(StoreError::Unavailable { .. })) if outages < STORE_RETRIES => {
                    outages += 1;
                    tokio::time::sleep(STORE_RETRY_PAUSE).await;
                    stream = self
                        .watch
                        .store
                        .watch(&policy_prefix(), self.objects.revision);
                }
                Some(Err(error)) => {
                    let status = match error {
                        StoreError::Compacted { compact_revision } => {
                            StatusError::gone(self.objects.revision, compact_revision)
                        }
                        other => StatusError::new(
                            StatusReason::ServiceUnavailable,
                            format!("the store ended the watch: {other}"),
                        ),
                    };
                    let _ = sender.send(line(&error_event(&status))).await;
                    break;
                }
            }
        }
    }

    /// Sends the difference between what the agent was shown and what it may see now.
    async fn send_changes(
        &mut self,
        revision: u64,
        sender: &mpsc::Sender<Bytes>,
        first: &mut bool,
    ) -> bool {
        let now = shown(&self.watch, &self.vm, &self.objects, &self.prefix);
        let before = std::mem::take(&mut self.shown);
        for (key, old) in &before {
            if !now.contains_key(key) {
                let mut old = old.clone();
                set_resource_version(&mut old, revision);
                if !self
                    .watch
                    .send(sender, WatchEventType::Deleted, &old, first)
                    .await
                {
                    return false;
                }
            }
        }
        for (key, new) in &now {
            let event = match before.get(key) {
                None => WatchEventType::Added,
                // A group changed only in other VMs' members looks the same to this agent
                // apart from its resourceVersion: nothing to send.
                Some(old) if without_version(old) != without_version(new) => {
                    WatchEventType::Modified
                }
                Some(_) => continue,
            };
            if !self.watch.send(sender, event, new, first).await {
                return false;
            }
        }
        self.shown = now;
        true
    }
}

/// The watched resource's objects the agent may see, as it is shown them.
fn shown(
    watch: &Watch,
    vm: &str,
    objects: &PolicyObjects,
    prefix: &str,
) -> BTreeMap<String, Value> {
    let visibility = Visibility::Span {
        vm: vm.to_string(),
        index: Arc::new(objects.index()),
    };
    under(&objects.objects, prefix)
        .filter(|(_, object)| {
            watch.options.label_selector.matches(object)
                && watch.options.field_selector.matches(object)
                && visibility.allows(&watch.spec, object)
        })
        .map(|(key, object)| (key.clone(), visibility.present(&watch.spec, object.clone())))
        .collect()
}

/// The objects whose keys start with `prefix`.
fn under<'a>(
    objects: &'a BTreeMap<String, Value>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Value)> + 'a {
    objects
        .range(prefix.to_string()..)
        .take_while(move |(key, _)| key.starts_with(prefix))
}
