//! Property tests against a model, generic over the backend: random writes, watches started at
//! random revisions while the writes go on (some cut for lagging and resumed, as a client
//! does), compaction, and lists at every readable revision. The model is a map per revision
//! and the list of every change, from the store's revision when the case starts (`base`).
//! `tests/model.rs` runs the cases on the embedded store, `tests/etcd.rs` on etcd.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use proptest::prelude::*;
use sluice_store::{Event, KeyValue, Store, StoreError};

const KEYS: [&str; 6] = ["/a/0", "/a/1", "/a/2", "/b/0", "/b/1", "/b/2"];
const PREFIXES: [&str; 3] = ["/a/", "/b/", "/"];

/// What a write expects of the key's mod_revision.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    Nothing,
    Current,
    Stale,
}

#[derive(Debug, Clone)]
pub enum Step {
    Create {
        key: usize,
        value: u8,
    },
    Update {
        key: usize,
        value: u8,
        expect: Expect,
    },
    Delete {
        key: usize,
        expect: Expect,
    },
    /// Start a watch on `PREFIXES[prefix]` at a revision between 0 and two past the current
    /// one (`start` is a per-mille of that range); a `slow` one pauses after each batch, so
    /// with a small buffer it lags and resumes.
    Watch {
        prefix: usize,
        start: u16,
        slow: bool,
    },
    /// Compact to a revision between the compaction point and now (a per-mille of that range).
    Compact {
        at: u16,
    },
}

pub fn step(with_compaction: bool) -> impl Strategy<Value = Step> {
    let expect = prop_oneof![
        Just(Expect::Nothing),
        Just(Expect::Current),
        Just(Expect::Stale)
    ];
    let writes = prop_oneof![
        3 => (0..KEYS.len(), any::<u8>()).prop_map(|(key, value)| Step::Create { key, value }),
        3 => (0..KEYS.len(), any::<u8>(), expect.clone())
            .prop_map(|(key, value, expect)| Step::Update { key, value, expect }),
        2 => (0..KEYS.len(), expect).prop_map(|(key, expect)| Step::Delete { key, expect }),
    ];
    if with_compaction {
        prop_oneof![8 => writes, 1 => (0..=1000u16).prop_map(|at| Step::Compact { at })].boxed()
    } else {
        prop_oneof![
            8 => writes,
            2 => (0..PREFIXES.len(), 0..=1000u16, any::<bool>())
                .prop_map(|(prefix, start, slow)| Step::Watch { prefix, start, slow }),
        ]
        .boxed()
    }
}

/// The refusals, compared by kind (and the conflict's current state).
#[derive(Debug, PartialEq)]
enum Refusal {
    NotFound,
    AlreadyExists,
    Conflict(KeyValue),
}

fn refusal(error: StoreError) -> Refusal {
    match error {
        StoreError::NotFound { .. } => Refusal::NotFound,
        StoreError::AlreadyExists { .. } => Refusal::AlreadyExists,
        StoreError::Conflict { current } => Refusal::Conflict(*current),
        other => panic!("unexpected store error: {other}"),
    }
}

/// What the store should hold: the keys after each revision from `base` on and every change.
struct Model {
    base: u64,
    snapshots: Vec<BTreeMap<String, KeyValue>>,
    events: Vec<Event>,
    compacted: u64,
}

impl Model {
    /// The model of an empty store (or namespace) at revision `base`, compacted to `compacted`.
    fn new(base: u64, compacted: u64) -> Model {
        Model {
            base,
            snapshots: vec![BTreeMap::new()],
            events: Vec::new(),
            compacted,
        }
    }

    fn revision(&self) -> u64 {
        self.base + self.snapshots.len() as u64 - 1
    }

    /// The keys as of revision `at` (at least `base`).
    fn snapshot(&self, at: u64) -> &BTreeMap<String, KeyValue> {
        &self.snapshots[(at - self.base) as usize]
    }

    fn expected(&self, key: &str, expect: Expect) -> Option<u64> {
        let current = self
            .snapshots
            .last()?
            .get(key)
            .map_or(1, |kv| kv.mod_revision);
        match expect {
            Expect::Nothing => None,
            Expect::Current => Some(current),
            Expect::Stale => Some(current + 1000),
        }
    }

