//! The control plane's one view of what VM agents may read (issue 36): every policy object as
//! agents are shown it, the span indexes over them, and every VM's `AgentedConnected` state,
//! all at one store revision and shared by every VM agent's lists and watches.
//!
//! Before, each VM agent's request listed and decoded every policy object and built the span
//! index, and each of its three watches kept its own copy and re-listed at every heartbeat of
//! its VM: at 1,000 VMs the control plane spent its core on that and never synced. Now one
//! follower watches the whole store (policies and VMs in one ordered stream, so both halves are
//! always at the same revision) and:
//! - publishes a new [`PolicySet`] only when what an agent is shown changes (a status-only
//!   write, such as the VMManager's realization counts, changes nothing);
//! - wakes only a VM's own watches when that VM is written (a heartbeat costs a bookmark, not
//!   a re-list), and on a policy change only the watches of the VMs the changed objects were
//!   or are now sent to (a property test holds that every VM whose view moves is woken);
//! - answers "is the view at least as new as the store was when this request arrived" by
//!   comparing the store's current revision with its own, so a list or a watch never shows
//!   an older state than the request saw.

mod state;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use serde_json::Value;
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::{Event, Store, StoreError, WatchBatch};
use tokio::sync::watch;

use super::keys::list_prefix;
use super::objects::{decode, store_status};
use super::visibility::present_to_agents;
use super::ApiMetrics;
use crate::kinds::{
    address_group, applied_to_group, network_policy, receives_policies, virtual_machine,
    PolicyResource,
};
pub(crate) use state::PolicySet;
use state::{FeedState, Update};

/// How long a request waits for the view to reach the store's revision before it is answered
/// 503 (the view is a watch on the same store: it is normally milliseconds behind).
const CATCH_UP: Duration = Duration::from_secs(5);

/// Pause before the follower lists again after its watch or list failed.
const RELOAD_PAUSE: Duration = Duration::from_millis(500);

/// The shared view, started by the first VM agent request.
pub(crate) struct SpanFeed {
    state: Mutex<FeedState>,
    store: Arc<dyn Store>,
    metrics: ApiMetrics,
    /// The revision the view is complete at (`None` before its first load).
    progress: watch::Sender<Option<u64>>,
    /// The watches of each VM, woken when that VM is written or a change reaches its span.
    vm_signals: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Dropped with the feed: ends the follower.
    _alive: watch::Sender<()>,
}

/// A VM agent's view at one revision.
pub(crate) struct SpanView {
    pub revision: u64,
    pub set: Arc<PolicySet>,
    pub receives: bool,
}

impl SpanView {
    /// The view's objects of `resource` under `prefix` in `vm`'s span that pass the selectors,
    /// in key order (groups not yet narrowed to the VM's members); none unless the VM receives
    /// policies.
    pub(crate) fn objects<'a>(
        &'a self,
        resource: Option<PolicyResource>,
        vm: &str,
        prefix: &'a str,
        options: &'a ListOptions,
    ) -> impl Iterator<Item = (&'a str, &'a Arc<Value>)> + 'a {
        let keys = match resource.filter(|_| self.receives) {
            Some(resource) => self.set.by_vm.keys(resource, vm),
            None => Default::default(),
        };
        keys.into_iter().filter_map(move |key| {
            let object = self.set.objects.get(key)?;
            let selected = key.starts_with(prefix)
                && options.label_selector.matches(object)
                && options.field_selector.matches(object);
            selected.then_some((key, object))
        })
    }
}

impl SpanFeed {
    /// The feed of `cell`, started (with its follower) on first use.
    pub(crate) fn get(
        cell: &OnceLock<Arc<SpanFeed>>,
        store: &Arc<dyn Store>,
        metrics: &ApiMetrics,
    ) -> Arc<SpanFeed> {
        cell.get_or_init(|| {
            let (alive, closed) = watch::channel(());
            let feed = Arc::new(SpanFeed {
                state: Mutex::default(),
                store: store.clone(),
                metrics: metrics.clone(),
                progress: watch::Sender::new(None),
                vm_signals: Mutex::default(),
                _alive: alive,
            });
            tokio::spawn(follow(Arc::downgrade(&feed), store.clone(), closed));
            feed
        })
        .clone()
    }

