//! Open vSwitch I/O for Sluice's VM policy engine (tokio): the clients that speak to a switch.
//! The flow model and the OpenFlow codec they carry are pure and live in `sluice-openflow`.
//!
//! - [`OpenFlowClient`]: a client on a bridge's `.mgmt` socket: atomic bundles, barrier,
//!   flow and meter statistics, meter mods, packet-in/out, reconnection with a replay signal.
//! - [`OvsdbClient`]: JSON-RPC to ovsdb-server for bridges and ports (`ovsdb_ports`: ports with
//!   external_ids and a MAC, a bridge's ports and datapath type).

pub mod client;
mod interfaces;
pub mod ovsdb;
pub mod ovsdb_ports;

pub use client::{ClientConfig, ClientError, OpenFlowClient};
pub use interfaces::interface_ports;
pub use ovsdb::{OvsdbClient, OvsdbError, PortKind};
pub use ovsdb_ports::{NewPort, PortRecord};
