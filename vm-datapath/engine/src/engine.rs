use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sluice_openflow::flow::{port, Action};
use sluice_openflow::{FlowMod, PacketIn, PacketOut};
use sluice_ovs::{ClientConfig, ClientError, OpenFlowClient};
use sluice_policy::compile::priority::{parse_cookie, CookieKind, COOKIE_ROUND_MASK};
use sluice_policy::compile::{
    CompileError, CompileOptions, PolicyChange, PolicyCompiler, RejectTag,
};
use sluice_policy::model::PolicySet;
use tokio::sync::{mpsc, watch};

use crate::changes::{changes_between, NetDiff};
use crate::meter::{self, RejectMeter};
use crate::metrics::{EngineMetrics, PolicyLabels, ReplyLabels, RuleLabels};
use crate::reject::{build_reject_reply, RejectReply};

/// Where and how the engine talks to the bridge.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The bridge's OpenFlow management socket (`<rundir>/<bridge>.mgmt`).
    pub mgmt_socket: PathBuf,
    pub client: ClientConfig,
    /// The agent's own control-plane TCP endpoints, kept reachable whatever the policies say.
    pub control_plane: Vec<SocketAddr>,
    /// How often flow stats are read for the per-rule counters.
    pub stats_interval: Duration,
    /// Rate and burst of the meter in front of every Reject rule's packet-ins.
    pub reject_meter: RejectMeter,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("policy set does not compile: {0}")]
    Compile(#[from] CompileError),
    #[error("OpenFlow: {0}")]
    Switch(#[from] ClientError),
}

/// What one realization did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RealizeSummary {
    pub generation: u64,
    pub flow_mods: usize,
}

/// The desired policy state of one bridge and its realization in OVS.
pub struct PolicyEngine {
    client: OpenFlowClient,
    compiler: PolicyCompiler,
    round: u16,
    generation: u64,
    /// Generation at which each policy's current flows were committed.
    realized: BTreeMap<String, u64>,
    metrics: EngineMetrics,
    connection: watch::Receiver<u64>,
    /// Last raw (packets, bytes) per rule number, to turn OVS's per-flow counters (which restart
    /// when a flow is replaced or the switch restarts) into monotonic Prometheus counters.
    last_stats: HashMap<u32, (u64, u64)>,
    reject_meter: RejectMeter,
    /// Last raw count of the Reject meter's band, for the same reason as `last_stats`.
    last_meter_dropped: u64,
    last_packet_ins_dropped: u64,
}

impl PolicyEngine {
    /// Connects to the bridge and realizes `initial` under a new cookie round.
    ///
    /// The round is read from the bridge: one above the highest round found there (1 on an
    /// empty bridge). No state file is needed: stale flows only matter while they are on the
    /// bridge, and then they name their round.
    pub async fn start(
        config: &EngineConfig,
        initial: PolicySet,
        metrics: EngineMetrics,
    ) -> Result<Self, EngineError> {
        let client = OpenFlowClient::connect(&config.mgmt_socket, config.client.clone()).await?;
        // Before any flow: the Reject flows name the meter, and OVS refuses them without it.
        config.reject_meter.install(&client).await?;
        let rounds = rounds_on_switch(&client).await?;
        let round = next_round(&rounds);
        let compiler = PolicyCompiler::from_policy_set(
            initial,
            CompileOptions {
                round,
                control_plane: config.control_plane.clone(),
            },
        )?;
        let connection = client.connection_generation();
        let mut engine = PolicyEngine {
            client,
            compiler,
            round,
            generation: 0,
            realized: BTreeMap::new(),
            metrics,
            connection,
            last_stats: HashMap::new(),
            reject_meter: config.reject_meter,
            last_meter_dropped: 0,
            last_packet_ins_dropped: 0,
        };
        engine.metrics.round.set(i64::from(round));
        // Marks the current connection as seen: the first replay is this one.
        engine.connection.borrow_and_update();
        let summary = engine.realize_full(&rounds).await?;
        tracing::info!(
            round,
            stale_rounds = ?rounds,
            flows = engine.compiler.flow_count(),
            generation = summary.generation,
            "policy state realized under a new cookie round"
        );
        Ok(engine)
    }

