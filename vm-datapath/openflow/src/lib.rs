//! The OpenFlow side of Sluice's VM data path, pure and without I/O (no async runtime):
//!
//! - [`flow`]: the flow model the policy compiler produces (match, actions, identity), printable
//!   in `ovs-ofctl add-flow` syntax.
//! - the OpenFlow 1.3/1.4 codec (this module): pure functions from the flow model to bytes and
//!   back, with the Nicira extensions policy flows need, and meters (mods and statistics).
//!
//! Hand-written because there is no maintained OpenFlow crate for Rust (the few published ones
//! are abandoned OpenFlow 1.0 codecs without Nicira extensions or bundles), and the subset Open
//! vSwitch needs for policy flows is small.
//!
//! Bundles: OpenFlow 1.4 has them natively (`OFPT_BUNDLE_CONTROL`/`OFPT_BUNDLE_ADD_MESSAGE`),
//! OpenFlow 1.3 only as the ONF extension 230 carried in experimenter messages. Both encode the
//! same body; the client prefers 1.4 (standard message types and `BUNDLE_FAILED` error codes,
//! and OVS implements bundles natively there) and falls back to the 1.3 extension when the
//! bridge offers only 1.3.

mod actions;
pub mod flow;
mod message;
mod meter;
mod names;
mod oxm;
mod wire;

pub use message::*;
pub use meter::{
    BandStats, DropBand, MeterCommand, MeterMod, MeterStats, MeterStatsRequest, METER_ALL,
    METER_EXISTS, METER_MOD_FAILED,
};
pub use names::{error_code_name, error_type_name, message_type_name};

/// OpenFlow 1.3 wire version.
pub const OFP13: u8 = 0x04;
/// OpenFlow 1.4 wire version.
pub const OFP14: u8 = 0x05;
/// Length of the common OpenFlow header.
pub const HEADER_LEN: usize = 8;

/// Why received bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what}: needs {needed} bytes but only {available} are left")]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("{what}: invalid length {length}")]
    BadLength { what: &'static str, length: usize },
    #[error("unsupported OpenFlow version {0:#04x}")]
    UnsupportedVersion(u8),
    #[error("unsupported {what} {value:#x}")]
    Unsupported { what: &'static str, value: u64 },
    #[error("invalid message: {0}")]
    Invalid(&'static str),
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("{0} is longer than OpenFlow's 65535-byte limit")]
    TooLong(&'static str),
    #[error("cannot encode: {0}")]
    Invalid(&'static str),
}

#[cfg(test)]
mod tests;
