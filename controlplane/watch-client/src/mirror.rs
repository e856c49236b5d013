//! The reflector's cache and its publication to consumers.

use std::sync::Arc;

use tokio::sync::watch;

use crate::decode::WatchEvent;
use crate::snapshot::{diff, upsert, Change, Objects, Snapshot};

/// The working copy the reflector mutates, and the channel its snapshots go out on.
#[derive(Debug)]
pub struct Mirror {
    objects: Objects,
    /// Where the next watch starts; `None`: a LIST is needed first.
    resource_version: Option<String>,
    synced: bool,
    generation: u64,
    /// Objects changed since the last publication.
    dirty: bool,
    publisher: watch::Sender<Arc<Snapshot>>,
    /// The resourceVersion the published state is complete at, bookmarks included (see
    /// [`Mirror::progress`]).
    progress: watch::Sender<String>,
}

/// How many objects a LIST added, changed and removed relative to the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListOutcome {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
}

impl Mirror {
    pub fn new() -> (Self, watch::Receiver<Arc<Snapshot>>) {
        let (publisher, receiver) = watch::channel(Arc::new(Snapshot::default()));
        let (progress, _) = watch::channel(String::new());
        let mirror = Self {
            objects: Objects::new(),
            resource_version: None,
            synced: false,
            generation: 0,
            dirty: false,
            publisher,
            progress,
        };
        (mirror, receiver)
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.publisher.subscribe()
    }

    /// The resourceVersion up to which the published snapshots are complete, advanced by
    /// bookmarks too (which publish no snapshot). A consumer that must know its view has
    /// caught up with a revision it learnt elsewhere (a VM agent comparing its policy view
    /// with its VirtualMachine's) waits on this; it is updated only after the snapshot of the
    /// same events was published, so the latest snapshot is at least that recent.
    pub fn progress(&self) -> watch::Receiver<String> {
        self.progress.subscribe()
    }

    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Forgets the resume point: the next cycle lists. The objects stay until the LIST
    /// replaces them, so consumers keep the last state meanwhile.
    pub fn invalidate(&mut self) {
        self.resource_version = None;
    }

    /// Replaces the cache with a complete LIST read at `resource_version`. The LIST is applied
    /// to the cache as changes, so objects equal to the cached ones keep the cached `Arc` and
    /// the new state shares every untouched part of the old: consumers' diffs skip them.
    pub fn replace(&mut self, listed: Objects, resource_version: String) -> ListOutcome {
        let mut next = self.objects.clone();
        for key in self.objects.keys() {
            if !listed.contains_key(key) {
                next.remove(key);
            }
        }
        for (key, object) in listed {
            if next.get(&key) != Some(&object) {
                next.insert(key, object);
            }
        }
        let mut outcome = ListOutcome::default();
        for change in diff(&self.objects, &next) {
            match change {
                Change::Added { .. } => outcome.added += 1,
                Change::Modified { .. } => outcome.modified += 1,
                Change::Deleted { .. } => outcome.deleted += 1,
            }
        }
        self.dirty |= !self.synced || outcome != ListOutcome::default();
        self.objects = next;
        self.resource_version = Some(resource_version);
        self.synced = true;
        outcome
    }

    /// Applies one watch event; a replayed event that changes nothing leaves the cache clean.
    pub fn apply(&mut self, event: WatchEvent) {
        let resource_version = match event {
            WatchEvent::Upsert {
                key,
                resource_version,
                object,
                ..
            } => {
                self.dirty |= upsert(&mut self.objects, key, object);
                resource_version
            }
            WatchEvent::Deleted {
                key,
                resource_version,
            } => {
                self.dirty |= self.objects.remove(&key).is_some();
                resource_version
            }
            WatchEvent::Bookmark { resource_version } => resource_version,
        };
        self.resource_version = Some(resource_version);
    }

    /// Sends a new snapshot if the objects changed since the last one. A bookmark alone does
    /// not publish: consumers rebuild on every snapshot, and nothing they hold changed.
    pub fn publish(&mut self) {
        if self.dirty {
            self.publish_snapshot();
        }
        if let Some(resource_version) = &self.resource_version {
            if *self.progress.borrow() != *resource_version {
                self.progress.send_replace(resource_version.clone());
            }
        }
    }

    fn publish_snapshot(&mut self) {
        self.dirty = false;
        self.generation += 1;
        let snapshot = Snapshot {
            objects: self.objects.clone(),
            resource_version: self.resource_version.clone().unwrap_or_default(),
            synced: self.synced,
            generation: self.generation,
        };
        // send_replace stores the value even when no receiver is left (a consumer may
        // subscribe later).
        self.publisher.send_replace(Arc::new(snapshot));
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::ObjectKey;
    use serde_json::json;

    fn upsert_event(name: &str, rv: &str, spec: i64) -> WatchEvent {
        WatchEvent::Upsert {
            added: true,
            key: ObjectKey::new("", name),
            resource_version: rv.into(),
            object: json!({"spec": spec}),
        }
    }

    #[test]
    fn events_publish_once_per_batch_and_replays_do_not() {
        let (mut mirror, receiver) = Mirror::new();
        assert!(!receiver.borrow().synced);
        mirror.replace(Objects::new(), "1".into());
        mirror.publish();
        assert!(receiver.borrow().synced);
        assert_eq!(receiver.borrow().generation, 1);
        mirror.apply(upsert_event("a", "2", 1));
        mirror.apply(upsert_event("b", "3", 1));
        mirror.publish();
        assert_eq!(receiver.borrow().generation, 2);
        assert_eq!(receiver.borrow().resource_version, "3");
        mirror.apply(upsert_event("a", "2", 1));
        mirror.apply(WatchEvent::Bookmark {
            resource_version: "9".into(),
        });
        mirror.publish();
        assert_eq!(receiver.borrow().generation, 2, "nothing changed");
        assert_eq!(mirror.resource_version(), Some("9"));
        assert_eq!(
            *mirror.progress().borrow(),
            "9",
            "a bookmark advances the progress"
        );
        mirror.apply(WatchEvent::Deleted {
            key: ObjectKey::new("", "a"),
            resource_version: "10".into(),
        });
        mirror.publish();
        assert_eq!(receiver.borrow().objects.len(), 1);
    }

    #[test]
    fn relist_counts_the_net_difference_and_keeps_equal_objects_shared() {
        let (mut mirror, receiver) = Mirror::new();
        mirror.apply(upsert_event("a", "2", 1));
        mirror.apply(upsert_event("b", "3", 1));
        mirror.replace(
            mirror.objects.clone(),
            "3".into(), // the first list: publishes even though nothing differs
        );
        mirror.publish();
        let before = receiver.borrow().clone();
        let listed: Objects = [
            (ObjectKey::new("", "b"), Arc::new(json!({"spec": 1}))),
            (ObjectKey::new("", "c"), Arc::new(json!({"spec": 1}))),
        ]
        .into_iter()
        .collect();
        let outcome = mirror.replace(listed, "7".into());
        assert_eq!(
            outcome,
            ListOutcome {
                added: 1,
                modified: 0,
                deleted: 1
            }
        );
        mirror.publish();
        let after = receiver.borrow().clone();
        let key = ObjectKey::new("", "b");
        assert!(Arc::ptr_eq(&before.objects[&key], &after.objects[&key]));
        assert_eq!(after.changes_since(&before).len(), 2);
        mirror.invalidate();
        assert_eq!(mirror.resource_version(), None);
        assert_eq!(mirror.len(), 2);
    }
}
