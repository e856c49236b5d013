//! Reverse gRPC tunnels (the first pillar, after GitLab's kas/agentk).
//!
//! Node side: the agent endpoint accepts `ReverseTunnel.Connect` streams from agents and parks
//! them in the [`registry::ConnectionRegistry`]; the external endpoint authenticates clients,
//! takes a tunnel of the requested agent and relays the call through it. Agent side: keeps a pool
//! of idle tunnels to each node and forwards each tunnelled call to its local gRPC backend.

pub mod agent;
pub mod auth;
pub mod echo;
pub mod metrics;
pub mod node;
pub mod registry;
pub mod wire;
