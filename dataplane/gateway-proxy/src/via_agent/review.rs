//! The gateway's own TokenReviews and SubjectAccessReviews for a cluster it reaches through
//! agents alone: the review goes as one `MakeRequest` call, as a user's request would, under an
//! assertion that vouches for the gateway itself and is good for no other request than a review
//! (the agent then sends it as itself, impersonating nobody). A cluster with a usable server the
//! gateway dials keeps asking that one, on its reserved streams.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method};
use serde_json::Value;
use sluice_kube_tunnel::{encode_request_head, ResponseMessage};

use super::call::{self, After};
use crate::error::{AgentFailure, ApiCallFailure};
use crate::handler::GatewayHandler;
use crate::review::{post_json, review_answer, Reviewer, MAX_REVIEW_BYTES};
use crate::state::Generation;
use crate::upstream::{first_usable, is_usable};

impl Reviewer for GatewayHandler {
    fn post<'a>(
        &'a self,
        generation: &'a Generation,
        cluster: usize,
        path: &'static str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ApiCallFailure>> + 'a>> {
        Box::pin(async move {
            let compiled = &generation.snapshot.clusters()[cluster];
            let health = &generation.clusters[cluster].health;
            if first_usable(&compiled.servers, health).is_some() {
                return post_json(&self.pool, generation, cluster, path, body).await;
            }
            let agent = (0..compiled.servers.len())
                .filter(|&index| is_usable(&compiled.servers, health, index))
                .find_map(|index| compiled.servers[index].agent)
                .ok_or(ApiCallFailure::NoHealthyServer)?;
            self.review_via_agent(agent, path, body).await
        })
    }
}

impl GatewayHandler {
    async fn review_via_agent(
        &self,
        agent: u64,
        path: &'static str,
        body: Value,
    ) -> Result<Value, ApiCallFailure> {
        let failed = |cause: AgentFailure| ApiCallFailure::Agent { agent, cause };
        let route = self
            .gateway
            .agent_path()
            .ok_or(failed(AgentFailure::NoPath))?;
        let assertion = route
            .signer
            .sign_review(agent, path, SystemTime::now())
            .map_err(|error| failed(AgentFailure::Sign(error)))?;
        let mut headers = HeaderMap::new();
        let json = HeaderValue::from_static("application/json");
        headers.insert(http::header::CONTENT_TYPE, json.clone());
        headers.insert(http::header::ACCEPT, json);
        let head = encode_request_head(&Method::POST, path, &headers, &assertion);
        let send = self
            .agent_link(route)
            .await
            .map_err(|error| failed(AgentFailure::Link(error)))?;
        let (response, mut stream) = call::start(send, agent, head, After::Body)
            .await
            .map_err(failed)?;
        let payload = Bytes::from(serde_json::to_vec(&body)?);
        call::send_body(&mut stream, payload, route.limits.max_data_bytes)
            .await
            .map_err(failed)?;
        let (answer_head, mut answer) = call::answer(response, &route.limits)
            .await
            .map_err(failed)?;
        let mut collected = BytesMut::new();
        while let Some(message) = poll_fn(|cx| answer.poll_next(cx)).await.map_err(failed)? {
            if let ResponseMessage::Data(data) = message {
                if collected.len() + data.len() > MAX_REVIEW_BYTES {
                    return Err(ApiCallFailure::TooLarge {
                        path: path.into(),
                        limit: MAX_REVIEW_BYTES,
                    });
                }
                collected.extend_from_slice(&data);
            }
        }
        review_answer(path, answer_head.status, &collected)
    }
}
