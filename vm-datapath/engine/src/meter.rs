//! The Reject meter: every Reject flow sends its packets through OpenFlow meter
//! [`REJECT_METER_ID`] before the controller, so a VM flooding a Reject rule costs
//! ovs-vswitchd's slow path and the agent at most the meter's rate; the rest is dropped in the
//! datapath and counted by the meter's band.

use sluice_openflow::{DropBand, MeterCommand, MeterMod, METER_EXISTS, METER_MOD_FAILED};
use sluice_ovs::{ClientError, OpenFlowClient};
use sluice_policy::compile::pipeline::REJECT_METER_ID;

/// Packets per second the Reject meter lets through to the agent.
pub const DEFAULT_REJECT_RATE: u32 = 100;
/// Packets the Reject meter lets through at once above the rate.
pub const DEFAULT_REJECT_BURST: u32 = 200;

/// The Reject meter's drop band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectMeter {
    /// Packets per second sent to the agent (all Reject rules of the bridge together).
    pub rate: u32,
    /// Packets above the rate let through at once.
    pub burst: u32,
}

impl Default for RejectMeter {
    fn default() -> Self {
        RejectMeter {
            rate: DEFAULT_REJECT_RATE,
            burst: DEFAULT_REJECT_BURST,
        }
    }
}

impl RejectMeter {
    fn meter_mod(self, command: MeterCommand) -> MeterMod {
        MeterMod {
            command,
            meter_id: REJECT_METER_ID,
            bands: vec![DropBand {
                rate: self.rate,
                burst: self.burst,
            }],
        }
    }

    /// Puts the meter on the switch with this rate and burst, whether or not it is there
    /// already: an agent restart finds the previous run's meter (modified in place, so the Reject
    /// flows using it stay), an OVS restart an empty switch (added). Must run before any flow
    /// naming the meter is sent: OVS refuses those while the meter does not exist.
    pub async fn install(self, client: &OpenFlowClient) -> Result<(), ClientError> {
        match client.meter_mod(&self.meter_mod(MeterCommand::Add)).await {
            Err(ClientError::Rejected { error, .. })
                if error.err_type == METER_MOD_FAILED && error.code == METER_EXISTS =>
            {
                client
                    .meter_mod(&self.meter_mod(MeterCommand::Modify))
                    .await
            }
            other => other,
        }
    }
}

/// Packets the Reject meter dropped on the switch so far (its band's count), or `None` when
/// the switch reports no such meter or band.
pub async fn dropped_on_switch(client: &OpenFlowClient) -> Result<Option<u64>, ClientError> {
    let stats = client.meter_stats(REJECT_METER_ID).await?;
    Ok(stats
        .iter()
        .find(|meter| meter.meter_id == REJECT_METER_ID)
        .and_then(|meter| meter.bands.first())
        .map(|band| band.packets))
}

/// Turns a switch counter that restarts from zero (the switch restarted, or the meter was
/// replaced) into the increase since the last reading, for a monotonic Prometheus counter.
pub fn increase(last: u64, now: u64) -> u64 {
    if now >= last {
        now - last
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increase_is_the_delta_or_everything_after_a_restart() {
        assert_eq!(increase(0, 0), 0);
        assert_eq!(increase(10, 25), 15);
        assert_eq!(increase(25, 7), 7);
        assert_eq!(increase(u64::MAX, u64::MAX), 0);
    }

    #[test]
    fn the_meter_is_one_drop_band_on_the_reject_meter_id() {
        let meter = RejectMeter { rate: 5, burst: 9 }.meter_mod(MeterCommand::Modify);
        assert_eq!(meter.meter_id, REJECT_METER_ID);
        assert_eq!(meter.bands, vec![DropBand { rate: 5, burst: 9 }]);
        assert_eq!(RejectMeter::default().rate, DEFAULT_REJECT_RATE);
    }
}
