//! Prometheus metrics of the engine (names in docs/VM-POLICY.md).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RuleLabels {
    pub policy: String,
    pub rule: String,
    pub direction: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReplyLabels {
    pub kind: String,
}

/// Every metric the engine updates; cheap to clone (the metrics are shared handles).
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    pub rule_packets: Family<RuleLabels, Counter>,
    pub rule_bytes: Family<RuleLabels, Counter>,
    pub flows: Gauge,
    pub realized_generation: Family<PolicyLabels, Gauge>,
    pub generation: Gauge,
    pub round: Gauge,
    pub realize_errors: Counter,
    pub reject_replies: Family<ReplyLabels, Counter>,
    pub reject_meter_dropped: Counter,
    pub packet_ins_dropped: Counter,
    pub replays: Counter,
}

impl EngineMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_policy_rule_packets",
            "Packets that hit a policy rule (from OVS flow stats)",
            self.rule_packets.clone(),
        );
        registry.register(
            "sluice_policy_rule_bytes",
            "Bytes that hit a policy rule (from OVS flow stats)",
            self.rule_bytes.clone(),
        );
        registry.register(
            "sluice_policy_flows",
            "Flows the engine keeps on the bridge",
            self.flows.clone(),
        );
        registry.register(
            "sluice_policy_realized_generation",
            "Engine generation at which each policy's current flows were committed to OVS",
            self.realized_generation.clone(),
        );
        registry.register(
            "sluice_policy_generation",
            "Bundles committed by the engine (full realizations and diffs)",
            self.generation.clone(),
        );
        registry.register(
            "sluice_policy_cookie_round",
            "Cookie round of this engine run",
            self.round.clone(),
        );
        registry.register(
            "sluice_policy_realize_errors",
            "Bundles OVS refused or that failed (the previous state stays)",
            self.realize_errors.clone(),
        );
        registry.register(
            "sluice_policy_reject_replies",
            "TCP resets and ICMP unreachables sent for Reject rules",
            self.reject_replies.clone(),
        );
        registry.register(
            "sluice_policy_reject_meter_dropped_packets",
            "Packets matching Reject rules that the Reject meter dropped in the datapath (over its rate), so they never reached the agent",
            self.reject_meter_dropped.clone(),
        );
        registry.register(
            "sluice_policy_packet_ins_dropped",
            "Packet-ins (Reject rule hits the meter let through) dropped unanswered because the agent's bounded queue for them was full",
            self.packet_ins_dropped.clone(),
        );
        registry.register(
            "sluice_policy_replays",
            "Full replays of the desired state after the switch connection was re-established",
            self.replays.clone(),
        );
    }
}
