//! Open vSwitch control for Sluice's VM policy engine.
//!
//! - [`flow`]: the flow model the policy compiler produces (match, actions, identity), printable
//!   in `ovs-ofctl add-flow` syntax.
//! - [`openflow`]: a pure OpenFlow 1.3/1.4 codec with the Nicira extensions policy flows need.
//! - [`OpenFlowClient`]: a tokio client on a bridge's `.mgmt` socket: atomic bundles, barrier,
//!   flow statistics, packet-in/out, reconnection with a replay signal.
//! - [`OvsdbClient`]: JSON-RPC to ovsdb-server for bridges and ports.

pub mod client;
pub mod flow;
pub mod openflow;
pub mod ovsdb;

pub use client::{ClientConfig, ClientError, OpenFlowClient};
pub use openflow::encode_flow_mods;
pub use ovsdb::{OvsdbClient, OvsdbError, PortKind};
