//! The gateway's way to agent servers: this process's tunnel node, through a link in memory
//! per worker (`sluice_tunnel::node::GatewayLink`), and the key it signs users with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use sluice_config::GatewayConfig;
use sluice_gateway_proxy::{AgentLink, AgentPath, LinkFailure};
use sluice_kube_tunnel::{AssertionSigner, ExchangeLimits};
use sluice_tunnel::node::{GatewayLink, NodeShared};

#[derive(Debug)]
struct NodeLink(GatewayLink);

impl AgentLink for NodeLink {
    fn open(
        &self,
        worker: usize,
    ) -> Pin<Box<dyn Future<Output = Result<h2::client::SendRequest<Bytes>, LinkFailure>>>> {
        let link = self.0.clone();
        Box::pin(async move {
            link.open(worker)
                .await
                .map(|connection| connection.send_request)
                .map_err(|error| LinkFailure(error.to_string()))
        })
    }

    fn connected(&self, agent: u64) -> Pin<Box<dyn Future<Output = bool>>> {
        let link = self.0.clone();
        // Agent ids are validated to fit an i64 (the tunnel's id type).
        let Ok(agent) = i64::try_from(agent) else {
            return Box::pin(std::future::ready(false));
        };
        Box::pin(async move { link.agent_connected(agent).await })
    }
}

/// The agent path when the config has both a tunnel node and an assertion key; `None`
/// otherwise (agent servers are then refused by the loaders, or answered 500 when pushed).
pub fn agent_path(
    gateway: &GatewayConfig,
    node: Option<&Arc<NodeShared>>,
) -> anyhow::Result<Option<AgentPath>> {
    let (Some(node), Some(key_file)) = (node, &gateway.agent_assertion_key_file) else {
        return Ok(None);
    };
    let field = super::assertion_key::FIELD;
    let pem = super::assertion_key::read(key_file).with_context(|| field.to_string())?;
    let signer = AssertionSigner::from_pem(&pem).with_context(|| field.to_string())?;
    Ok(Some(AgentPath {
        link: Arc::new(NodeLink(GatewayLink::new(node.clone()))),
        signer,
        limits: ExchangeLimits::default(),
    }))
}
