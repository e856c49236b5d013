//! What a VM agent reads depends on other objects than the ones it asked for: a policy is in
//! its span through the applied-to groups the policy names, an address group through the
//! policies naming it, and nothing is in it unless its own `VirtualMachine` is
//! `AgentedConnected`. So a VM agent's watch follows every policy object and its own VM's key
//! and, after each change, sends the difference in what the agent may see: an object entering
//! its span is ADDED, one leaving it DELETED, even when the object itself did not change.
//!
//! Two store watches feed it (the policy group's prefix, the VM's key) and the store orders
//! neither against the other. The view it diffs is therefore always one snapshot: when the VM
//! changes at revision `B`, the policies are re-read at `T = max(B, policies' revision)` (rows
//! whose mod_revision did not move are not decoded again), the VM too when `T > B`, both
//! watches resume after `T`, and a BOOKMARK at `T` follows the events (with
//! `allowWatchBookmarks`): the agent then knows its policy view reflects every VM state up to
//! `T`. Revisions are store-wide (one log for the embedded store, etcd's revision), so `T`
//! compares with the VM object's resourceVersion. The cost is one list of the policy objects per
//! change of the agent's own VM (about one per heartbeat; counted in
//! `sluice_controlplane_span_policy_reads_total`); other VMs' changes cost a key comparison, no
//! decode.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use sluice_apimachinery::list::{bookmark_event, error_event, WatchEventType};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::{Event, Store, StoreError, WatchBatch, WatchStream};
use tokio::sync::mpsc;

use super::admission::Slot;

use super::keys::{list_prefix, object_key};
use super::objects::{decode, store_status, without_version};
use super::visibility::Visibility;
use super::watch::{line, Watch, STORE_RETRIES, STORE_RETRY_PAUSE};
use super::ApiServer;
use crate::kinds::{
    applied_to_group, network_policy, receives_policies, virtual_machine, SpanIndex,
};

/// Every policy object, by store key, and the agent's VM, at one revision.
#[derive(Default)]
pub(crate) struct PolicyObjects {
    objects: BTreeMap<String, Value>,
    /// The policies are complete up to this revision.
    revision: u64,
    /// The agent's `VirtualMachine` (as of `vm_revision`).
    vm: Option<Value>,
    /// The VM is known up to this revision.
    vm_revision: u64,
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