    fn state(&self) -> MutexGuard<'_, FeedState> {
        // A panic under the lock leaves whole values behind (each update replaces Arcs).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `vm`'s view once it is at least as new as the store is now.
    pub(crate) async fn fresh(&self, vm: &str) -> Result<SpanView, StatusError> {
        let now = self
            .store
            .current_revision()
            .await
            .map_err(|error| store_status(&network_policy(), "", error))?;
        self.reach(now).await?;
        let state = self.state();
        Ok(SpanView {
            revision: state.revision.unwrap_or(now),
            set: state.set.clone(),
            receives: state.receives(vm),
        })
    }

    /// `vm`'s view as it was at `revision`; 410 when that is older than the view remembers,
    /// 503 at once for a revision the store has not reached (as a plain watch answers).
    pub(crate) async fn at(&self, vm: &str, revision: u64) -> Result<SpanView, StatusError> {
        let current = self
            .store
            .current_revision()
            .await
            .map_err(|error| store_status(&network_policy(), "", error))?;
        if revision > current {
            let future = StoreError::FutureRevision {
                requested: revision,
                current,
            };
            return Err(store_status(&network_policy(), "", future));
        }
        self.reach(revision).await?;
        let state = self.state();
        let (set, receives) = state.at(vm, revision).ok_or_else(|| {
            let oldest = state.set.since;
            StatusError::gone(revision, oldest)
        })?;
        Ok(SpanView {
            revision,
            set,
            receives,
        })
    }

    /// `vm`'s view now, without waiting (a watch already following the feed).
    pub(crate) fn now(&self, vm: &str) -> SpanView {
        let state = self.state();
        SpanView {
            revision: state.revision.unwrap_or(0),
            set: state.set.clone(),
            receives: state.receives(vm),
        }
    }

    /// Waits until the view is complete at `revision`.
    async fn reach(&self, revision: u64) -> Result<(), StatusError> {
        let mut progress = self.progress.subscribe();
        let reached = tokio::time::timeout(
            CATCH_UP,
            progress.wait_for(|seen| seen.is_some_and(|seen| seen >= revision)),
        )
        .await
        .is_ok_and(|waited| waited.is_ok());
        match reached {
            true => Ok(()),
            false => Err(StatusError::new(
                StatusReason::ServiceUnavailable,
                format!(
                    "the control plane's policy view has not reached revision {revision} yet; \
                     retry"
                ),
            )),
        }
    }

    /// Wakes when `vm`'s object is written or a policy change reaches its span (before or after).
    pub(crate) fn vm_changes(&self, vm: &str) -> watch::Receiver<u64> {
        self.signals()
            .entry(vm.to_string())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Reads everything the view holds at one revision and replaces the view with it.
    async fn load(&self) -> Result<u64, StatusError> {
        self.metrics.span_policy_reads.inc();
        let policies = policy_prefix();
        let vms = PREFIXES.vms.clone();
        let mut updates = Vec::new();
        let revision = list_all(self.store.as_ref(), &policies, None, &mut updates).await?;
        list_all(self.store.as_ref(), &vms, Some(revision), &mut updates).await?;
        self.state().load(revision, updates);
        // After a reload anything may have moved: every watch looks again.
        let every: Vec<String> = self.signals().keys().cloned().collect();
        self.published(revision, every);
        Ok(revision)
    }

    fn apply(&self, batch: WatchBatch) {
        let updates: Vec<Update> = batch.events.iter().filter_map(update_of).collect();
        let woken = self.state().apply(batch.revision, updates);
        self.published(batch.revision, woken);
    }

    fn signals(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        self.vm_signals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the watches of the VMs whose view may have moved, then the waiters for the
    /// revision.
    fn published(&self, revision: u64, woken: impl IntoIterator<Item = String>) {
        let mut signals = self.signals();
        for vm in woken {
            let Some(signal) = signals.get(&vm) else {
                continue;
            };
            if signal.send(revision).is_err() {
                // No watch of that VM is open any more.
                signals.remove(&vm);
            }
        }
        drop(signals);
        self.progress.send_replace(Some(revision));
    }
}

/// The follower: load, then apply the store's changes until the watch breaks; again.
async fn follow(feed: Weak<SpanFeed>, store: Arc<dyn Store>, mut closed: watch::Receiver<()>) {
    loop {
        let Some(strong) = feed.upgrade() else {
            return;
        };
        let loaded = std::panic::AssertUnwindSafe(strong.load())
            .catch_unwind()
            .await;
        drop(strong);
        let after = match loaded {
            Ok(Ok(revision)) => revision,
            Ok(Err(status)) => {
                tracing::warn!(reason = %status.message, "policy view: load failed; retrying");
                tokio::time::sleep(RELOAD_PAUSE).await;
                continue;
            }
            Err(_) => {
                tracing::error!("policy view: load panicked; retrying");
                tokio::time::sleep(RELOAD_PAUSE).await;
                continue;
            }
        };
        // Everything: policies and VMs must come in one ordered stream.
        let mut changes = store.watch("", after);
        loop {
            let item = tokio::select! {
                _ = closed.changed() => return,
                item = changes.next() => item,
            };
            let batch = match item {
                Some(Ok(batch)) => batch,
                // Cut for falling behind: every change up to there is applied, so watching
                // again from there is enough (a list would cost every object again).
                Some(Err(StoreError::Lagged { last_revision })) => {
                    changes = store.watch("", last_revision);
                    continue;
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "policy view: store watch ended; listing again");
                    break;
                }
                None => break,
            };
            let Some(strong) = feed.upgrade() else {
                return;
            };
            let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                strong.apply(batch);
            }));
            if applied.is_err() {
                tracing::error!("policy view: a change panicked; listing again");
                break;
            }
        }
        tokio::time::sleep(RELOAD_PAUSE).await;
    }
}

