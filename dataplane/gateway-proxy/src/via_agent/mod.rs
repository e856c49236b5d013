//! Forwarding an admitted request to an agent server (an UpstreamCluster server that names an
//! agent): the request goes as one `MakeRequest` call over this worker's link to the tunnel
//! node of this process, which routes it to the agent (a tunnel here, or another node's private
//! endpoint); the agent replays it against its own apiserver as the user this gateway vouched
//! for in a signed assertion bound to the request. The answer comes back as messages and is
//! relayed to the client frame by frame (`body.rs`).
//!
//! Phases: sign (the user, the agent, the request line) -> open the call -> send the head and
//! pump the body -> read the answer's head -> stream its body. A failure before the head
//! reaches the client is one `ProxyError::Agent`, answered by `answer.rs` like every other.

mod body;
mod call;
mod review;
mod upgrade;

pub use crate::agent_link::{AgentLink, AgentPath, LinkFailure};
pub use body::AgentBody;

use std::sync::Arc;
use std::time::SystemTime;

use http::request::Parts;
use http::Response;
use hyper::body::Incoming;
use sluice_gateway::identity::UserInfo;
use sluice_gateway::request_info::RequestInfo;
use sluice_kube_tunnel::{encode_request_head, Identity};

use crate::admit::Admitted;
use crate::body::{BoxedBody, InFlight, ProxyBody};
use crate::error::{AgentFailure, ProxyError};
use crate::handler::GatewayHandler;
use crate::headers::upstream_headers;
use crate::state::Generation;
use crate::turns::ClientTurn;
use sluice_gateway::status::GatewayError;

impl GatewayHandler {
    /// [`GatewayHandler::forward`] for a server that names `agent`.
    pub async fn forward_via_agent(
        &self,
        generation: &Arc<Generation>,
        admitted: Admitted,
        info: &RequestInfo<'_>,
        parts: &Parts,
        body: Incoming,
        agent: u64,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let failed = |cause: AgentFailure| ProxyError::Agent { agent, cause };
        let Admitted {
            cluster,
            server,
            user,
            permit,
        } = admitted;
        let compiled = &generation.snapshot.clusters()[cluster];
        let path = self
            .gateway
            .agent_path()
            .ok_or(failed(AgentFailure::NoPath))?;
        // The same fair turn per user as an apiserver's streams: one user's watches cannot take
        // every request this core may have in flight to the agent.
        let turn = ClientTurn {
            user: &user.name,
            long_running: info.is_long_running(),
            level: permit.level(),
        };
        let share = self
            .pool
            .agent_turn(
                (&compiled.name, &compiled.servers[server]),
                &generation.clusters[cluster].client_tls,
                &compiled.connection_pool,
                turn,
            )
            .await
            .map_err(|refusal| GatewayError::FairShare {
                level: permit.level().cloned(),
                refusal,
            })?;
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", |target| target.as_str());
        let assertion = sign(path, &user, agent, &parts.method, target).map_err(failed)?;
        // The client's end-to-end headers without its credentials or impersonation; the agent
        // sets the user from the assertion alone.
        let headers = upstream_headers(&parts.headers, &user, None)?;
        let head = encode_request_head(&parts.method, target, &headers, &assertion);
        let send = self
            .agent_link(path)
            .await
            .map_err(|error| failed(AgentFailure::Link(error)))?;
        let (answer_head, answer_body) = call::exchange(send, agent, head, body, &path.limits)
            .await
            .map_err(failed)?;
        let held = (
            permit,
            share,
            InFlight::new(&self.gateway.metrics, self.worker),
        );
        let ends_cleanly = info.is_long_running();
        let mut answer = Response::new(ProxyBody::Agent(BoxedBody(Box::pin(AgentBody::new(
            answer_body,
            ends_cleanly,
            held,
        )))));
        *answer.status_mut() = answer_head.status;
        *answer.headers_mut() = crate::headers::response_headers(answer_head.headers);
        tracing::debug!(cluster = %compiled.name, user = %user.name, verb = info.verb.as_str(), path = info.path, agent, status = answer_head.status.as_u16(), "forwarded through the tunnel");
        Ok(answer)
    }

    /// This worker's link to the tunnel node, opened on first use and again once it broke.
    pub(crate) async fn agent_link(
        &self,
        path: &AgentPath,
    ) -> Result<h2::client::SendRequest<bytes::Bytes>, LinkFailure> {
        let existing = self.agent_link.borrow().clone();
        if let Some(link) = existing {
            if let Ok(ready) = link.ready().await {
                return Ok(ready);
            }
            self.agent_link.borrow_mut().take();
        }
        let opened = path.link.open(self.worker).await?;
        *self.agent_link.borrow_mut() = Some(opened.clone());
        opened
            .ready()
            .await
            .map_err(|error| LinkFailure(error.to_string()))
    }
}

/// The user's assertion for `agent`, bound to the request line (`target`: origin form).
fn sign(
    path: &AgentPath,
    user: &UserInfo,
    agent: u64,
    method: &http::Method,
    target: &str,
) -> Result<String, AgentFailure> {
    path.signer
        .sign(
            &Identity::from(user),
            agent,
            method.as_str(),
            target,
            SystemTime::now(),
        )
        .map_err(AgentFailure::Sign)
}