    /// Applies a write (`value: None` deletes); returns what the store must answer.
    fn write(
        &mut self,
        key: &str,
        value: Option<Bytes>,
        create: bool,
        expected: Option<u64>,
    ) -> Result<KeyValue, Refusal> {
        let revision = self.revision() + 1;
        let mut keys = self.snapshots.last().cloned().unwrap_or_default();
        let current = keys.get(key).cloned();
        let event = match (current, value) {
            (Some(_), Some(_)) if create => return Err(Refusal::AlreadyExists),
            (None, Some(value)) if create => {
                let kv = KeyValue {
                    key: key.into(),
                    value,
                    create_revision: revision,
                    mod_revision: revision,
                    version: 1,
                };
                Event::Put { kv, prev: None }
            }
            (None, _) => return Err(Refusal::NotFound),
            (Some(prev), _) if expected.is_some_and(|e| e != prev.mod_revision) => {
                return Err(Refusal::Conflict(prev))
            }
            (Some(prev), Some(value)) => {
                let kv = KeyValue {
                    value,
                    mod_revision: revision,
                    version: prev.version + 1,
                    ..prev.clone()
                };
                Event::Put {
                    kv,
                    prev: Some(prev),
                }
            }
            (Some(prev), None) => Event::Delete { prev, revision },
        };
        let answer = match &event {
            Event::Put { kv, .. } => {
                keys.insert(key.into(), kv.clone());
                kv.clone()
            }
            Event::Delete { prev, .. } => {
                keys.remove(key);
                prev.clone()
            }
        };
        self.snapshots.push(keys);
        self.events.push(event);
        Ok(answer)
    }

    fn changes(&self, prefix: &str, after: u64, through: u64) -> Vec<Event> {
        let in_range = |event: &&Event| (after + 1..=through).contains(&event.revision());
        let matching = |event: &&Event| event.key().starts_with(prefix);
        self.events
            .iter()
            .filter(in_range)
            .filter(matching)
            .cloned()
            .collect()
    }
}

/// Applies one write to both and checks the store answers as the model does.
async fn write(store: &dyn Store, model: &mut Model, step: &Step) {
    let (key, value, create, expect) = match *step {
        Step::Create { key, value } => (KEYS[key], Some(value), true, Expect::Nothing),
        Step::Update { key, value, expect } => (KEYS[key], Some(value), false, expect),
        Step::Delete { key, expect } => (KEYS[key], None, false, expect),
        Step::Watch { .. } | Step::Compact { .. } => return,
    };
    let value = value.map(|byte| Bytes::from(vec![byte; 1 + byte as usize % 5]));
    let expected = model.expected(key, expect);
    let answer = match (create, value.clone()) {
        (true, Some(value)) => store.create(key, value).await,
        (false, Some(value)) => store.update(key, value, expected).await,
        (_, None) => store.delete(key, expected).await,
    };
    let want = model.write(key, value, create, expected);
    assert_eq!(answer.map_err(refusal), want, "{step:?}");
}

/// How a test watch reads its stream.
struct Follower {
    prefix: &'static str,
    start: u64,
    /// The watch ends when it delivers this key.
    stop_key: &'static str,
    slow: bool,
}

/// Follows a watch until it delivers `stop_key`, re-watching after `Lagged` as a client does.
/// Returns the changes and how many times it lagged.
async fn follow(store: Arc<dyn Store>, follower: Follower) -> (Vec<Event>, usize) {
    let Follower {
        prefix,
        start,
        stop_key,
        slow,
    } = follower;
    let mut lags = 0;
    let mut events: Vec<Event> = Vec::new();
    let mut reported = start;
    let mut stream = store.watch(prefix, start);
    loop {
        let item = tokio::time::timeout(crate::common::DEADLINE, stream.next()).await;
        match item.expect("a watch stalled") {
            Some(Ok(batch)) => {
                assert!(batch.revision >= reported, "a watch's revision went back");
                reported = batch.revision;
                let done = batch.events.iter().any(|event| event.key() == stop_key);
                events.extend(batch.events);
                if done {
                    return (events, lags);
                }
                if slow {
                    tokio::time::sleep(Duration::from_millis(4)).await;
                }
            }
            Some(Err(StoreError::Lagged { last_revision })) => {
                assert!(last_revision >= reported, "lagged behind what it reported");
                reported = last_revision;
                lags += 1;
                stream = store.watch(prefix, last_revision);
            }
            other => panic!("watch of {prefix} from {start} failed: {other:?}"),
        }
    }
}

fn scaled(per_mille: u16, low: u64, high: u64) -> u64 {
    low + (high - low) * u64::from(per_mille) / 1000
}

