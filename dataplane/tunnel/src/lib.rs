//! Reverse gRPC tunnels (the first pillar, after GitLab's kas/agentk).
//!
//! Node side ([`node`]): the agent endpoint accepts `ReverseTunnel.Connect` streams from agents
//! and parks them in the [`registry::ConnectionRegistry`]; the external endpoint authenticates
//! clients, routes each call to a local tunnel or to the node holding one (found through a
//! [`sluice_locator::AgentLocator`]), and relays it. Agent side ([`agent`]): keeps a pool of idle
//! tunnels to each node and forwards each tunnelled call to its local gRPC backend. Both sides
//! speak [`protocol`] and [`wire`], and fail with one [`error::TunnelError`].

pub mod agent;
pub mod auth;
pub mod echo;
pub mod error;
#[cfg(test)]
mod future_size;
pub mod metrics;
pub mod node;
pub mod protocol;
pub mod registry;
pub mod wire;
