//! Live changes from the writer to the watchers.
//!
//! Each watcher has its own bounded channel, filled with `try_send` by the writer after each
//! commit: a full channel never makes the writer wait; instead the watcher is dropped from the
//! hub and flagged lagged, its stream ends with [`crate::StoreError::Lagged`] once it has
//! drained what it had, and it re-watches from history. Memory per watcher is thus bounded by
//! its channel, and the store keeps nothing for slow readers.
//!
//! Watchers are grouped by prefix and a change is wrapped in one [`Arc`] shared by every
//! watcher of it: with thousands of watchers of a few prefixes (issue 36's fan-out), a commit
//! walks only the watchers that want it and copies no key or value per watcher under the hub's
//! lock (which the writer holds). Groups are found by looking the key's own first `n` bytes
//! up, for each prefix length in use, not by comparing the key with every prefix: 5,000 VM
//! agents each watching their own VM's key are 5,000 groups of a handful of lengths.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;

use crate::types::Event;

/// A group is swept of watchers whose stream was dropped once it has grown to this many, and
/// then each time it doubles (so the sweeps cost O(1) per subscription). The groups as a whole
/// are swept the same way, from this many.
const FIRST_SWEEP: usize = 16;

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
    groups: Option<Groups>,
}

/// The groups by prefix, and how many prefixes there are of each length.
#[derive(Debug)]
struct Groups {
    by_prefix: HashMap<String, Group>,
    lengths: BTreeMap<usize, usize>,
    /// The number of groups at which every group is next swept (a group whose watchers all
    /// left is otherwise only noticed when its prefix gets a change).
    sweep_at: usize,
}

impl Groups {
    fn new() -> Groups {
        Groups {
            by_prefix: HashMap::new(),
            lengths: BTreeMap::new(),
            sweep_at: FIRST_SWEEP,
        }
    }

    fn insert(&mut self, prefix: &str, watcher: Watcher) {
        if let Some(group) = self.by_prefix.get_mut(prefix) {
            if group.watchers.len() >= group.sweep_at {
                group.sweep();
            }
            group.watchers.push(watcher);
            return;
        }
        if self.by_prefix.len() >= self.sweep_at {
            self.sweep();
        }
        *self.lengths.entry(prefix.len()).or_default() += 1;
        let group = Group {
            watchers: vec![watcher],
            sweep_at: FIRST_SWEEP,
        };
        self.by_prefix.insert(prefix.to_owned(), group);
    }

    fn remove(&mut self, prefix: &str) {
        if self.by_prefix.remove(prefix).is_none() {
            return;
        }
        if let Some(count) = self.lengths.get_mut(&prefix.len()) {
            *count -= 1;
            if *count == 0 {
                self.lengths.remove(&prefix.len());
            }
        }
    }

    fn sweep(&mut self) {
        self.by_prefix.values_mut().for_each(Group::sweep);
        let empty: Vec<String> = self
            .by_prefix
            .iter()
            .filter(|(_, group)| group.watchers.is_empty())
            .map(|(prefix, _)| prefix.clone())
            .collect();
        for prefix in empty {
            self.remove(&prefix);
        }
        self.sweep_at = (self.by_prefix.len() * 2).max(FIRST_SWEEP);
    }
}

/// The watchers of one prefix.
#[derive(Debug)]
struct Group {
    watchers: Vec<Watcher>,
    /// The size at which a subscription next sweeps closed watchers out.
    sweep_at: usize,
}

impl Group {
    fn sweep(&mut self) {
        self.watchers.retain(|watcher| !watcher.sender.is_closed());
        self.sweep_at = (self.watchers.len() * 2).max(FIRST_SWEEP);
    }
}

#[derive(Debug)]
struct Watcher {
    sender: mpsc::Sender<Arc<Event>>,
    lagged: Arc<AtomicBool>,
}

/// A watcher's end of the hub.
#[derive(Debug)]
pub(crate) struct Subscription {
    /// Every change under the prefix with a revision above `registered_at`, until it closes.
    pub receiver: mpsc::Receiver<Arc<Event>>,
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
                groups: Some(Groups::new()),
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
        if let Some(groups) = state.groups.as_mut() {
            let watcher = Watcher {
                sender,
                lagged: lagged.clone(),
            };
            groups.insert(prefix, watcher);
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
        let Some(groups) = state.groups.as_mut() else {
            return;
        };
        let key = event.key();
        let mut shared: Option<Arc<Event>> = None;
        let mut emptied = Vec::new();
        for &length in groups.lengths.keys() {
            let Some(prefix) = key.get(..length) else {
                // Longer than the key, or inside one of its characters: no prefix of it.
                continue;
            };
            let Some(group) = groups.by_prefix.get_mut(prefix) else {
                continue;
            };
            let shared = shared.get_or_insert_with(|| Arc::new(event.clone()));
            group
                .watchers
                .retain(|watcher| match watcher.sender.try_send(shared.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        watcher.lagged.store(true, Ordering::Release);
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                });
            if group.watchers.is_empty() {
                emptied.push(length);
            }
        }
        for length in emptied {
            if let Some(prefix) = key.get(..length) {
                groups.remove(prefix);
            }
        }
    }

