//! What a VM agent reads depends on other objects than the ones it asked for: a policy is in
//! its span through the applied-to groups the policy names, an address group through the
//! policies naming it, and nothing is in it unless its own `VirtualMachine` is
//! `AgentedConnected`. So a VM agent's watch follows the control plane's shared span view
//! ([`SpanFeed`]) and, after each change, sends the difference in what the agent may see: an
//! object entering its span is ADDED, one leaving it DELETED, even when the object itself did
//! not change.
//!
//! The view holds policies and VMs at one store revision, so each difference is between two
//! consistent snapshots, and a BOOKMARK at the view's revision follows (with
//! `allowWatchBookmarks`): the agent then knows its policy view reflects every VM state up to
//! there. A write of the agent's own VM (a heartbeat) wakes only that VM's watches and costs a
//! BOOKMARK; a policy change wakes the watches of the VMs it was or is now sent to, which read
//! the few keys of their own span from the view, compare them by pointer, and encode only what
//! changed. Every watch also looks every 10 s (a BOOKMARK if the view moved).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use sluice_apimachinery::list::{bookmark_event, WatchEventType};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::StatusError;
use tokio::sync::{mpsc, watch};

use super::admission::Slot;
use super::objects::without_version;
use super::span_feed::{SpanFeed, SpanView};
use super::visibility::{own_members_of, Visibility};
use super::watch::{line, Watch};
use super::ApiServer;
use crate::kinds::PolicyResource;

impl ApiServer {
    pub(crate) fn span_feed(&self) -> Arc<SpanFeed> {
        SpanFeed::get(&self.span_feed, &self.store, &self.metrics)
    }

    /// What a VM agent's request may see: its span and state as of now.
    pub(crate) async fn span_visibility(&self, vm: String) -> Result<Visibility, StatusError> {
        let view = self.span_feed().fresh(&vm).await?;
        Ok(Visibility::Span {
            vm,
            index: view.set.index.clone(),
            receives: view.receives,
        })
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
        let feed = self.span_feed();
        // Subscribed before the view is read: a change after the read wakes the watch.
        let wakes = feed.vm_changes(&vm);
        let view = match after {
            None => feed.fresh(&vm).await?,
            Some(after) => feed.at(&vm, after).await?,
        };
        let mut span = SpanWatch {
            resource: PolicyResource::from_plural(&watch.spec.plural),
            watch,
            vm,
            feed,
            shown: BTreeMap::new(),
            set_since: view.set.since,
            receives: view.receives,
            // The first pass sends one at the start's revision: an agent whose span is empty
            // learns at once that its view is complete there.
            bookmarked: 0,
        };
        span.shown = span.visible(&view);
        tokio::spawn(super::panics::contained(
            super::panics::Task::SpanWatch,
            span.run(after.is_none(), sender, permit, wakes),
        ));
        Ok(())
    }
}

/// What an agent was shown of one object.
struct Shown {
    /// The view's object it came from (compared by pointer).
    source: Arc<Value>,
    /// As sent: a group narrowed to the agent's own members, the view's object otherwise.
    sent: Arc<Value>,
}

struct SpanWatch {
    watch: Watch,
    vm: String,
    /// The watched resource (`None`: not a policy resource, nothing is in any span).
    resource: Option<PolicyResource>,
    feed: Arc<SpanFeed>,
    /// What the agent has been sent of the watched resource, by key.
    shown: BTreeMap<String, Shown>,
    /// The policy set (by the revision it began at: the watch holds no set, so old sets are
    /// freed) and VM state `shown` was worked out from.
    set_since: u64,
    receives: bool,
    /// The revision of the last BOOKMARK sent (or of the view the watch started from).
    bookmarked: u64,
}

