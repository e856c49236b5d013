//! The fan-out's light watchers (`SLUICE_PERF_FANOUT=client=raw`): a LIST then a WATCH over the
//! same `Transport` as the product's client, but each event line is scanned for the object's
//! name and the send-time annotation instead of decoded, mirrored and diffed. They measure the
//! control plane's delivery when the product's client would need more cores than the harness
//! has (issue 36 asks for watchers "spread so the client side is not the limit"); the server
//! sees the same requests and sends the same bytes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use http_body_util::BodyExt;
use sluice_watch_client::{Resource, Transport};
use tokio::sync::watch;

use super::fanout::{Plan, SENT_ANNOTATION};
use super::fanout_peers::{parse_sent, Tally, Watchers, WriteLog};

/// Longest event line taken: the fan-out's objects are a few hundred bytes.
const MAX_LINE: usize = 1 << 20;
/// Objects in the LIST that starts a watch: the fan-out set is 20 of each kind.
const LIST_LIMIT: u32 = 500;

/// Why a light watcher stopped before the run did.
#[derive(Debug, thiserror::Error)]
pub enum RawWatchError {
    #[error("{0}")]
    Watch(#[from] sluice_watch_client::WatchError),
    #[error("body: {0}")]
    Body(String),
    #[error("the LIST answer is not a list with a resourceVersion")]
    List,
    #[error("an event line longer than {MAX_LINE} bytes")]
    LongLine,
    #[error("the server ended the watch")]
    Ended,
}

/// What one light watcher needs; `run` consumes it.
pub struct RawWatcher {
    pub transport: Arc<Transport>,
    pub resource: Resource,
    pub watch_timeout: Duration,
    pub tally: Arc<Mutex<Tally>>,
    pub plan: Plan,
    pub log: Arc<WriteLog>,
    pub watchers: Arc<Watchers>,
    pub first_sync: tokio::sync::mpsc::Sender<()>,
    pub stopping: watch::Receiver<bool>,
}

impl RawWatcher {
    /// Lists, reports its first sync, then scans the watch's events until the run stops; an
    /// error or an end before that counts as a failed watcher.
    pub async fn run(self) {
        let watchers = self.watchers.clone();
        if let Err(error) = self.list_then_watch().await {
            eprintln!("fanout raw watcher: {error}");
            watchers.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn list_then_watch(mut self) -> Result<(), RawWatchError> {
        let listed = self
            .transport
            .get(&self.resource.list_uri(LIST_LIMIT, None))
            .await?;
        let body = listed
            .body
            .collect()
            .await
            .map_err(|error| RawWatchError::Body(error.to_string()))?
            .to_bytes();
        let list: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| RawWatchError::List)?;
        let version = list
            .pointer("/metadata/resourceVersion")
            .and_then(|v| v.as_str())
            .ok_or(RawWatchError::List)?
            .to_string();
        for item in list["items"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            self.observe(&serde_json::to_vec(item).unwrap_or_default());
        }
        let _ = self.first_sync.send(()).await;
        let mut watching = self
            .transport
            .get(&self.resource.watch_uri(&version, self.watch_timeout))
            .await?;
        let mut pending = BytesMut::new();
        loop {
            let frame = tokio::select! {
                frame = watching.body.frame() => frame,
                _ = self.stopping.wait_for(|stop| *stop) => return Ok(()),
            };
            let Some(frame) = frame else {
                return Err(RawWatchError::Ended);
            };
            let frame = frame.map_err(|error| RawWatchError::Body(error.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&byte| byte == b'\n') {
                let line = pending.split_to(end + 1);
                if find(&line, b"\"type\":\"MODIFIED\"").is_some() {
                    self.watchers.raw_events.fetch_add(1, Ordering::Relaxed);
                    self.observe(&line);
                }
            }
            if pending.len() > MAX_LINE {
                return Err(RawWatchError::LongLine);
            }
        }
    }

    /// Takes in the object an event line (or a listed item) carries, if it is of the set.
    fn observe(&self, line: &[u8]) {
        let Some((object, seq)) = scan(line) else {
            return;
        };
        let now = u64::try_from(super::fleet::now_nanos()).unwrap_or(u64::MAX);
        if let Ok(mut tally) = self.tally.lock() {
            tally.observe(&self.plan, &self.log, object, seq, now);
        }
    }
}

/// The fan-out object's index and the written sequence number in a serialized object or event:
/// the first `"name":"fanout-NNN"` and the send-time annotation's value.
fn scan(line: &[u8]) -> Option<(usize, u64)> {
    let name = b"\"name\":\"fanout-";
    let at = find(line, name)? + name.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let object = std::str::from_utf8(&line[at..at + digits])
        .ok()?
        .parse()
        .ok()?;
    let key = format!("\"{SENT_ANNOTATION}\":\"");
    let at = find(line, key.as_bytes())? + key.len();
    let length = line[at..].iter().position(|&byte| byte == b'"')?;
    let (seq, _) = parse_sent(std::str::from_utf8(&line[at..at + length]).ok()?)?;
    Some((object, seq))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_line_gives_its_object_and_sequence() {
        let line = format!(
            "{{\"type\":\"MODIFIED\",\"object\":{{\"metadata\":{{\"name\":\"fanout-007\",\
             \"annotations\":{{\"{SENT_ANNOTATION}\":\"12 1700000000000000000\"}}}}}}}}\n"
        );
        assert_eq!(scan(line.as_bytes()), Some((7, 12)));
    }

    #[test]
    fn other_objects_and_broken_lines_give_nothing() {
        let other = format!(
            "{{\"metadata\":{{\"name\":\"other-1\",\"annotations\":{{\"{SENT_ANNOTATION}\":\"1 1\"}}}}}}"
        );
        assert_eq!(scan(other.as_bytes()), None);
        assert_eq!(scan(b"{\"metadata\":{\"name\":\"fanout-001\"}}"), None);
        let cut = format!("{{\"metadata\":{{\"name\":\"fanout-001\",\"annotations\":{{\"{SENT_ANNOTATION}\":\"3 1");
        assert_eq!(scan(cut.as_bytes()), None);
        assert_eq!(
            scan(b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{}}}"),
            None
        );
    }
}
