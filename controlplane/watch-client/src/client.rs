//! The reflector loop: LIST, WATCH from the list's resourceVersion, resume, re-list on 410.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::config::{Resource, WatchClientConfig};
use crate::decode::{decode_event, decode_list, LineDecoder};
use crate::error::WatchError;
use crate::metrics::ResourceMetrics;
use crate::mirror::Mirror;
use crate::snapshot::{Objects, Snapshot};
use crate::transport::{next_chunk, read_body, Transport};

/// How many times a LIST whose continue token expired mid-way starts over before the cycle
/// fails (and is retried after a backoff).
const LIST_RESTARTS: u32 = 3;

/// Mirrors one resource of the API server into [`Snapshot`]s.
///
/// Build it with [`WatchClient::new`] (which checks the config), hand
/// [`WatchClient::subscribe`]'s receivers to the consumers, then drive [`WatchClient::run`]
/// on a tokio runtime until shutdown.
pub struct WatchClient {
    config: WatchClientConfig,
    resource: Resource,
    transport: Arc<Transport>,
    metrics: ResourceMetrics,
    mirror: Mirror,
    listed_once: bool,
    watched_once: bool,
}

/// What one cycle (optional LIST, then one WATCH) achieved; decides the pause before the next.
#[derive(Debug, Default)]
struct Cycle {
    listed: bool,
    events: u64,
    watch_lasted: Duration,
}

impl WatchClient {
    /// Checks the URL and loads the CA and client certificate; the token is read per request.
    pub fn new(
        config: WatchClientConfig,
        resource: Resource,
        metrics: ResourceMetrics,
    ) -> Result<Self, WatchError> {
        let transport = Arc::new(Transport::new(&config)?);
        Ok(Self::with_transport(config, resource, metrics, transport))
    }

    /// A client sending on `transport`, which others may share: clients of one identity on
    /// one Transport hold one h2 connection between them. `config`'s timeouts, backoff and
    /// bounds apply to this client; its URL, CA, certificate and token are the Transport's.
    pub fn with_transport(
        config: WatchClientConfig,
        resource: Resource,
        metrics: ResourceMetrics,
        transport: Arc<Transport>,
    ) -> Self {
        let (mirror, _) = Mirror::new();
        Self {
            config,
            resource,
            transport,
            metrics,
            mirror,
            listed_once: false,
            watched_once: false,
        }
    }

