//! The Kubernetes API gateway's I/O, on the monoio data plane. The pure phases (request info,
//! dispatch, flow control, identity, `Status` errors, the `UpstreamCluster` model) live in
//! `sluice-gateway`; this crate runs them per request:
//!
//! TLS accept, SNI picks the cluster -> HTTP/1.1 or HTTP/2 (ALPN) -> request info ->
//! authentication (client certificate, bearer token via TokenReview, anonymous) -> client
//! impersonation checked by SubjectAccessReview -> dispatch policy -> flow control -> round robin
//! over healthy servers -> a shared HTTP/2 upstream connection, with the user as Impersonate-*
//! headers -> the response streamed back frame by frame. A server that names an agent is
//! reached through the reverse tunnel instead (`via_agent`): the node of this process routes
//! the request to the agent, which replays it against its own apiserver as the user the
//! gateway vouched for.
//!
//! Per-core state (upstream connections, auth caches, flow-control counters, round-robin
//! cursors) is never shared; the config snapshot is swapped atomically by the reloader thread and
//! server health is written by the health-check task, both read lock-free per request.
//!
//! Every failure is a [`ProxyError`] (which party failed, the `Status` it is answered with,
//! whether the proxy may retry before replying); `answer.rs` is the one place that turns it into
//! the client's answer and the metric label. The module map is in the crate's README.

mod access;
mod activity;
mod admit;
mod agent_link;
mod answer;
mod auth;
mod body;
mod collector;
mod connection;
mod error;
mod fair_metrics;
mod forward;
mod forward_metrics;
mod handler;
mod head;
mod headers;
mod health;
mod metrics;
#[cfg(test)]
mod no_allocation;
mod pool;
mod reload;
mod review;
mod review_key;
mod state;
mod tls;
mod turns;
mod upgrade;
mod upstream;
mod upstream_connect;
mod via_agent;

pub use agent_link::{AgentLink, AgentPath, LinkFailure};
pub use collector::GatewayCollector;
pub use connection::GatewayEndpoint;
pub use error::{
    AgentFailure, ApiCallFailure, ClusterFileError, ProxyError, Side, UpstreamFailure,
};
pub use health::HealthChecker;
pub use metrics::GatewayMetrics;
pub use reload::{spawn_reloader, ReloaderHandle};
pub use state::{load_generation, Gateway, Generation};
// The upgrade-head parsers, public for the fuzz targets (`fuzz/`).
pub use head::{is_upgrade, parse_request, parse_response_status, upstream_head, RequestHead};

/// The proxy's decoders of what clients and the apiserver send (review answers, identity
/// headers), for the fuzz targets (`fuzz/`): not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::headers::strip_request_header_authentication;
    pub use crate::review::{access_allowed, token_review, token_verdict};
}