impl SpanWatch {
    async fn run(
        mut self,
        send_initial: bool,
        sender: mpsc::Sender<Bytes>,
        _permit: Slot,
        mut wakes: watch::Receiver<u64>,
    ) {
        let _open = self.watch.open();
        let mut first = true;
        if send_initial {
            for shown in self.shown.values() {
                let (watch, object) = (&self.watch, shown.sent.as_ref());
                if !watch
                    .send(&sender, WatchEventType::Added, object, &mut first)
                    .await
                {
                    return;
                }
            }
        }
        let deadline = tokio::time::sleep(self.watch.duration);
        tokio::pin!(deadline);
        // With nothing to report, a BOOKMARK still goes out this often when the view moved (as
        // a plain watch's for the store's progress), so a resume finds its revision in the
        // view's history. The first tick is one interval away: `interval`'s immediate one
        // would send a second BOOKMARK right after the start's whenever a write landed
        // between the two reads of the view.
        let every = self.watch.bookmark_every;
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The view may have moved between the start's read and the subscription's first
            // wake, or since the last wake: compare now, whatever woke the watch.
            let view = self.feed.now(&self.vm);
            if !self.send_changes(&view, &sender, &mut first).await
                || !self.bookmark(view.revision, &sender).await
            {
                return;
            }
            let woke = tokio::select! {
                _ = &mut deadline => false,
                _ = sender.closed() => false,
                changed = wakes.changed() => changed.is_ok(),
                _ = progress.tick() => true,
            };
            if !woke {
                return;
            }
        }
    }

    /// The watched resource's objects the agent may see in `view`, as it is shown them.
    fn visible(&self, view: &SpanView) -> BTreeMap<String, Shown> {
        let (watch, vm) = (&self.watch, self.vm.as_str());
        view.objects(self.resource, vm, &watch.prefix, &watch.options)
            .map(|(key, object)| {
                let sent = match self.shown.get(key) {
                    Some(shown) if Arc::ptr_eq(&shown.source, object) => shown.sent.clone(),
                    _ => shown_to(self.resource, object, vm),
                };
                let source = object.clone();
                (key.to_string(), Shown { source, sent })
            })
            .collect()
    }

    /// Sends the difference between what the agent was shown and what it may see in `view`.
    async fn send_changes(
        &mut self,
        view: &SpanView,
        sender: &mpsc::Sender<Bytes>,
        first: &mut bool,
    ) -> bool {
        if view.set.since == self.set_since && view.receives == self.receives {
            return true;
        }
        let now = self.visible(view);
        let before = std::mem::take(&mut self.shown);
        for (key, old) in &before {
            if !now.contains_key(key) {
                let mut gone = old.sent.as_ref().clone();
                set_resource_version(&mut gone, view.revision);
                if !self
                    .watch
                    .send(sender, WatchEventType::Deleted, &gone, first)
                    .await
                {
                    return false;
                }
            }
        }
        for (key, new) in &now {
            let event = match before.get(key) {
                None => WatchEventType::Added,
                Some(old) if Arc::ptr_eq(&old.sent, &new.sent) => continue,
                // A group changed only in other VMs' members looks the same to this agent
                // apart from its resourceVersion: nothing to send.
                Some(old) if without_version(&old.sent) == without_version(&new.sent) => continue,
                Some(_) => WatchEventType::Modified,
            };
            if !self.watch.send(sender, event, &new.sent, first).await {
                return false;
            }
        }
        self.shown = now;
        self.set_since = view.set.since;
        self.receives = view.receives;
        true
    }

    /// A BOOKMARK at `revision` when the view moved past the last one.
    async fn bookmark(&mut self, revision: u64, sender: &mpsc::Sender<Bytes>) -> bool {
        if !self.watch.options.allow_watch_bookmarks || revision <= self.bookmarked {
            return true;
        }
        self.bookmarked = revision;
        let bookmark = line(&bookmark_event(&self.watch.spec, revision));
        sender.send(bookmark).await.is_ok()
    }
}

/// A view object as `vm`'s agent is shown it: an applied-to group with only its own members.
pub(crate) fn shown_to(
    resource: Option<PolicyResource>,
    object: &Arc<Value>,
    vm: &str,
) -> Arc<Value> {
    match resource {
        Some(PolicyResource::AppliedToGroup) => Arc::new(own_members_of(object, vm)),
        _ => object.clone(),
    }
}