    /// Both halves are complete up to this revision.
    fn consistent(&self) -> u64 {
        self.revision.min(self.vm_revision)
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

/// The store key of a VM agent's own `VirtualMachine`.
pub(crate) fn vm_key(vm: &str) -> String {
    object_key(&virtual_machine(), None, vm)
}

impl ApiServer {
    /// The spans of the stored policy objects now.
    pub(crate) async fn span_index(&self) -> Result<SpanIndex, StatusError> {
        Ok(read_policies(self.store.as_ref(), None, None)
            .await?
            .index())
    }

    /// Whether `vm`'s agent receives policies now (its VM is `AgentedConnected`).
    pub(crate) async fn receives_policies(&self, vm: &str) -> Result<bool, StatusError> {
        let vm = read_vm(self.store.as_ref(), vm, None).await?;
        Ok(receives_policies(vm.as_ref()))
    }

    /// Starts a VM agent's watch: the state at `after` (now when `None`), then its changes.
    pub(crate) async fn span_watch(
        &self,
        watch: Watch,
        vm: String,
        after: Option<u64>,
        sender: mpsc::Sender<Bytes>,
        permit: Slot,
    ) -> Result<(), StatusError> {
        let store = self.store.as_ref();
        self.metrics.span_policy_reads.inc();
        let mut objects = read_policies(store, after, None).await?;
        objects.vm = read_vm(store, &vm, Some(objects.revision)).await?;
        objects.vm_revision = objects.revision;
        let prefix = watch.prefix.clone();
        let shown = shown(&watch, &vm, &objects, &prefix);
        let span = SpanWatch {
            watch,
            vm_key: vm_key(&vm),
            vm,
            prefix,
            objects,
            shown,
            bookmarked: 0,
        };
        tokio::spawn(span.run(after.is_none(), sender, permit));
        Ok(())
    }
}

struct SpanWatch {
    watch: Watch,
    vm: String,
    vm_key: String,
    /// The watched resource's key prefix.
    prefix: String,
    objects: PolicyObjects,
    /// What the agent has been sent of the watched resource, by key.
    shown: BTreeMap<String, Value>,
    /// The revision of the last BOOKMARK sent.
    bookmarked: u64,
}

/// Which of the two store watches an item came from.
enum Source {
    Policies,
    Vm,
}

/// What the watch loop does next.
enum Step {
    Continue,
    Stop,
}

impl SpanWatch {
    async fn run(mut self, send_initial: bool, sender: mpsc::Sender<Bytes>, _permit: Slot) {
        let _open = self.watch.open();
        let mut first = true;
        if send_initial {
            for object in self.shown.values() {
                if !self
                    .watch
                    .send(&sender, WatchEventType::Added, object, &mut first)
                    .await
                {
                    return;
                }
            }
        }
        let deadline = tokio::time::sleep(self.watch.duration);
        tokio::pin!(deadline);
        let mut outages = 0;
        let mut policies = self.policy_stream();
        let mut vm = self.vm_stream();
        loop {
            let (source, item) = tokio::select! {
                _ = &mut deadline => break,
                _ = sender.closed() => break,
                item = policies.next() => (Source::Policies, item),
                item = vm.next() => (Source::Vm, item),
            };
            let step = match item {
                None => Step::Stop,
                Some(Ok(batch)) => {
                    outages = 0;
                    match source {
                        Source::Policies => self.policy_batch(batch, &sender, &mut first).await,
                        Source::Vm => {
                            let (step, resynced) = self.vm_batch(batch, &sender, &mut first).await;
                            if resynced {
                                policies = self.policy_stream();
                                vm = self.vm_stream();
                            }
                            step
                        }
                    }
                }
                Some(Err(error)) => {
                    let retry = match error {
                        StoreError::Lagged { .. } => true,
                        StoreError::Unavailable { .. } if outages < STORE_RETRIES => {
                            outages += 1;
                            tokio::time::sleep(STORE_RETRY_PAUSE).await;
                            true
                        }
                        other => {
                            self.fail(other, &sender).await;
                            false
                        }
                    };
                    if !retry {
                        break;
                    }
                    // Both resume from what this watch has applied: nothing lost, nothing twice.
                    policies = self.policy_stream();
                    vm = self.vm_stream();
                    Step::Continue
                }
            };
            if matches!(step, Step::Stop) {
                break;
            }
        }
    }

    fn policy_stream(&self) -> WatchStream {
        self.watch
            .store
            .watch(&policy_prefix(), self.objects.revision)
    }

    fn vm_stream(&self) -> WatchStream {
        self.watch
            .store
            .watch(&self.vm_key, self.objects.vm_revision)
    }

    async fn policy_batch(
        &mut self,
        batch: WatchBatch,
        sender: &mpsc::Sender<Bytes>,
        first: &mut bool,
    ) -> Step {
        if batch.revision <= self.objects.revision {
            return Step::Continue;
        }
        if batch.events.is_empty() {
            self.objects.revision = batch.revision;
            return self.progress(sender).await;
        }
        for event in &batch.events {
            self.objects.apply(event);
        }
        self.objects.revision = batch.revision;
        alive(self.send_changes(batch.revision, sender, first).await)
    }

    /// A batch of the VM's key watch (other VMs whose names extend this one's share the
    /// prefix: skipped by key). Returns whether the view was re-read (the streams restart).
    async fn vm_batch(
        &mut self,
        batch: WatchBatch,
        sender: &mpsc::Sender<Bytes>,
        first: &mut bool,
    ) -> (Step, bool) {
        if batch.revision <= self.objects.vm_revision {
            return (Step::Continue, false);
        }
        let own = batch
            .events
            .iter()
            .rev()
            .find(|event| event.key() == self.vm_key);
        let Some(own) = own else {
            self.objects.vm_revision = batch.revision;
            return (self.progress(sender).await, false);
        };
        let vm = match own {
            Event::Put { kv, .. } => decode(kv).ok(),
            Event::Delete { .. } => None,
        };
        // Re-read even when only the VM's heartbeat moved (its state, all that decides the
        // span, did not): the BOOKMARK at the VM's revision that follows is what tells the
        // agent its three policy watches are complete up to there, and the policy stream alone
        // reports progress only every store progress interval (10 s embedded). Skipping the
        // list needs the store to confirm a watch's progress on demand (issue 36).
        match self.resync(batch.revision, vm).await {
            Ok(revision) => {
                if !self.send_changes(revision, sender, first).await {
                    return (Step::Stop, true);
                }
                (self.bookmark(revision, sender).await, true)
            }
            Err(status) => {
                let _ = sender.send(line(&error_event(&status))).await;
                (Step::Stop, true)
            }
        }
    }

    /// One snapshot of policies and VM at `max(batch, policies' revision)`; returns it.
    async fn resync(&mut self, batch: u64, vm: Option<Value>) -> Result<u64, StatusError> {
        let target = batch.max(self.objects.revision);
        let store = self.watch.store.clone();
        if target > self.objects.revision {
            self.watch.metrics.span_policy_reads.inc();
            let fresh = read_policies(store.as_ref(), Some(target), Some(&self.objects.objects));
            self.objects.objects = fresh.await?.objects;
        }
        self.objects.vm = if target > batch {
            read_vm(store.as_ref(), &self.vm, Some(target)).await?
        } else {
            vm
        };
        self.objects.revision = target;
        self.objects.vm_revision = target;
        Ok(target)
    }

    /// A BOOKMARK when both watches moved past the last one.
    async fn progress(&mut self, sender: &mpsc::Sender<Bytes>) -> Step {
        let revision = self.objects.consistent();
        self.bookmark(revision, sender).await
    }

    async fn bookmark(&mut self, revision: u64, sender: &mpsc::Sender<Bytes>) -> Step {
        if !self.watch.options.allow_watch_bookmarks || revision <= self.bookmarked {
            return Step::Continue;
        }
        self.bookmarked = revision;
        let bookmark = line(&bookmark_event(&self.watch.spec, revision));
        alive(sender.send(bookmark).await.is_ok())
    }

    async fn fail(&self, error: StoreError, sender: &mpsc::Sender<Bytes>) {
        let status = match error {
            StoreError::Compacted { compact_revision } => {
                StatusError::gone(self.objects.consistent(), compact_revision)
            }
            other => StatusError::new(
                StatusReason::ServiceUnavailable,
                format!("the store ended the watch: {other}"),
            ),
        };
        let _ = sender.send(line(&error_event(&status))).await;
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

fn alive(alive: bool) -> Step {
    if alive {
        Step::Continue
    } else {
        Step::Stop
    }
}

/// The agent's VM as of `at` (now when `None`).
async fn read_vm(
    store: &dyn Store,
    vm: &str,
    at: Option<u64>,
) -> Result<Option<Value>, StatusError> {
    let key = vm_key(vm);
    // A key sorts before every longer key it prefixes, so the first row is the VM if any.
    let page = store
        .list(&key, None, 1, at)
        .await
        .map_err(|error| store_status(&virtual_machine(), vm, error))?;
    page.items
        .iter()
        .find(|row| row.key == key)
        .map(decode)
        .transpose()
}

/// Every policy object at `at` (now when `None`); rows whose mod_revision matches an object in
/// `known` reuse it instead of being decoded again.
async fn read_policies(
    store: &dyn Store,
    at: Option<u64>,
    known: Option<&BTreeMap<String, Value>>,
) -> Result<PolicyObjects, StatusError> {
    let page = store
        .list(&policy_prefix(), None, 0, at)
        .await
        .map_err(|error| store_status(&network_policy(), "", error))?;
    let mut objects = PolicyObjects {
        revision: page.revision,
        ..PolicyObjects::default()
    };
    for row in &page.items {
        let version = row.mod_revision.to_string();
        let unchanged = known.and_then(|known| known.get(&row.key)).filter(|old| {
            old.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                == Some(version.as_str())
        });
        let object = match unchanged {
            Some(object) => object.clone(),
            None => decode(row)?,
        };
        objects.objects.insert(row.key.clone(), object);
    }
    Ok(objects)
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
        receives: receives_policies(objects.vm.as_ref()),
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
