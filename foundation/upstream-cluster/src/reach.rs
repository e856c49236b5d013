//! Whether the gateway's own process can serve agent servers at all: it reaches an agent only
//! through the tunnel node in its own process, and it must sign each request's user for the
//! agent. A cluster with an agent server is refused when either is missing, naming the cluster
//! and the field, rather than every one of its requests failing later.

use crate::load::LoadedCluster;
use sluice_config_error::InvalidSources;

/// What the gateway's config offers agent servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentReach {
    /// The same config has a `tunnel` section (this process is a tunnel node).
    pub tunnel: bool,
    /// The same config sets `gateway.agent_assertion_key_file`.
    pub assertion_key: bool,
}

impl AgentReach {
    /// Why an agent server cannot work with this config, or `None` when it can.
    pub fn missing(&self) -> Option<&'static str> {
        match (self.tunnel, self.assertion_key) {
            (true, true) => None,
            (false, true) => Some(
                "an agent server needs a tunnel section in the gateway's config: the gateway reaches agents only through the tunnel node in its own process",
            ),
            (true, false) => Some(
                "an agent server needs gateway.agent_assertion_key_file in the gateway's config: the gateway signs each request's user for the agent, which trusts nothing else",
            ),
            (false, false) => Some(
                "an agent server needs a tunnel section and gateway.agent_assertion_key_file in the gateway's config: the gateway reaches agents only through the tunnel node in its own process, and signs each request's user for the agent",
            ),
        }
    }
}

/// One error per agent server `reach` cannot serve: its cluster's file (or control-plane
/// origin), the cluster and field, and why.
pub fn check_agent_servers(
    clusters: &[LoadedCluster],
    reach: AgentReach,
    errors: &mut InvalidSources,
) {
    let Some(reason) = reach.missing() else {
        return;
    };
    for loaded in clusters {
        for (index, server) in loaded.cluster.spec.servers.iter().enumerate() {
            if server.agent.is_some() {
                errors.push(
                    loaded.source.display().to_string(),
                    format!(
                        "metadata.name={:?} spec.servers[{index}].agent",
                        loaded.cluster.metadata.name
                    ),
                    reason,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn clusters(servers: &str) -> Vec<LoadedCluster> {
        let text = test_support::examples::UPSTREAM_CLUSTER.replace(
            "  - endpoint: https://10.0.0.2:6443\n",
            &format!("{servers}  - endpoint: https://10.0.0.2:6443\n"),
        );
        crate::parse_clusters(&text, Path::new("clusters/a.yaml")).unwrap()
    }

    fn lines(clusters: &[LoadedCluster], reach: AgentReach) -> Vec<String> {
        let mut errors = InvalidSources::default();
        check_agent_servers(clusters, reach, &mut errors);
        errors.lines().collect()
    }

    #[test]
    fn an_agent_server_without_tunnel_or_key_names_its_cluster_and_field() {
        let agents = clusters("  - agent: {id: 42}\n  - agent: {id: 43}\n");
        let none = lines(&agents, AgentReach::default());
        assert_eq!(none.len(), 2, "{none:?}");
        assert!(
            none[0].starts_with(
                "clusters/a.yaml: metadata.name=\"cluster-a.example.com\" spec.servers[1].agent: an agent server needs a tunnel section and gateway.agent_assertion_key_file"
            ),
            "{none:?}"
        );
        assert!(none[1].contains("spec.servers[2].agent"), "{none:?}");
        let no_key = lines(
            &agents,
            AgentReach {
                tunnel: true,
                assertion_key: false,
            },
        );
        assert!(
            no_key[0].ends_with("needs gateway.agent_assertion_key_file in the gateway's config: the gateway signs each request's user for the agent, which trusts nothing else"),
            "{no_key:?}"
        );
        let no_tunnel = lines(
            &agents,
            AgentReach {
                tunnel: false,
                assertion_key: true,
            },
        );
        assert!(
            no_tunnel[0].contains("needs a tunnel section in the gateway's config"),
            "{no_tunnel:?}"
        );
        let both = AgentReach {
            tunnel: true,
            assertion_key: true,
        };
        assert_eq!(lines(&agents, both), Vec::<String>::new());
    }

    #[test]
    fn clusters_of_direct_servers_need_neither() {
        assert_eq!(
            lines(&clusters(""), AgentReach::default()),
            Vec::<String>::new()
        );
    }
}
