//! Every phase before forwarding, in order: host -> cluster, authentication, a client's own
//! impersonation request, dispatch, flow control, upstream pick. Each may end the request with
//! a [`ProxyError`]; the pure decisions are `sluice-gateway`'s and `upstream.rs`'s.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;
use sluice_gateway::flow_control::FlowPermit;
use sluice_gateway::identity::{impersonation_checks, requested_impersonation, UserInfo};
use sluice_gateway::request_info::RequestInfo;
use sluice_gateway::status::GatewayError;

use crate::access::AccessNote;
use crate::auth::MAX_TOKEN_BYTES;
use crate::error::{ApiCallFailure, ProxyError};
use crate::handler::{ClientConnection, GatewayHandler};
use crate::headers::bearer_token;
use crate::state::Generation;

/// A request that passed every check, with where it goes.
pub struct Admitted {
    pub cluster: usize,
    /// Index into the cluster's servers.
    pub server: usize,
    /// Who the apiserver will see (impersonated); shared with the cache or connection it came
    /// from, not copied per request.
    pub user: Rc<UserInfo>,
    pub permit: FlowPermit,
}

impl GatewayHandler {
    pub async fn admit(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        info: &RequestInfo<'_>,
        (headers, note): (&HeaderMap, &AccessNote),
    ) -> Result<Admitted, ProxyError> {
        // Host -> cluster: the one the TLS server name chose (if a reload removed it, the
        // connection's host is no longer served).
        let Some(cluster) = generation
            .snapshot
            .clusters()
            .iter()
            .position(|cluster| cluster.name == client.cluster)
        else {
            return Err(GatewayError::UnknownHost {
                host: client.cluster.to_string(),
            }
            .into());
        };
        let authenticated = self
            .authenticate(client, generation, cluster, headers)
            .await?;
        note.authenticated(&authenticated);
        let user = self
            .impersonate(generation, cluster, authenticated, headers)
            .await?;
        note.authenticated(&user);
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];
        let policy = compiled.dispatch.dispatch(info, &user).ok_or_else(|| {
            GatewayError::NoDispatchPolicy {
                cluster: compiled.name.to_string(),
                verb: info.verb.as_str(),
                path: info.path.to_string(),
            }
        })?;
        let flow = self.flow_control(generation, cluster);
        let mut permit = flow.admit(
            policy.flow_control_schema,
            info.is_long_running(),
            &user,
            Instant::now(),
        )?;
        if crate::head::is_upgrade(headers) {
            flow.admit_upgrade(&mut permit)?;
        }
        let server = self
            .round_robin
            .borrow_mut()
            .next(
                (&compiled.name, &policy.name),
                &policy.servers,
                &compiled.servers,
                &runtime.health,
            )
            .or_else(|| crate::upstream::waiting_agent(&policy.servers, &compiled.servers))
            .ok_or_else(|| GatewayError::NoHealthyUpstream {
                cluster: compiled.name.to_string(),
            })?;
        note.upstream(cluster, server);
        Ok(Admitted {
            cluster,
            server,
            user,
            permit,
        })
    }

    /// Who the client is: its verified certificate, else its bearer token (TokenReview), else
    /// anonymous when the cluster allows it.
    async fn authenticate(
        &self,
        client: &ClientConnection,
        generation: &Generation,
        cluster: usize,
        headers: &HeaderMap,
    ) -> Result<Rc<UserInfo>, ProxyError> {
        if let Some(user) = &client.certificate_user {
            return Ok(user.clone());
        }
        let compiled = &generation.snapshot.clusters()[cluster];
        if let Some(token) = bearer_token(headers) {
            if token.len() > MAX_TOKEN_BYTES {
                return Err(GatewayError::Unauthorized.into());
            }
            let metrics = &self.gateway.metrics;
            let user = self
                .auth
                .user_for_token(
                    self,
                    generation,
                    (cluster, client.peer),
                    token,
                    (metrics, self.worker),
                )
                .await?;
            return user.ok_or(GatewayError::Unauthorized.into());
        }
        if compiled.authentication.allow_anonymous {
            Ok(self.anonymous.clone())
        } else {
            Err(GatewayError::Unauthorized.into())
        }
    }

    /// Who the apiserver will see: the authenticated user, or the identity the client asked to
    /// impersonate once SubjectAccessReviews allow every part of it.
    async fn impersonate(
        &self,
        generation: &Generation,
        cluster: usize,
        authenticated: Rc<UserInfo>,
        headers: &HeaderMap,
    ) -> Result<Rc<UserInfo>, ProxyError> {
        let Some(requested) = requested_impersonation(headers).map_err(GatewayError::from)? else {
            return Ok(authenticated);
        };
        let compiled = &generation.snapshot.clusters()[cluster];
        for check in impersonation_checks(&requested) {
            let allowed = self
                .auth
                .may_impersonate(self, generation, cluster, &authenticated, &check)
                .await
                .map_err(|cause| auth_unavailable(&compiled.name, cause))?;
            if !allowed {
                return Err(GatewayError::ImpersonationForbidden {
                    user: authenticated.name.clone(),
                    kind: check.kind(),
                    value: check.name.clone(),
                }
                .into());
            }
        }
        Ok(Rc::new(requested))
    }
}

fn auth_unavailable(cluster: &str, cause: ApiCallFailure) -> ProxyError {
    ProxyError::AuthUnavailable {
        cluster: cluster.into(),
        cause,
    }
}
