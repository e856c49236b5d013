//! The agent's Kubernetes API forwarder (`agent.kubernetes_api`): a `MakeRequest` call from the
//! gateway carries one HTTP exchange, which the agent replays against the one apiserver it was
//! configured with, as the user the gateway vouched for (a signed assertion bound to this agent
//! and this request) and with its own credential. Nothing of the request chooses where the agent
//! connects: scheme, host and port come from the configuration only.
//!
//! - `setup`: what the agent task builds once (TLS, the assertion verifier, metrics);
//! - `apiserver`: the shared HTTP/2 connection and the agent's rotating token;
//! - `exchange`: one call, from the request Head to the response's End;
//! - `upgrade`: exec, attach and port-forward, each on its own HTTP/1.1 connection.

mod apiserver;
mod exchange;
mod metrics;
mod setup;
mod upgrade;

pub(super) use exchange::exchange;
pub use metrics::KubeMetrics;
pub use setup::{KubeSetup, KubeSetupError};

pub(super) use apiserver::KubeApi;