/// Every row under `prefix` at `at` (now when `None`) as updates; returns the revision read.
async fn list_all(
    store: &dyn Store,
    prefix: &str,
    at: Option<u64>,
    updates: &mut Vec<Update>,
) -> Result<u64, StatusError> {
    let mut cursor: Option<String> = None;
    let mut revision = at;
    loop {
        let page = store
            .list(prefix, cursor.as_deref(), 0, revision)
            .await
            .map_err(|error| store_status(&network_policy(), "", error))?;
        revision = Some(page.revision);
        for row in &page.items {
            let event = Event::Put {
                kv: row.clone(),
                prev: None,
            };
            updates.extend(update_of(&event));
        }
        cursor = page.items.last().map(|row| row.key.clone());
        if !page.more || cursor.is_none() {
            return Ok(page.revision);
        }
    }
}

/// What a store change means to the view, if anything.
fn update_of(event: &Event) -> Option<Update> {
    let key = event.key();
    if let Some(resource) = resource_of(key) {
        let presented = match event {
            Event::Put { kv, .. } => match decode(kv) {
                Ok(object) => Some(present_to_agents(object)),
                Err(status) => {
                    // Stored objects were validated; one that does not parse is shown to nobody.
                    tracing::error!(%key, reason = %status.message, "policy view: unreadable object");
                    None
                }
            },
            Event::Delete { .. } => None,
        };
        return Some(Update::Policy {
            key: key.to_string(),
            resource,
            presented,
        });
    }
    let name = key.strip_prefix(PREFIXES.vms.as_str())?;
    let receives = match event {
        Event::Put { kv, .. } => receives_policies(decode(kv).ok().as_ref()),
        Event::Delete { .. } => false,
    };
    Some(Update::Vm {
        name: name.to_string(),
        receives,
        revision: event.revision(),
    })
}

/// The key prefixes the view follows, worked out once: every store write passes here.
struct Prefixes {
    policies: [(String, PolicyResource); 3],
    vms: String,
}

static PREFIXES: LazyLock<Prefixes> = LazyLock::new(|| Prefixes {
    policies: [
        (
            list_prefix(&applied_to_group(), None),
            PolicyResource::AppliedToGroup,
        ),
        (
            list_prefix(&network_policy(), None),
            PolicyResource::NetworkPolicy,
        ),
        (
            list_prefix(&address_group(), None),
            PolicyResource::AddressGroup,
        ),
    ],
    vms: list_prefix(&virtual_machine(), None),
});

fn resource_of(key: &str) -> Option<PolicyResource> {
    PREFIXES
        .policies
        .iter()
        .find(|(prefix, _)| key.starts_with(prefix.as_str()))
        .map(|(_, resource)| *resource)
}

/// The prefix every policy kind's keys share.
pub(crate) fn policy_prefix() -> String {
    let groups = list_prefix(&applied_to_group(), None);
    groups
        .trim_end_matches('/')
        .rsplit_once('/')
        .map(|(group, _)| format!("{group}/"))
        .unwrap_or(groups)
}