    /// The revision up to which `subscription` has received every change of its prefix: the
    /// last one published, if its channel is empty. `None` while changes wait in the channel or
    /// once the watcher was dropped.
    pub fn progress(&self, subscription: &Subscription) -> Option<u64> {
        // Changes are sent under this lock, so with it held an empty channel means every change
        // up to `last_published` was already taken.
        let state = self.state();
        let idle = subscription.receiver.is_empty() && !subscription.receiver.is_closed();
        (idle && state.groups.is_some()).then_some(state.last_published)
    }

    /// Ends every watcher's live feed; used when the store is dropped.
    pub fn close(&self) {
        self.state().groups = None;
    }

    /// How many watchers follow live changes (for tests and, later, metrics); watchers whose
    /// stream was dropped are otherwise only noticed at the next change of their prefix.
    pub fn watcher_count(&self) -> usize {
        let mut state = self.state();
        let Some(groups) = state.groups.as_mut() else {
            return 0;
        };
        groups.sweep();
        groups
            .by_prefix
            .values()
            .map(|group| group.watchers.len())
            .sum()
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
    fn every_watcher_of_a_change_shares_one_copy_in_revision_order() {
        let hub = Hub::new(0);
        let mut first = hub.subscribe("/a/", 4);
        let mut second = hub.subscribe("/a/", 4);
        let mut everything = hub.subscribe("/", 4);
        let mut other = hub.subscribe("/b/", 4);
        hub.publish(&put("/a/x", 1));
        hub.publish(&put("/b/x", 2));
        hub.publish(&put("/a/y", 3));
        let taken = |subscription: &mut Subscription| {
            std::iter::from_fn(|| subscription.receiver.try_recv().ok()).collect::<Vec<_>>()
        };
        let (first, second, everything) = (
            taken(&mut first),
            taken(&mut second),
            taken(&mut everything),
        );
        let revisions =
            |events: &[Arc<Event>]| -> Vec<u64> { events.iter().map(|e| e.revision()).collect() };
        assert_eq!(revisions(&first), vec![1, 3]);
        assert_eq!(revisions(&everything), vec![1, 2, 3]);
        assert!(Arc::ptr_eq(&first[0], &second[0]));
        assert!(Arc::ptr_eq(&first[1], &everything[2]));
        assert_eq!(revisions(&taken(&mut other)), vec![2]);
    }

    #[test]
    fn watchers_that_come_and_go_are_swept_out_of_a_quiet_prefix() {
        let hub = Hub::new(0);
        let _kept: Vec<_> = (0..3).map(|_| hub.subscribe("/quiet/", 1)).collect();
        for _ in 0..1_000 {
            drop(hub.subscribe("/quiet/", 1));
            let state = hub.state();
            let held = state
                .groups
                .as_ref()
                .map_or(0, |groups| groups.by_prefix["/quiet/"].watchers.len());
            assert!(held <= FIRST_SWEEP.max(2 * 4), "{held} watchers held");
        }
        assert_eq!(hub.watcher_count(), 3);
        hub.publish(&put("/loud/x", 1));
        assert_eq!(hub.watcher_count(), 3);
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

    #[test]
    fn a_change_reaches_exactly_the_prefixes_of_its_key() {
        let hub = Hub::new(0);
        let prefixes = [
            "",
            "/",
            "/a",
            "/a/",
            "/a/x",
            "/a/xy",
            "/b/",
            "/é",
            "/a/x/longer",
        ];
        let mut subscriptions: Vec<_> = prefixes.iter().map(|p| hub.subscribe(p, 8)).collect();
        hub.publish(&put("/a/x", 1));
        hub.publish(&put("/éa", 2));
        for (prefix, subscription) in prefixes.iter().zip(subscriptions.iter_mut()) {
            let got: Vec<u64> = std::iter::from_fn(|| subscription.receiver.try_recv().ok())
                .map(|event| event.revision())
                .collect();
            let want: Vec<u64> = [("/a/x", 1), ("/éa", 2)]
                .iter()
                .filter(|(key, _)| key.starts_with(prefix))
                .map(|(_, revision)| *revision)
                .collect();
            assert_eq!(got, want, "prefix {prefix:?}");
        }
    }

    #[test]
    fn groups_whose_watchers_left_are_swept_as_new_ones_come() {
        let hub = Hub::new(0);
        for index in 0..1_000 {
            drop(hub.subscribe(&format!("/vm/{index}"), 1));
            let state = hub.state();
            let groups = state
                .groups
                .as_ref()
                .map_or(0, |groups| groups.by_prefix.len());
            assert!(groups <= 2 * FIRST_SWEEP, "{groups} groups held");
        }
        assert_eq!(hub.watcher_count(), 0);
        assert!(hub.state().groups.as_ref().unwrap().lengths.is_empty());
    }
}
