//! Watch events encoded once for every watcher that sees them unchanged. With a thousand
//! watchers of one resource, decoding the stored object and encoding the event per watcher
//! was the control plane's whole cost per write (perf/README.md); watchers without selectors,
//! in the object format and allowed to see everything all send the same line for a change, so
//! the first one to need it encodes it and the others copy a `Bytes` handle.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;

/// How many recent changes' lines are kept: enough for every watcher to pass a burst of
/// writes, small enough to bound memory (lines are at most the store's value limit plus the
/// envelope, typically a few KiB).
const KEPT: usize = 1024;

/// One change as a watcher sends it: its revision, the object's key, the event type.
pub type EventKey = (u64, String, &'static str);

#[derive(Debug, Default)]
pub struct EncodedEvents {
    lines: Mutex<BTreeMap<EventKey, Bytes>>,
}

impl EncodedEvents {
    /// The line for `key`, encoded by `encode` if no watcher did yet; `None` when encoding
    /// fails (the stored object does not parse).
    pub fn line(&self, key: EventKey, encode: impl FnOnce() -> Option<Bytes>) -> Option<Bytes> {
        if let Some(line) = self.lock().get(&key) {
            return Some(line.clone());
        }
        // Encoded outside the lock: two watchers may both encode the same change, which is
        // cheaper than making every watcher wait behind one encoding.
        let line = encode()?;
        let mut lines = self.lock();
        lines.insert(key, line.clone());
        while lines.len() > KEPT {
            lines.pop_first();
        }
        Some(line)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<EventKey, Bytes>> {
        // The map stays consistent even if a holder panicked: every change is one insert or
        // one removal.
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_encoded_once_and_old_ones_are_dropped() {
        let events = EncodedEvents::default();
        let mut encodings = 0;
        for _ in 0..3 {
            let line = events.line((7, "/k".into(), "ADDED"), || {
                encodings += 1;
                Some(Bytes::from_static(b"{}\n"))
            });
            assert_eq!(line.as_deref(), Some(&b"{}\n"[..]));
        }
        assert_eq!(encodings, 1);
        for revision in 0..(KEPT as u64 + 10) {
            events.line((100 + revision, "/k".into(), "MODIFIED"), || {
                Some(Bytes::new())
            });
        }
        assert_eq!(events.lock().len(), KEPT);
        assert!(!events.lock().contains_key(&(7, "/k".into(), "ADDED")));
    }
}
