//! Meters on the switch: installing one (meter mod) and reading what its bands did (meter
//! statistics).

use sluice_openflow::{
    encode_barrier_request, encode_meter_mod, encode_meter_stats_request, Message, MeterMod,
    MeterStats, MeterStatsRequest,
};

use super::{expect_reply, ClientError, OpenFlowClient};

impl OpenFlowClient {
    /// Sends `meter` and waits (with a barrier) until the switch has applied it. A refusal is
    /// [`ClientError::Rejected`] with the switch's error (`METER_MOD_FAILED`/`METER_EXISTS` for
    /// an add of an id in use).
    pub async fn meter_mod(&self, meter: &MeterMod) -> Result<(), ClientError> {
        let connection = self.current()?;
        let xid = self.reserve_xids(2);
        let mut pending = connection.register(xid, 2);
        self.with_timeout("METER_MOD", xid, async {
            connection
                .send(|buf, version| {
                    encode_meter_mod(buf, version, xid, meter)?;
                    encode_barrier_request(buf, version, xid.wrapping_add(1));
                    Ok(())
                })
                .await?;
            // The switch answers in order: an error for the meter mod comes before the barrier.
            expect_reply(pending.next().await?, "METER_MOD", |m| {
                matches!(m, Message::BarrierReply)
            })
        })
        .await
    }

    /// Statistics of meter `meter_id` (or of every meter with `sluice_openflow::METER_ALL`).
    pub async fn meter_stats(&self, meter_id: u32) -> Result<Vec<MeterStats>, ClientError> {
        const REQUEST: &str = "MULTIPART_REQUEST meter";
        let connection = self.current()?;
        let xid = self.reserve_xids(1);
        let mut pending = connection.register(xid, 1);
        let request = MeterStatsRequest { meter_id };
        self.with_timeout(REQUEST, xid, async {
            connection
                .send(|buf, version| encode_meter_stats_request(buf, version, xid, &request))
                .await?;
            let mut all = Vec::new();
            loop {
                match pending.next().await?.message {
                    Message::MeterStatsReply { more, meters } => {
                        all.extend(meters);
                        if !more {
                            return Ok(all);
                        }
                    }
                    Message::Error(error) => {
                        return Err(ClientError::Rejected {
                            request: REQUEST,
                            error,
                        })
                    }
                    other => {
                        return Err(ClientError::Unexpected {
                            request: REQUEST,
                            message: format!("{other:?}"),
                        })
                    }
                }
            }
        })
        .await
    }
}
