//! Agent arrivals heard on the Redis pub/sub channel, fanned out to waiting data-plane tasks
//! through [`Arrivals`].

use std::sync::Arc;
use std::time::Duration;

use sluice_locator::Arrivals;

use crate::store::arrivals_channel;
use crate::{AgentId, RedisTarget};

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
            let client = target.single_client()?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, crate::TrackerError>(pubsub)
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
