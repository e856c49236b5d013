//! Agent arrivals heard on the Redis pub/sub channel, fanned out to waiting data-plane tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_listener::{Event, EventListener};

use crate::store::arrivals_channel;
use crate::{AgentId, RedisTarget};

/// Waiters for agents, woken when any node announces the agent's arrival. Listeners are
/// `event-listener` futures, which monoio tasks await across threads.
#[derive(Debug, Default)]
pub struct Arrivals {
    events: Mutex<HashMap<AgentId, Arc<Event>>>,
    heard: std::sync::atomic::AtomicU64,
}

impl Arrivals {
    /// A listener that fires at the next arrival of `agent` (anywhere in the cluster). Create it
    /// before checking for a tunnel, so an arrival between the check and the wait is not missed.
    pub fn listen(&self, agent: AgentId) -> EventListener {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        events.entry(agent).or_default().listen()
    }

    /// Wakes every waiter of `agent`.
    pub fn notify(&self, agent: AgentId) {
        self.heard
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let event = {
            let mut events = self
                .events
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            events.remove(&agent)
        };
        if let Some(event) = event {
            event.notify(usize::MAX);
        }
    }

    /// Arrival messages heard so far.
    pub fn heard(&self) -> u64 {
        self.heard.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Subscribes to the arrivals channel for the life of the tracker, re-subscribing with backoff
/// after a Redis restart (arrivals announced while disconnected are covered by the waiters'
/// slow poll).
///
/// Every successful (re)subscription after the first is reported on `resubscribed`: the
/// connection to Redis was lost, Redis may have restarted empty, so the tracker re-registers
/// everything it holds.
pub(crate) async fn listen(
    target: RedisTarget,
    prefix: String,
    arrivals: Arc<Arrivals>,
    resubscribed: tokio::sync::mpsc::UnboundedSender<()>,
) {
    use tokio_stream_shim::next;
    let channel = arrivals_channel(&prefix);
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        let subscribed = async {
            let client = target.single_client().map_err(|error| error.to_string())?;
            let mut pubsub = client
                .get_async_pubsub()
                .await
                .map_err(|error| error.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|error| error.to_string())?;
            Ok::<_, String>(pubsub)
        }
        .await;
        match subscribed {
            Ok(mut pubsub) => {
                tracing::debug!(%channel, "subscribed to agent arrivals");
                backoff = Duration::from_millis(100);
                if !std::mem::take(&mut first) {
                    let _ = resubscribed.send(());
                }
                let mut messages = pubsub.on_message();
                while let Some(message) = next(&mut messages).await {
                    let payload: String = message.get_payload().unwrap_or_default();
                    if let Ok(agent) = payload.parse::<AgentId>() {
                        arrivals.notify(agent);
                    }
                }
                tracing::warn!("lost the agent arrivals subscription; re-subscribing");
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "cannot subscribe to agent arrivals")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// `Stream::next` without pulling in `futures-util`'s stream extensions for one call.
mod tokio_stream_shim {
    use std::future::poll_fn;
    use std::pin::Pin;

    pub(crate) async fn next<S: futures_core::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
        poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
    }
}
