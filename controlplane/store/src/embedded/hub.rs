//! Live changes from the writer to the watchers.
//!
//! Each watcher has its own bounded channel, filled with `try_send` by the writer after each
//! commit: a full channel never makes the writer wait; instead the watcher is dropped from the
//! hub and flagged lagged, its stream ends with [`crate::StoreError::Lagged`] once it has
//! drained what it had, and it re-watches from history. Memory per watcher is thus bounded by
//! its channel, and the store keeps nothing for slow readers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;

use crate::types::Event;

/// The watchers currently following live changes.
#[derive(Debug)]
pub(crate) struct Hub {
    state: Mutex<HubState>,
}

#[derive(Debug)]
struct HubState {
    /// The revision of the last change handed to the watchers.
    last_published: u64,
    /// `None` once the store has closed: new subscriptions end at once.
    watchers: Option<Vec<Watcher>>,
}

#[derive(Debug)]
struct Watcher {
    prefix: String,
    sender: mpsc::Sender<Event>,
    lagged: Arc<AtomicBool>,
}

/// A watcher's end of the hub.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// Every change under the prefix with a revision above `registered_at`, until it closes.
    pub receiver: mpsc::Receiver<Event>,
    /// Set when the hub dropped this watcher because its channel was full.
    pub lagged: Arc<AtomicBool>,
    /// The last revision published before this subscription: the watcher reads the changes up
    /// to it from the log.
    pub registered_at: u64,
}

impl Subscription {
    /// Whether the hub dropped this watcher for falling behind (rather than closing).
    pub fn was_lagged(&self) -> bool {
        self.lagged.load(Ordering::Acquire)
    }
}

impl Hub {
    /// A hub whose next change will have a revision above `current_revision`.
    pub fn new(current_revision: u64) -> Hub {
        Hub {
            state: Mutex::new(HubState {
                last_published: current_revision,
                watchers: Some(Vec::new()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, HubState> {
        // A panic while holding the lock cannot leave the watcher list half-updated in a way
        // that matters (a watcher is either in it or not), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a watcher for `prefix` with room for `capacity` changes.
    pub fn subscribe(&self, prefix: &str, capacity: usize) -> Subscription {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        let lagged = Arc::new(AtomicBool::new(false));
        let mut state = self.state();
        let registered_at = state.last_published;
        if let Some(watchers) = state.watchers.as_mut() {
            watchers.push(Watcher {
                prefix: prefix.to_owned(),
                sender,
                lagged: lagged.clone(),
            });
        }
        Subscription {
            receiver,
            lagged,
            registered_at,
        }
    }

    /// Hands a committed change to every watcher of its key. The caller publishes in revision
    /// order (it holds the write lock from commit to here).
    pub fn publish(&self, event: &Event) {
        let mut state = self.state();
        state.last_published = event.revision();
        let Some(watchers) = state.watchers.as_mut() else {
            return;
        };
        watchers.retain(|watcher| {
            if !event.key().starts_with(&watcher.prefix) {
                return !watcher.sender.is_closed();
            }
            match watcher.sender.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    watcher.lagged.store(true, Ordering::Release);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// The revision up to which `subscription` has received every change of its prefix: the
    /// last one published, if its channel is empty. `None` while changes wait in the channel or
    /// once the watcher was dropped.
    pub fn progress(&self, subscription: &Subscription) -> Option<u64> {
        // Changes are sent under this lock, so with it held an empty channel means every change
        // up to `last_published` was already taken.
        let state = self.state();
        let idle = subscription.receiver.is_empty() && !subscription.receiver.is_closed();
        (idle && state.watchers.is_some()).then_some(state.last_published)
    }

    /// Ends every watcher's live feed; used when the store is dropped.
    pub fn close(&self) {
        self.state().watchers = None;
    }

    /// How many watchers follow live changes (for tests and, later, metrics); watchers whose
    /// stream was dropped are otherwise only noticed at the next change.
    pub fn watcher_count(&self) -> usize {
        let mut state = self.state();
        let Some(watchers) = state.watchers.as_mut() else {
            return 0;
        };
        watchers.retain(|watcher| !watcher.sender.is_closed());
        watchers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::KeyValue;

    fn put(key: &str, revision: u64) -> Event {
        Event::Put {
            kv: KeyValue {
                key: key.into(),
                value: bytes::Bytes::new(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
            },
            prev: None,
        }
    }

    #[test]
    fn a_full_watcher_is_dropped_and_flagged_without_blocking() {
        let hub = Hub::new(4);
        let mut slow = hub.subscribe("/a/", 2);
        let mut other = hub.subscribe("/b/", 2);
        assert_eq!(slow.registered_at, 4);
        for revision in 5..10 {
            hub.publish(&put("/a/x", revision));
        }
        assert!(slow.was_lagged());
        assert_eq!(hub.watcher_count(), 1);
        assert_eq!(slow.receiver.try_recv().unwrap().revision(), 5);
        assert_eq!(slow.receiver.try_recv().unwrap().revision(), 6);
        assert!(slow.receiver.try_recv().is_err());
        assert!(other.receiver.try_recv().is_err());
        assert!(!other.was_lagged());
        assert_eq!(hub.subscribe("/c/", 1).registered_at, 9);
    }

    #[test]
    fn progress_is_the_last_publication_once_the_channel_is_drained() {
        let hub = Hub::new(3);
        let mut subscription = hub.subscribe("/a/", 4);
        assert_eq!(hub.progress(&subscription), Some(3));
        hub.publish(&put("/a/x", 4));
        hub.publish(&put("/b/x", 5));
        assert_eq!(
            hub.progress(&subscription),
            None,
            "revision 4 is still queued"
        );
        assert_eq!(subscription.receiver.try_recv().unwrap().revision(), 4);
        assert_eq!(hub.progress(&subscription), Some(5));
        hub.close();
        assert_eq!(hub.progress(&subscription), None);
    }

    #[test]
    fn closing_ends_every_feed_without_flagging_lag() {
        let hub = Hub::new(0);
        let mut subscription = hub.subscribe("/", 4);
        hub.close();
        assert!(matches!(
            subscription.receiver.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
        assert!(!subscription.was_lagged());
        let late = hub.subscribe("/", 4);
        assert_eq!(hub.watcher_count(), 0);
        drop(late);
    }
}
