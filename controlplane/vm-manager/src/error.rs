//! The VMManager's one error type: what ended a round of following the store (it starts
//! again from a fresh list after a pause, so no error stops the VMManager for good).

use sluice_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum VmManagerError {
    /// Listing a resource failed.
    #[error("listing {prefix}: {source}")]
    List {
        prefix: String,
        #[source]
        source: StoreError,
    },
    /// A watch ended in a way resuming cannot fix (compacted history, a store gone too long).
    #[error("watching {prefix}: {source}")]
    Watch {
        prefix: String,
        #[source]
        source: StoreError,
    },
}

impl VmManagerError {
    /// Whether starting over from a fresh list may succeed (every error today: the store
    /// comes back, or a list replaces the compacted history).
    pub fn retryable(&self) -> bool {
        true
    }
}
