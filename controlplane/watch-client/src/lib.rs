//! Mirrors one resource of Sluice's kube-like API server for a data-plane role: a small
//! reflector + informer in the manner of client-go's.
//!
//! ```text
//! LIST (pages: limit + continue; an expired continue token restarts the list)
//!   └─▶ WATCH ?watch=1&resourceVersion=<list rv>&allowWatchBookmarks=true&timeoutSeconds=N
//!         events (ADDED/MODIFIED/DELETED/BOOKMARK) advance the resume point
//!         server ends the watch / connection drops ─▶ WATCH again from the last resourceVersion
//!         410 (HTTP, or an ERROR event with a 410 Status) ─▶ LIST again, diffed against the cache
//!         server unreachable ─▶ last snapshot kept, retried with jittered exponential backoff
//! ```
//!
//! # What consumers get, and why a `watch` channel of snapshots
//!
//! [`WatchClient::subscribe`] returns a `tokio::sync::watch::Receiver<Arc<Snapshot>>`: the
//! complete, immutable state of the resource (objects by namespace/name, the resourceVersion,
//! whether a LIST has completed). It is level-based, as client-go's informers are meant to be
//! used:
//! - the gateway swaps its whole generation atomically: it compiles each snapshot it sees and
//!   stores the result with `arc-swap`; a re-list after 410 arrives as one new snapshot, never
//!   as a half-applied stream of events;
//! - the tunnel node closes a deleted agent's tunnels: it keeps the previous snapshot and calls
//!   [`Snapshot::changes_since`], which yields the net adds, updates and deletes between the
//!   two. A consumer that was slow (several snapshots coalesced) still sees every delete, and
//!   an object a watch resumed or a re-list repeated is never reported twice;
//! - the reflector never waits for a consumer and no queue grows: a `watch` channel holds only
//!   the latest value. An event callback would have to be either blocking (a slow consumer
//!   stalls the watch until the server drops it) or queued (unbounded memory), and the
//!   consumer would still need a full state after a re-list.
//!
//! Snapshots share their objects (`Arc<serde_json::Value>`) and the tree that holds them
//! ([`Objects`] is a persistent map), so publishing one costs the paths to the objects its
//! events changed, and comparing two costs those objects, however many the resource holds
//! (`tests/publication_cost.rs`); a snapshot is published once per received chunk of events,
//! not per event, and not at all for bookmarks.
//!
//! # Bounds against a broken or hostile server
//! Event lines over `max_event_bytes` and list pages over `max_list_page_bytes` are refused
//! with [`WatchError::TooLarge`] and the watch is re-established; a watch that stays open
//! `watch_grace` past its `timeoutSeconds` is treated as a dead connection. Only https is
//! accepted.
//!
//! # Metrics ([`WatchMetrics`]), labelled by the caller's fixed `resource` name
//! `sluice_controlplane_watch_connected`, `..._last_event_timestamp_seconds` (a Unix time, so
//! the age is `time() - x` in PromQL and no scrape-time computation is needed),
//! `..._relists_total`, `..._reconnects_total`, `..._events_total{type}`.

mod backoff;
mod client;
mod config;
mod connection;
mod decode;
mod desired;
mod error;
mod metrics;
mod mirror;
mod snapshot;
mod transport;

pub use backoff::Backoff;
pub use client::WatchClient;
pub use config::{ClientCertFiles, Resource, WatchClientConfig};
pub use decode::{decode_event, LineDecoder, WatchEvent};
/// The LIST decoder, for the fuzz targets (`fuzz/`).
#[doc(hidden)]
pub use decode::{decode_list, ListPage};
pub use desired::same_desired_state;
pub use error::WatchError;
pub use metrics::{ResourceMetrics, WatchMetrics};
/// The reflector's cache, for the publication-cost test (`tests/publication_cost.rs`).
#[doc(hidden)]
pub use mirror::Mirror;
pub use snapshot::{diff, Change, ObjectKey, Objects, Snapshot};
pub use transport::Transport;
