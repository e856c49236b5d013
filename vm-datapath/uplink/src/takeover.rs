//! The executor: observes the host, asks `plan.rs` for the steps, runs them, and on a failure
//! undoes the completed steps in reverse order. Generic over [`Host`], so the rollback is tested
//! against an in-memory host that fails at every possible operation.

use sluice_ovs::PortRecord;

use crate::error::{observing, HostError, Rollback, UplinkError};
use crate::plan::{self, Op, Step};
use crate::record::{renamed_name, LinkState, UplinkRecord, MAX_LINK_NAME};

/// The few operations the takeover needs from the machine: netlink and OVSDB.
// The futures are awaited where they are made (one agent task, one namespace): they need no
// `Send` bound, which `async fn` in a trait cannot promise anyway.
#[allow(async_fn_in_trait)]
pub trait Host {
    /// The link named `name` with its addresses and routes; `None` if there is none.
    async fn link(&mut self, name: &str) -> Result<Option<LinkState>, HostError>;
    /// The ports of `bridge` with their `external_ids`.
    async fn bridge_ports(&mut self, bridge: &str) -> Result<Vec<PortRecord>, HostError>;
    /// The bridge's `datapath_type` (`netdev` for the userspace datapath).
    async fn datapath_type(&mut self, bridge: &str) -> Result<String, HostError>;
    /// The OpenFlow port number of interface `name`.
    async fn ofport(&mut self, name: &str) -> Result<u32, HostError>;
    /// Applies one operation; idempotent (see `plan.rs`).
    async fn apply(&mut self, op: &Op) -> Result<(), HostError>;
}

/// A taken-over uplink: what the agent needs (names, OpenFlow ports) and what `restore` undoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    /// The uplink's name, now the internal port's.
    pub uplink: String,
    /// The uplink device's new name, `<uplink>~`, a port of the bridge.
    pub renamed: String,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub addresses: Vec<ipnet::IpNet>,
    pub routes: Vec<crate::RouteSpec>,
    pub uplink_ofport: u32,
    pub internal_ofport: u32,
}

/// Runs `steps`; on a failure undoes the completed ones in reverse and reports both. A
/// best-effort step's failure ([`Op::is_best_effort`]) is only counted
/// ([`crate::announcements`]): what it was to speed up is done.
pub async fn execute<H: Host>(host: &mut H, steps: &[Step]) -> Result<(), UplinkError> {
    for (index, current) in steps.iter().enumerate() {
        let result = host.apply(&current.op).await;
        if current.op.is_best_effort() {
            crate::announce::count(result.is_ok());
            continue;
        }
        if let Err(source) = result {
            let rollback = roll_back(host, &steps[..index]).await;
            return Err(UplinkError::Step {
                step: current.name.clone(),
                source: Box::new(source),
                rollback,
            });
        }
    }
    Ok(())
}

/// Undoes `done` in reverse; carries on past a failed undo (the rest may still succeed) and
/// reports every failure.
async fn roll_back<H: Host>(host: &mut H, done: &[Step]) -> Rollback {
    let mut failures = Vec::new();
    for undone in done.iter().rev() {
        for op in &undone.undo {
            if let Err(error) = host.apply(op).await {
                failures.push(format!("undoing `{}` ({op:?}): {error}", undone.name));
            }
        }
    }
    if failures.is_empty() {
        Rollback::Complete
    } else {
        Rollback::Incomplete(failures)
    }
}

/// The takeover record on `bridge`, for `uplink` or (with `None`) any uplink.
async fn find_record<H: Host>(
    host: &mut H,
    bridge: &str,
    uplink: Option<&str>,
) -> Result<Option<(UplinkRecord, Vec<PortRecord>)>, UplinkError> {
    let ports = host
        .bridge_ports(bridge)
        .await
        .map_err(observing(format!("reading the ports of bridge {bridge}")))?;
    for port in &ports {
        if let Some(record) = UplinkRecord::from_external_ids(&port.name, &port.external_ids)? {
            if uplink.is_none_or(|uplink| uplink == record.uplink) {
                return Ok(Some((record, ports)));
            }
        }
    }
    Ok(None)
}