    pub fn round(&self) -> u16 {
        self.round
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn policy_set(&self) -> &PolicySet {
        self.compiler.policy_set()
    }

    pub fn client(&self) -> &OpenFlowClient {
        &self.client
    }

    /// Installs every desired flow and deletes the flows of `stale_rounds`, all in one bundle.
    ///
    /// Why this opens no window: the bundle commits atomically, so packets see either the old
    /// rule set or the new one. A new flow with the same table, priority and match as an old
    /// one replaces it in place (the add carries the new cookie); the cookie-masked deletes
    /// then only hit old flows that have no counterpart any more.
    async fn realize_full(
        &mut self,
        stale_rounds: &BTreeSet<u16>,
    ) -> Result<RealizeSummary, EngineError> {
        let mut mods: Vec<FlowMod> = self.compiler.flows().cloned().map(FlowMod::Add).collect();
        mods.extend(
            stale_rounds
                .iter()
                .filter(|&&round| round != self.round)
                .map(|&round| FlowMod::DeleteByCookie {
                    table: None,
                    cookie: u64::from(round) << 48,
                    cookie_mask: COOKIE_ROUND_MASK,
                }),
        );
        let result = self.client.apply_bundle(&mods).await;
        self.committed(result, mods.len(), None)
    }

    fn committed(
        &mut self,
        result: Result<(), ClientError>,
        flow_mods: usize,
        changed: Option<&BTreeSet<String>>,
    ) -> Result<RealizeSummary, EngineError> {
        if let Err(error) = result {
            self.metrics.realize_errors.inc();
            return Err(error.into());
        }
        self.generation += 1;
        let generation = self.generation;
        let current: BTreeSet<&String> = self.compiler.policy_set().policies.keys().collect();
        self.realized.retain(|key, _| {
            let keep = current.contains(key);
            if !keep {
                self.metrics.realized_generation.remove(&PolicyLabels {
                    policy: key.clone(),
                });
            }
            keep
        });
        for key in current {
            if changed.is_none_or(|changed| changed.contains(key))
                || !self.realized.contains_key(key)
            {
                self.realized.insert(key.clone(), generation);
            }
        }
        for (key, at) in &self.realized {
            self.metrics
                .realized_generation
                .get_or_create(&PolicyLabels {
                    policy: key.clone(),
                })
                .set(i64::try_from(*at).unwrap_or(i64::MAX));
        }
        self.metrics
            .generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
        self.metrics
            .flows
            .set(i64::try_from(self.compiler.flow_count()).unwrap_or(i64::MAX));
        Ok(RealizeSummary {
            generation,
            flow_mods,
        })
    }

    /// Moves to `desired` with the minimal flow changes, in one bundle. The compiler state
    /// advances only once the bundle committed: on any error the engine (and OVS) keep the
    /// previous state.
    pub async fn apply_set(&mut self, desired: PolicySet) -> Result<RealizeSummary, EngineError> {
        let changes = changes_between(self.compiler.policy_set(), &desired);
        self.apply_changes(changes).await
    }

    /// Applies `changes` as one bundle (see [`Self::apply_set`]).
    pub async fn apply_changes(
        &mut self,
        changes: Vec<PolicyChange>,
    ) -> Result<RealizeSummary, EngineError> {
        let mut next = self.compiler.clone();
        let mut net = NetDiff::default();
        let mut changed_policies = BTreeSet::new();
        let mut changed_groups = false;
        for change in changes {
            match &change {
                PolicyChange::UpsertPolicy(policy) => {
                    changed_policies.insert(policy.key());
                }
                PolicyChange::DeletePolicy { key } => {
                    changed_policies.insert(key.clone());
                }
                _ => changed_groups = true,
            }
            net.push(next.apply(change)?);
        }
        let mods = net.into_flow_mods();
        if mods.is_empty() && changed_policies.is_empty() && !changed_groups {
            return Ok(RealizeSummary {
                generation: self.generation,
                flow_mods: 0,
            });
        }
        let result = self.client.apply_bundle(&mods).await;
        if result.is_ok() {
            self.compiler = next;
        }
        // A group change can touch any policy using it: count those as re-realized too.
        let changed = (!changed_groups).then_some(&changed_policies);
        self.committed(result, mods.len(), changed)
    }

    /// After the switch connection was re-established (OVS restarted, or the socket dropped),
    /// installs the whole desired state again in one bundle. With the userspace datapath a
    /// restarted ovs-vswitchd has no flows and, in fail mode secure, forwards nothing until this
    /// bundle commits: closed, never open.
    pub async fn replay(&mut self) -> Result<RealizeSummary, EngineError> {
        self.connection.borrow_and_update();
        // A restarted switch has no meter either; it must be back before the Reject flows.
        self.reject_meter.install(&self.client).await?;
        let rounds = rounds_on_switch(&self.client).await?;
        self.metrics.replays.inc();
        let summary = self.realize_full(&rounds).await?;
        tracing::info!(
            generation = summary.generation,
            flow_mods = summary.flow_mods,
            "desired state replayed after reconnect"
        );
        Ok(summary)
    }

    /// Takes every flow of this agent off the bridge (all cookie rounds, stale ones too) and
    /// leaves the bridge's standalone default behind (`priority=0,actions=NORMAL`, cookie 0):
    /// the switch forwards as it did before the agent came, instead of dropping everything.
    /// What a VM agent does when its VM stops being agented.
    pub async fn withdraw(self) -> Result<(), EngineError> {
        let mut rounds = rounds_on_switch(&self.client).await?;
        rounds.insert(self.round);
        let mut mods: Vec<FlowMod> = rounds
            .into_iter()
            .filter(|&round| round != 0)
            .map(|round| FlowMod::DeleteByCookie {
                table: None,
                cookie: u64::from(round) << 48,
                cookie_mask: COOKIE_ROUND_MASK,
            })
            .collect();
        mods.push(FlowMod::Add(sluice_openflow::flow::Flow {
            table: 0,
            priority: 0,
            cookie: 0,
            matches: sluice_openflow::flow::Match::default(),
            actions: vec![Action::Normal],
        }));
        self.client.apply_bundle(&mods).await?;
        self.metrics.flows.set(0);
        tracing::info!(
            flow_mods = mods.len(),
            "policy flows withdrawn from the bridge"
        );
        Ok(())
    }

    /// Waits until the switch connection changes (a replay is due).
    pub async fn reconnected(&mut self) {
        if self.connection.changed().await.is_err() {
            // The client is gone: never resolve.
            std::future::pending::<()>().await;
        }
    }

    /// Reads flow and meter stats and adds what the rules saw, what the Reject meter dropped
    /// and what the packet-in queue dropped since the last poll to the counters.
    pub async fn poll_stats(&mut self) -> Result<(), EngineError> {
        let dropped = self.client.dropped_packet_ins();
        self.metrics
            .packet_ins_dropped
            .inc_by(dropped.saturating_sub(self.last_packet_ins_dropped));
        self.last_packet_ins_dropped = dropped;
        self.poll_rule_stats().await?;
        self.poll_meter_stats().await
    }

    async fn poll_meter_stats(&mut self) -> Result<(), EngineError> {
        let Some(dropped) = meter::dropped_on_switch(&self.client).await? else {
            return Ok(());
        };
        self.metrics
            .reject_meter_dropped
            .inc_by(meter::increase(self.last_meter_dropped, dropped));
        self.last_meter_dropped = dropped;
        Ok(())
    }

    async fn poll_rule_stats(&mut self) -> Result<(), EngineError> {
        let stats = self
            .client
            .flow_stats(u64::from(self.round) << 48, COOKIE_ROUND_MASK)
            .await?;
        let mut per_rule: HashMap<u32, (u64, u64)> = HashMap::new();
        for flow in &stats {
            let Some(parts) = parse_cookie(flow.cookie) else {
                continue;
            };
            // Clause flows only vote (conjunction actions); the flow matching conj_id decides
            // and is the one whose counters mean "packets this rule handled".
            let decides = flow.actions.as_ref().is_some_and(|actions| {
                !actions
                    .iter()
                    .any(|action| matches!(action, Action::Conjunction { .. }))
            });
            if parts.kind == CookieKind::Rule && decides {
                let entry = per_rule.entry(parts.rule_number).or_default();
                entry.0 += flow.packets;
                entry.1 += flow.bytes;
            }
        }
        for (&number, &(packets, bytes)) in &per_rule {
            let Some(rule) = self.compiler.rule_for_number(number) else {
                continue;
            };
            let (last_packets, last_bytes) =
                self.last_stats.get(&number).copied().unwrap_or((0, 0));
            let labels = RuleLabels {
                policy: rule.policy,
                rule: rule
                    .rule_name
                    .unwrap_or_else(|| rule.rule_index.to_string()),
                direction: rule.direction.as_str().to_string(),
            };
            // Fewer than last time: the flows were replaced (counters restart at zero).
            let packet_delta = if packets >= last_packets {
                packets - last_packets
            } else {
                packets
            };
            let byte_delta = if bytes >= last_bytes {
                bytes - last_bytes
            } else {
                bytes
            };
            self.metrics
                .rule_packets
                .get_or_create(&labels)
                .inc_by(packet_delta);
            self.metrics
                .rule_bytes
                .get_or_create(&labels)
                .inc_by(byte_delta);
        }
        self.last_stats = per_rule;
        Ok(())
    }

    /// Answers Reject packet-ins until the client is dropped. Runs as its own task so replies
    /// never wait behind a large bundle.
    pub fn spawn_reject_responder(&self) -> Option<tokio::task::JoinHandle<()>> {
        let packet_ins = self.client.packet_ins()?;
        let client = self.client.clone();
        let metrics = self.metrics.clone();
        Some(tokio::spawn(answer_rejects(client, packet_ins, metrics)))
    }
}

async fn answer_rejects(
    client: OpenFlowClient,
    mut packet_ins: mpsc::Receiver<PacketIn>,
    metrics: EngineMetrics,
) {
    while let Some(packet_in) = packet_ins.recv().await {
        let Some(tag) = RejectTag::decode(&packet_in.userdata) else {
            tracing::debug!(
                cookie = packet_in.cookie,
                "packet-in without a Reject tag ignored"
            );
            continue;
        };
        let Some(in_port) = packet_in.in_port else {
            continue;
        };
        let Some((kind, reply)) = build_reject_reply(&packet_in.packet) else {
            tracing::debug!(
                rule = tag.rule_number,
                len = packet_in.packet.len(),
                "rejected packet gets no reply"
            );
            continue;
        };
        tracing::trace!(request = ?packet_in.packet, reply = ?reply, "reject reply");
        // Back out of the port the rejected packet came in on, bypassing the pipeline (the
        // reply must not be judged by the rules that rejected its trigger). OpenFlow sends a
        // packet out of its own in_port only through the reserved IN_PORT.
        let packet_out = PacketOut {
            in_port,
            actions: vec![Action::Output(port::IN_PORT)],
            packet: reply,
        };
        match client.packet_out(&packet_out).await {
            Ok(()) => {
                let kind = match kind {
                    RejectReply::TcpReset => "tcp_reset",
                    RejectReply::IcmpUnreachable => "icmp_unreachable",
                };
                metrics
                    .reject_replies
                    .get_or_create(&ReplyLabels {
                        kind: kind.to_string(),
                    })
                    .inc();
                tracing::debug!(rule = tag.rule_number, in_port, kind, "reject reply sent");
            }
            Err(error) => tracing::warn!(%error, rule = tag.rule_number, "reject reply not sent"),
        }
    }
}

/// Cookie rounds of the flows on the switch.
async fn rounds_on_switch(client: &OpenFlowClient) -> Result<BTreeSet<u16>, ClientError> {
    Ok(client
        .flow_stats(0, 0)
        .await?
        .iter()
        .map(|flow| (flow.cookie >> 48) as u16)
        .collect())
}

/// The round after the highest one found; rounds wrap from 65,535 to 1 (0 is what flows
/// without a cookie carry).
fn next_round(found: &BTreeSet<u16>) -> u16 {
    match found.last() {
        None | Some(&u16::MAX) => 1,
        Some(&highest) => highest + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_start_at_one_and_skip_zero_when_wrapping() {
        assert_eq!(next_round(&BTreeSet::new()), 1);
        assert_eq!(next_round(&BTreeSet::from([0, 4])), 5);
        assert_eq!(next_round(&BTreeSet::from([u16::MAX])), 1);
    }
}