/// Runs `steps` with watches on an empty `store` (or namespace of one, whose revisions no one
/// else moves meanwhile); returns how many times the watches lagged.
///
/// Progress reports should come often: one that ran ahead of a queued change would make the
/// watch skip it.
pub async fn watches_match(store: Arc<dyn Store>, steps: Vec<Step>) -> usize {
    let base = store
        .current_revision()
        .await
        .expect("the current revision");
    let compacted = store
        .compact_revision()
        .await
        .expect("the compaction point");
    let mut model = Model::new(base, compacted);
    let mut watches = Vec::new();
    for step in &steps {
        if let Step::Watch {
            prefix,
            start,
            slow,
        } = *step
        {
            let prefix = PREFIXES[prefix];
            let start = scaled(start, base, model.revision() + 2);
            // "/" stops at the last sentinel, written under "/b/".
            let stop = if prefix == "/a/" { "/a/end" } else { "/b/end" };
            let follower = Follower {
                prefix,
                start,
                stop_key: stop,
                slow,
            };
            let task = tokio::spawn(follow(store.clone(), follower));
            watches.push((prefix, start, task));
        }
        write(&*store, &mut model, step).await;
    }
    // A watch may start past the last write: fill up to its start so its sentinel follows it.
    let latest_start = watches
        .iter()
        .map(|(_, start, _)| *start)
        .max()
        .unwrap_or(0);
    while model.revision() < latest_start {
        let create = !model
            .snapshots
            .last()
            .is_some_and(|keys| keys.contains_key("/c"));
        let answer = if create {
            store.create("/c", Bytes::new()).await
        } else {
            store.update("/c", Bytes::new(), None).await
        };
        assert_eq!(
            answer.map_err(refusal),
            model.write("/c", Some(Bytes::new()), create, None)
        );
    }
    for sentinel in ["/a/end", "/b/end"] {
        let answer = store.create(sentinel, Bytes::new()).await.map_err(refusal);
        let want = model.write(sentinel, Some(Bytes::new()), true, None);
        assert_eq!(answer, want, "{sentinel}");
    }
    let mut lags = 0;
    for (prefix, start, task) in watches {
        let (seen, lagged) = task.await.expect("the watch task");
        let want = model.changes(prefix, start, model.revision());
        assert_eq!(seen, want, "watch of {prefix} after revision {start}");
        lags += lagged;
    }
    lags
}

/// Runs `steps` with compactions on an empty `store` (or namespace of one, whose revisions no
/// one else moves meanwhile), then lists at every revision and watches from the compaction
/// point.
pub async fn lists_match(store: Arc<dyn Store>, steps: Vec<Step>, page: usize) {
    let base = store
        .current_revision()
        .await
        .expect("the current revision");
    let compacted = store
        .compact_revision()
        .await
        .expect("the compaction point");
    let mut model = Model::new(base, compacted);
    for step in &steps {
        if let Step::Compact { at } = *step {
            let target = scaled(at, model.compacted, model.revision());
            store.compact(target).await.expect("compaction");
            model.compacted = model.compacted.max(target);
        }
        write(&*store, &mut model, step).await;
    }
    assert_eq!(
        store.compact_revision().await.expect("compact revision"),
        model.compacted
    );
    for at in base..=model.revision() {
        if at < model.compacted {
            let error = store
                .list("/", None, page, Some(at))
                .await
                .expect_err("compacted");
            assert!(matches!(error, StoreError::Compacted { .. }), "{error}");
            continue;
        }
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let listed = store
                .list("/", after.as_deref(), page, Some(at))
                .await
                .expect("list");
            assert_eq!(listed.revision, at);
            items.extend(listed.items);
            if !listed.more {
                break;
            }
            after = items.last().map(|kv: &KeyValue| kv.key.clone());
        }
        let want: Vec<KeyValue> = model.snapshot(at).values().cloned().collect();
        assert_eq!(items, want, "list at revision {at}");
    }
    for key in KEYS {
        let want = model
            .snapshots
            .last()
            .and_then(|keys| keys.get(key))
            .cloned();
        assert_eq!(store.get(key).await.expect("get"), want);
    }
    let mut watch = store.watch("/", model.compacted);
    let want = model.changes("/", model.compacted, model.revision());
    if let Some(last) = want.last() {
        assert_eq!(
            crate::common::events_until(&mut watch, last.revision()).await,
            want
        );
    }
}
