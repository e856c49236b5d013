//! The VM uplink takeover (the agent runs inside the VM): the uplink `U` is renamed `U~` and
//! added to the OVS bridge, an OVS internal port takes the name `U` and `U`'s MAC, and the MTU,
//! addresses and routes move onto it, so the VM's traffic crosses the bridge while the VM and
//! its neighbours see the same names, MAC and addresses. Every step is undone when a later one
//! fails; what is needed to undo it is recorded in the `external_ids` of `U~`'s Port, from
//! which a restarted agent [`recover`]s and [`restore`] reverses it.
//!
//! - `plan.rs`: the steps as data (pure), `record.rs`: the observed state and the record;
//! - `takeover.rs`: the executor with rollback, over a [`Host`] trait;
//! - `netlink.rs`: the real host (rtnetlink on tokio, OVSDB via `sluice-ovs`), `ethtool.rs`;
//! - `announce.rs`: the gratuitous ARP and unsolicited neighbour advertisement that tell the
//!   neighbours the addresses moved (the uplink's carrier drop made them forget).
//!
//! The bridge's flows are not installed here: whoever programs the bridge forwards between the
//! two ports.

mod announce;
mod error;
mod ethtool;
mod isolation;
mod netlink;
pub mod plan;
pub mod record;
mod takeover;

pub use announce::{announcements, Announcements};
pub use error::{HostError, Rollback, UplinkError};
pub use ethtool::{tx_checksum, tx_checksum_off};
pub use isolation::Isolation;
pub use netlink::NetlinkHost;
pub use record::{LinkState, RouteSpec, UplinkRecord};
pub use takeover::{execute, recover_on, restore_on, take_over_on, Host, TakenOver};

/// The VM's uplink, e.g. `eth0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    pub name: String,
}

/// Takes over `uplink` onto `bridge` in the calling process's network namespace. Idempotent:
/// on an uplink taken over before (found in OVSDB), it only repairs what is missing and returns
/// the recorded takeover.
pub async fn take_over(
    ovsdb: &mut sluice_ovs::OvsdbClient,
    bridge: &str,
    uplink: &str,
) -> Result<TakenOver, UplinkError> {
    let mut host = NetlinkHost::new(ovsdb)?;
    take_over_on(&mut host, bridge, uplink).await
}

/// The takeover recorded on `bridge` (what an agent restart recovers), if any.
pub async fn recover(
    ovsdb: &mut sluice_ovs::OvsdbClient,
    bridge: &str,
) -> Result<Option<TakenOver>, UplinkError> {
    let mut host = NetlinkHost::new(ovsdb)?;
    recover_on(&mut host, bridge).await
}

/// Reverses the takeover of `uplink` on `bridge`; `Ok` when nothing is taken over.
pub async fn restore(
    ovsdb: &mut sluice_ovs::OvsdbClient,
    bridge: &str,
    uplink: &str,
) -> Result<(), UplinkError> {
    let mut host = NetlinkHost::new(ovsdb)?;
    restore_on(&mut host, bridge, uplink).await
}
