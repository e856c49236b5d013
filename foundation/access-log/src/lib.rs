//! Access logs, as HAProxy, nginx and Envoy write them: one structured line per request
//! through the process's log (target `sluice::access`, level info, JSON with
//! `--log-format json`).
//!
//! Cost is bounded three ways. With a role's log off, a request costs one relaxed atomic load
//! ([`wanted`]) and nothing is built. A logged request builds one owned [`Record`] (its
//! client-chosen text cut to a bound and escaped) and offers it to a bounded queue; the line is
//! formatted and written by one writer thread, never by a worker. When the writer falls behind
//! (a slow disk, a stalled journal), the queue fills and further records are dropped and
//! counted (`sluice_access_log_dropped_total`): a worker never waits for the log.
//!
//! The switch is process-wide per role, like the overload state, so a config reload turns it
//! on, off or changes its sampling without reaching into each role ([`configure`]).

mod escape;
mod metrics;
mod record;
mod switch;

pub use escape::{bounded, MAX_PATH_BYTES, MAX_TEXT_BYTES};
pub use metrics::AccessLogCollector;
pub use record::{GrpcRecord, HttpRecord, Record};
pub use switch::{configure, submit, wanted, Role};
