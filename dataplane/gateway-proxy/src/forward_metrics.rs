//! How forwarded requests end, per cluster and server kind (an apiserver the gateway dials, or
//! an agent reached through the reverse tunnel), and how long their answer head took: the
//! tunnel path's refusals and added latency per cluster. Labels come from the configuration
//! and fixed lists only, never from a client.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_metrics::{Cores, PerCoreCounter, PerCoreHistogram};

use crate::error::ProxyError;

/// `server_kind` of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    Apiserver,
    Agent,
}

impl ServerKind {
    pub fn of(server: &sluice_gateway::cluster::CompiledServer) -> Self {
        match server.agent {
            Some(_) => Self::Agent,
            None => Self::Apiserver,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Apiserver => "apiserver",
            Self::Agent => "agent",
        }
    }
}

/// `result` of a forwarded request: its answer head came back, or why not (the labels
/// `result_label` gives; checked by the tests).
#[cfg(test)]
const FORWARD_RESULTS: [&str; 5] = [
    "answered",
    "agent_not_connected",
    "agent_busy",
    "fair_share",
    "failed",
];

fn result_label(result: &Result<(), &ProxyError>) -> &'static str {
    match result {
        Ok(()) => "answered",
        Err(error) => match error.metric_label() {
            label @ ("agent_not_connected" | "agent_busy" | "fair_share") => label,
            _ => "failed",
        },
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    cluster: String,
    server_kind: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    cluster: String,
    server_kind: &'static str,
}

/// The two families, registered once.
#[derive(Debug, Clone)]
pub struct ForwardFamilies {
    results: Family<ResultLabels, PerCoreCounter, Cores>,
    heads: Family<KindLabels, PerCoreHistogram, Cores>,
}

impl ForwardFamilies {
    pub fn register(registry: &mut Registry, workers: usize) -> Self {
        let families = Self {
            results: Family::new_with_constructor(Cores::new(workers)),
            heads: Family::new_with_constructor(Cores::new(workers)),
        };
        registry.register(
            "sluice_gateway_forwarded",
            "Admitted requests sent towards a server, by cluster, server kind (apiserver or agent) and result (answered, agent_not_connected, agent_busy, fair_share, failed)",
            families.results.clone(),
        );
        registry.register(
            "sluice_gateway_answer_head_seconds",
            "From admission to the answer's head, by cluster and server kind (for agents: the tunnel's wait for the agent included)",
            families.heads.clone(),
        );
        families
    }
}

/// Most clusters whose handles one core keeps (past it a request costs a family lookup).
const MAX_CACHED_CLUSTERS: usize = 1024;

/// One core's handles, per cluster, made on first use: recording allocates nothing after.
#[derive(Debug, Default)]
pub struct CoreForwardMetrics {
    clusters: HashMap<Box<str>, ClusterHandles>,
}

#[derive(Debug, Default)]
struct ClusterHandles {
    results: HashMap<(ServerKind, &'static str), PerCoreCounter>,
    heads: HashMap<ServerKind, PerCoreHistogram>,
}

impl CoreForwardMetrics {
    /// One forwarded request to a server of `kind` in `cluster`; `head` is the time to its
    /// answer head when one came back (none for upgrades: their answer ends the relay).
    pub fn record(
        &mut self,
        families: &ForwardFamilies,
        worker: usize,
        (cluster, kind): (&str, ServerKind),
        result: Result<(), &ProxyError>,
        head: Option<Duration>,
    ) {
        let label = result_label(&result);
        let mut scratch = ClusterHandles::default();
        if self.clusters.len() < MAX_CACHED_CLUSTERS && !self.clusters.contains_key(cluster) {
            self.clusters
                .insert(cluster.into(), ClusterHandles::default());
        }
        let handles = self.clusters.get_mut(cluster).unwrap_or(&mut scratch);
        handles
            .results
            .entry((kind, label))
            .or_insert_with(|| {
                families
                    .results
                    .get_or_create(&ResultLabels {
                        cluster: cluster.to_string(),
                        server_kind: kind.label(),
                        result: label,
                    })
                    .clone()
            })
            .inc(worker);
        if let (Ok(()), Some(head)) = (result, head) {
            handles
                .heads
                .entry(kind)
                .or_insert_with(|| {
                    families
                        .heads
                        .get_or_create(&KindLabels {
                            cluster: cluster.to_string(),
                            server_kind: kind.label(),
                        })
                        .clone()
                })
                .observe(worker, head.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::error::AgentFailure;

    fn exported(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn results_and_heads_are_counted_per_cluster_and_kind() {
        let mut registry = Registry::default();
        let families = ForwardFamilies::register(&mut registry, 2);
        let mut core = CoreForwardMetrics::default();
        let not_connected = ProxyError::Agent {
            agent: 42,
            cause: AgentFailure::NotConnected {
                message: "agent 42 has no tunnel".into(),
            },
        };
        let head = Some(Duration::from_millis(3));
        core.record(&families, 0, ("a", ServerKind::Agent), Ok(()), head);
        core.record(&families, 1, ("a", ServerKind::Agent), Ok(()), head);
        core.record(
            &families,
            1,
            ("a", ServerKind::Agent),
            Err(&not_connected),
            head,
        );
        core.record(&families, 0, ("b", ServerKind::Apiserver), Ok(()), head);
        // An upgrade: counted, no head time.
        core.record(&families, 0, ("b", ServerKind::Apiserver), Ok(()), None);
        let text = exported(&registry);
        for line in [
            r#"sluice_gateway_forwarded_total{cluster="a",server_kind="agent",result="answered"} 2"#,
            r#"sluice_gateway_forwarded_total{cluster="a",server_kind="agent",result="agent_not_connected"} 1"#,
            r#"sluice_gateway_forwarded_total{cluster="b",server_kind="apiserver",result="answered"} 2"#,
            r#"sluice_gateway_answer_head_seconds_count{cluster="a",server_kind="agent"} 2"#,
            r#"sluice_gateway_answer_head_seconds_count{cluster="b",server_kind="apiserver"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn every_result_label_is_listed() {
        let failures = [
            AgentFailure::NoPath,
            AgentFailure::Busy {
                message: String::new(),
            },
            AgentFailure::NotConnected {
                message: String::new(),
            },
        ];
        for cause in failures {
            let error = ProxyError::Agent { agent: 1, cause };
            assert!(FORWARD_RESULTS.contains(&result_label(&Err(&error))));
        }
        assert!(FORWARD_RESULTS.contains(&result_label(&Ok(()))));
    }
}