async fn link<H: Host>(host: &mut H, name: &str) -> Result<Option<LinkState>, UplinkError> {
    host.link(name)
        .await
        .map_err(observing(format!("reading link {name}")))
}

async fn is_netdev<H: Host>(host: &mut H, bridge: &str) -> Result<bool, UplinkError> {
    let datapath = host.datapath_type(bridge).await.map_err(observing(format!(
        "reading the datapath type of bridge {bridge}"
    )))?;
    Ok(datapath == "netdev")
}

async fn taken_over<H: Host>(host: &mut H, record: UplinkRecord) -> Result<TakenOver, UplinkError> {
    let uplink_ofport = host
        .ofport(&record.renamed)
        .await
        .map_err(observing(format!(
            "reading the OpenFlow port of {}",
            record.renamed
        )))?;
    let internal_ofport = host
        .ofport(&record.uplink)
        .await
        .map_err(observing(format!(
            "reading the OpenFlow port of {}",
            record.uplink
        )))?;
    Ok(TakenOver {
        uplink: record.uplink,
        renamed: record.renamed,
        mac: record.mac,
        mtu: record.mtu,
        addresses: record.addresses,
        routes: record.routes,
        uplink_ofport,
        internal_ofport,
    })
}

/// [`crate::take_over`] on any host.
pub async fn take_over_on<H: Host>(
    host: &mut H,
    bridge: &str,
    uplink: &str,
) -> Result<TakenOver, UplinkError> {
    let renamed = renamed_name(uplink).ok_or_else(|| UplinkError::NameTooLong {
        uplink: uplink.to_string(),
        max: MAX_LINK_NAME,
    })?;
    let netdev = is_netdev(host, bridge).await?;
    if let Some((record, ports)) = find_record(host, bridge, Some(uplink)).await? {
        // Taken over before (this agent, or one before a restart): only repair what is missing.
        let internal_port = ports.iter().any(|port| port.name == record.uplink);
        let internal = link(host, &record.uplink).await?;
        let renamed_link = link(host, &record.renamed).await?;
        let steps = plan::repair(
            &record,
            bridge,
            netdev,
            internal_port,
            internal.as_ref(),
            renamed_link.as_ref(),
        );
        execute(host, &steps).await?;
        return taken_over(host, record).await;
    }
    let mut state = link(host, uplink).await?;
    if state.is_none() && link(host, &renamed).await?.is_some() {
        execute(host, &plan::unrename(uplink, &renamed)).await?;
        state = link(host, uplink).await?;
    }
    let state = state.ok_or_else(|| UplinkError::NoSuchUplink(uplink.to_string()))?;
    let steps = plan::takeover(&state, &renamed, bridge, netdev);
    execute(host, &steps).await?;
    taken_over(host, UplinkRecord::of(&state, &renamed)).await
}

/// [`crate::recover`] on any host.
pub async fn recover_on<H: Host>(
    host: &mut H,
    bridge: &str,
) -> Result<Option<TakenOver>, UplinkError> {
    match find_record(host, bridge, None).await? {
        Some((record, _)) => Ok(Some(taken_over(host, record).await?)),
        None => Ok(None),
    }
}

/// [`crate::restore`] on any host.
pub async fn restore_on<H: Host>(
    host: &mut H,
    bridge: &str,
    uplink: &str,
) -> Result<(), UplinkError> {
    let Some((record, _)) = find_record(host, bridge, Some(uplink)).await? else {
        return Ok(()); // nothing taken over
    };
    let netdev = is_netdev(host, bridge).await?;
    let renamed = link(host, &record.renamed)
        .await?
        .ok_or_else(|| UplinkError::NoSuchUplink(record.renamed.clone()))?;
    execute(host, &plan::restore(&record, &renamed, bridge, netdev)).await
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