    /// A receiver of the snapshots: it holds the latest one at all times (initially empty and
    /// not `synced`); `changed()` wakes on each new one.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.mirror.subscribe()
    }

    /// A receiver of the resourceVersion the snapshots are complete at ([`Mirror::progress`]).
    pub fn progress(&self) -> watch::Receiver<String> {
        self.mirror.progress()
    }

    /// Runs until `stop` completes. Never returns early: every failure is logged, the last
    /// snapshot is kept, and the server is tried again after a backoff.
    ///
    /// Each cycle runs under `catch_unwind`: a panic while handling the server's data is
    /// logged, counted as an error, and followed by a fresh LIST (the cache may be
    /// half-updated), instead of silently freezing the consumers' view.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let mut stop = std::pin::pin!(stop);
        let path = self.resource.path();
        tracing::info!(%path, url = %self.config.url, "watch client starting");
        loop {
            let mut cycle = Cycle::default();
            let result = tokio::select! {
                result = std::panic::AssertUnwindSafe(self.cycle(&mut cycle)).catch_unwind() => {
                    result.unwrap_or_else(|panic| Err(WatchError::Panic(panic_message(&panic))))
                }
                () = &mut stop => break,
            };
            // Events applied before a failure are worth showing: they are the server's truth.
            self.mirror.publish();
            let pause = self.pause_after(&cycle, result, &mut backoff, &path);
            if pause.is_zero() {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = &mut stop => break,
            }
        }
        self.metrics.connected.set(0);
        tracing::info!(%path, "watch client stopped");
    }

    /// Logs the cycle's end and chooses the delay before the next one.
    fn pause_after(
        &mut self,
        cycle: &Cycle,
        result: Result<(), WatchError>,
        backoff: &mut Backoff,
        path: &str,
    ) -> Duration {
        // A watch that delivered events, or lived out most of its timeout, was healthy:
        // what follows starts from the shortest delay.
        let healthy = cycle.events > 0 || cycle.watch_lasted >= self.config.watch_timeout / 2;
        if healthy {
            backoff.reset();
        }
        match result {
            Ok(()) if healthy => Duration::ZERO,
            Ok(()) => {
                tracing::debug!(%path, "watch ended early without events");
                backoff.next_delay()
            }
            Err(error) if error.needs_relist() => {
                self.mirror.invalidate();
                tracing::info!(%path, %error, "re-listing");
                // An expired resume point is routine; a fresh list's version expiring at
                // once is not, and must not become a hot loop.
                if cycle.listed || matches!(error, WatchError::Panic(_)) {
                    if let WatchError::Panic(_) = error {
                        tracing::error!(%path, %error, "watch client cycle panicked");
                    }
                    backoff.next_delay()
                } else {
                    Duration::ZERO
                }
            }
            Err(error) => {
                self.metrics.connected.set(0);
                let delay = backoff.next_delay();
                tracing::warn!(%path, kind = error.kind(), %error, retry_in = ?delay,
                    objects = self.mirror.len(), "watch failed; keeping the last snapshot");
                delay
            }
        }
    }

    async fn cycle(&mut self, cycle: &mut Cycle) -> Result<(), WatchError> {
        if self.mirror.resource_version().is_none() {
            // An Expired answer to a LIST cannot be cured by listing again at once: make it
            // an ordinary failure, retried after a backoff (no hot loop on a broken server).
            self.list().await.map_err(|error| match error {
                WatchError::Expired(message) => WatchError::Status {
                    status: 410,
                    message: format!("list: {message}"),
                },
                other => other,
            })?;
            cycle.listed = true;
            self.mirror.publish();
        }
        self.watch(cycle).await
    }

    /// A complete, paged LIST replacing the cache in one step.
    async fn list(&mut self) -> Result<(), WatchError> {
        let mut restarts = 0;
        let (objects, resource_version) = loop {
            match self.list_pages().await {
                Err(WatchError::Expired(message)) if restarts < LIST_RESTARTS => {
                    // The continue token's revision was compacted between pages: the pages
                    // read so far belong to a revision that is gone; start over.
                    restarts += 1;
                    tracing::info!(path = %self.resource.path(), %message,
                        "continue token expired; restarting the list");
                }
                other => break other?,
            }
        };
        let outcome = self.mirror.replace(objects, resource_version.clone());
        if self.listed_once {
            self.metrics.relists.inc();
        }
        self.listed_once = true;
        self.metrics.touch();
        tracing::info!(path = %self.resource.path(), %resource_version,
            objects = self.mirror.len(), added = outcome.added, modified = outcome.modified,
            deleted = outcome.deleted, "listed");
        Ok(())
    }

    /// Every page of one LIST. An Expired answer to the first page is a server problem
    /// (nothing old was asked for) and is not retried here.
    async fn list_pages(&self) -> Result<(Objects, String), WatchError> {
        let mut objects = Objects::new();
        let mut continue_token: Option<String> = None;
        loop {
            let uri = self
                .resource
                .list_uri(self.config.page_size, continue_token.as_deref());
            let page = match self.list_page(&uri).await {
                Err(WatchError::Expired(message)) if continue_token.is_none() => {
                    return Err(WatchError::Status {
                        status: 410,
                        message: format!("first list page: {message}"),
                    })
                }
                other => other?,
            };
            for (key, item) in page.items {
                objects.insert(key, Arc::new(item));
            }
            match page.continue_token {
                Some(token) => continue_token = Some(token),
                None => return Ok((objects, page.resource_version)),
            }
        }
    }

    async fn list_page(&self, uri: &str) -> Result<crate::decode::ListPage, WatchError> {
        let limit = self.config.max_list_page_bytes;
        let read = async {
            let mut response = self.transport.get(uri).await?;
            let body = read_body(&mut response.body, limit, "list page").await?;
            decode_list(body)
        };
        tokio::time::timeout(self.config.request_timeout, read)
            .await
            .map_err(|_| WatchError::Timeout {
                what: "list page",
                after: self.config.request_timeout,
            })?
    }

    /// One watch from the mirror's resourceVersion until the server ends it (Ok), it fails,
    /// or it outlives `watch_timeout + watch_grace` (a dead connection that sends nothing).
    async fn watch(&mut self, cycle: &mut Cycle) -> Result<(), WatchError> {
        let resource_version = self.mirror.resource_version().unwrap_or("0").to_string();
        let uri = self
            .resource
            .watch_uri(&resource_version, self.config.watch_timeout);
        if self.watched_once {
            self.metrics.reconnects.inc();
        }
        self.watched_once = true;
        let started = Instant::now();
        let limit = self.config.watch_timeout + self.config.watch_grace;
        let deadline = started + limit;
        let timeout = || WatchError::Timeout {
            what: "watch",
            after: limit,
        };
        // The answer's head must come as fast as a LIST's; only the body may last.
        let head_timeout = self.config.request_timeout.min(limit);
        let mut response = tokio::time::timeout(head_timeout, self.transport.get(&uri))
            .await
            .map_err(|_| WatchError::Timeout {
                what: "watch answer",
                after: head_timeout,
            })??;
        self.metrics.connected.set(1);
        tracing::debug!(path = %self.resource.path(), %resource_version, "watching");
        let mut decoder = LineDecoder::new(self.config.max_event_bytes);
        let result = loop {
            let chunk =
                match tokio::time::timeout_at(deadline, next_chunk(&mut response.body)).await {
                    Err(_) => break Err(timeout()),
                    Ok(Err(error)) => break Err(error),
                    Ok(Ok(None)) => break Ok(()),
                    Ok(Ok(Some(chunk))) => chunk,
                };
            if let Err(error) = self.handle_chunk(&mut decoder, &chunk, cycle) {
                break Err(error);
            }
        };
        cycle.watch_lasted = started.elapsed();
        if result.is_ok() && decoder.pending() > 0 {
            tracing::debug!(bytes = decoder.pending(), "watch ended inside an event");
        }
        result
    }

    /// Decodes and applies the events a chunk completes, then publishes once for all of them.
    fn handle_chunk(
        &mut self,
        decoder: &mut LineDecoder,
        chunk: &[u8],
        cycle: &mut Cycle,
    ) -> Result<(), WatchError> {
        let lines = decoder.push(chunk)?;
        for line in lines {
            match decode_event(&line) {
                Ok(event) => {
                    self.metrics.event(event.type_label());
                    cycle.events += 1;
                    self.mirror.apply(event);
                }
                Err(error) => {
                    if matches!(error, WatchError::Expired(_) | WatchError::Status { .. }) {
                        self.metrics.event("ERROR");
                    }
                    return Err(error);
                }
            }
        }
        self.mirror.publish();
        Ok(())
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
