//! The behaviours every [`Store`] backend must share, as functions generic over the backend,
//! run by `tests/embedded.rs` on the embedded store and by `tests/etcd.rs` on a real etcd.
//!
//! Revisions are written relative to the store's revision when the case starts (`base`): an
//! empty embedded store is at 0, a fresh etcd at 1 (its initial empty revision).

#![allow(dead_code)] // each runner uses the cases through the macro

pub mod compaction;
pub mod crud;
pub mod list;
pub mod model;
pub mod watch;

use std::sync::Arc;

use sluice_store::Store;

/// A backend under test: opens a store on its own fresh storage.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// A new, empty store refusing values over `max_value_bytes`, whose idle watches report
    /// progress within a fraction of a second. The caller holds the only reference, so
    /// dropping it drops the store.
    async fn open(&self, max_value_bytes: usize) -> Arc<dyn Store>;
}

/// A store with the default value limit.
pub async fn open(backend: &dyn Backend) -> Arc<dyn Store> {
    backend.open(sluice_store::DEFAULT_MAX_VALUE_BYTES).await
}

/// The store's revision before the case writes anything.
pub async fn base(store: &dyn Store) -> u64 {
    store
        .current_revision()
        .await
        .expect("the current revision")
}

/// Defines one `#[tokio::test]` per conformance case, each running the case on the backend
/// that `$backend(case_name)` gives (a function returning `Option<impl Backend>`, `None` to
/// skip the case).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:path) => {
        $crate::conformance_tests!(@cases $backend;
            crud::writes_advance_one_revision_each_and_track_versions,
            crud::refused_writes_say_why_and_change_nothing,
            crud::oversized_values_and_bad_keys_are_refused_with_typed_errors,
            crud::default_limit_is_etcds_request_size,
            crud::concurrent_updates_with_the_same_expectation_have_one_winner,
            crud::concurrent_writers_each_get_their_own_revision,
            list::lists_stay_inside_their_prefix_in_key_order,
            list::pages_follow_each_other_and_say_when_more_remain,
            list::pages_at_a_revision_see_one_snapshot_across_writes,
            list::revisions_outside_the_readable_range_are_refused,
            watch::a_watch_replays_history_then_follows_live_changes,
            watch::a_watch_started_during_writes_sees_each_change_exactly_once,
            watch::a_watch_after_the_current_revision_waits_for_it,
            watch::a_watch_older_than_the_compaction_point_is_told_so,
            watch::dropping_the_store_ends_live_watches_as_unavailable,
            watch::an_idle_watch_reports_progress_past_other_prefixes_writes,
            watch::a_watch_of_the_empty_prefix_sees_every_key,
            compaction::compaction_keeps_current_values_and_the_state_at_its_point,
            compaction::compacting_a_busy_history_keeps_every_current_value,
            compaction::the_compactor_compacts_to_the_revision_seen_one_tick_earlier,
            compaction::the_compactor_runs_on_its_interval,
        );
    };
    (@cases $backend:path; $($module:ident :: $case:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let Some(backend) = $backend(stringify!($case)) else {
                return;
            };
            conformance::$module::$case(&backend).await;
        }
    )+};
}
