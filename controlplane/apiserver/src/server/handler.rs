//! One request, top-down: what is asked, who asks, whether they may, then the work. Every
//! outcome, including each refusal, comes back here and is answered in one place.

use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::Response;
use hyper::body::Incoming;
use sluice_apimachinery::{discovery, openapi, KindSpec, StatusError, StatusReason};

use super::admission::{Pool, Slot};
use super::metrics::{AdmissionLabels, ReasonLabels, RequestLabels, VerbLabels};
use super::query::Query;
use super::reply::{render, Body, Reply};
use super::visibility::Visibility;
use super::{ApiServer, Peer};
use crate::auth::{self, AuthError, Decision, Identity};
use crate::events;
use crate::request::{self, ApiRequest, RequestError, ResourceRequest};

/// What the metrics say a request was, filled in as the phases learn it.
struct Labels {
    verb: &'static str,
    resource: String,
}

impl ApiServer {
    /// Answers one request.
    pub(crate) async fn handle(
        &self,
        request: http::Request<Incoming>,
        peer: &Peer,
    ) -> Response<Body> {
        let started = Instant::now();
        let (parts, body) = request.into_parts();
        let mut labels = Labels {
            verb: "unknown",
            resource: "none".into(),
        };
        let outcome = self.answer(&parts, body, peer, &mut labels).await;
        if let Err(error) = &outcome {
            if error.code >= 500 {
                tracing::warn!(code = error.code, message = %error.message, "API request failed");
            }
        }
        let watch = matches!(outcome, Ok(Reply::Stream(_)));
        let retry_after = match &outcome {
            Err(error) => error
                .details
                .as_ref()
                .and_then(|details| details.retry_after_seconds),
            Ok(_) => None,
        };
        let mut response = render(outcome);
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .entry(http::header::RETRY_AFTER)
                .or_insert_with(|| http::HeaderValue::from(seconds));
        }
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                verb: labels.verb,
                resource: labels.resource,
                code: response.status().as_u16(),
            })
            .inc();
        if !watch {
            self.metrics
                .request_seconds
                .get_or_create(&VerbLabels { verb: labels.verb })
                .observe(started.elapsed().as_secs_f64());
        }
        response
    }

    async fn answer(
        &self,
        parts: &Parts,
        body: Incoming,
        peer: &Peer,
        labels: &mut Labels,
    ) -> Result<Reply, StatusError> {
        let query = Query::parse(parts.uri.query().unwrap_or(""))?;
        let request = request::parse(parts.method.as_str(), parts.uri.path(), query.raw())
            .map_err(request_error)?;
        if !matches!(request, ApiRequest::Health(_)) {
            // The newest requests are the ones shed: those in flight and open watches go on.
            super::overload::shed()?;
        }
        let resource = match request {
            ApiRequest::Health(path) => {
                labels.verb = "health";
                return self.health(path).await;
            }
            ApiRequest::Discovery(path) => {
                labels.verb = "discovery";
                self.authenticate(parts, peer)?;
                return self.discovery(path);
            }
            ApiRequest::Resource(resource) => resource,
        };
        labels.verb = resource.verb.as_str();
        let identity = self.authenticate(parts, peer)?;
        // Held until the answer's head is ready (a watch's stream holds a watch slot instead).
        let _in_flight = self.admit(&self.request_slots, &identity)?;
        if super::reviews::is_review(&resource) {
            let protobuf =
                super::reviews::is_protobuf(parts.headers.get(http::header::CONTENT_TYPE));
            let answer = self.review(&identity, &resource, protobuf, body).await;
            labels.resource = resource.resource.chars().take(32).collect();
            return answer;
        }
        let spec = self
            .registry
            .by_resource(resource.group, resource.version, resource.resource)
            .ok_or_else(|| request_error(RequestError::NotFound))?;
        labels.resource = spec.plural.clone();
        let visibility = self.authorize(&identity, spec, &resource).await?;
        let user = identity.user_name();
        let call = super::objects::Call {
            spec,
            request: resource,
            query: &query,
            parts,
            visibility,
            user: user.clone(),
            identity,
        };
        let outcome = self.resource(call, body).await;
        if let Err(error) = &outcome {
            let (verb, namespace, name) = (resource.verb, resource.namespace, resource.name);
            if let Some(event) = events::refusal(spec, verb, namespace, name, &user, error) {
                self.events().record(event);
            }
        }
        outcome
    }

    /// A slot of `pool` for `identity`, or the 429 naming the share that is used up.
    pub(crate) fn admit(&self, pool: &Arc<Pool>, identity: &Identity) -> Result<Slot, StatusError> {
        pool.acquire(identity).map_err(|exhausted| {
            self.metrics
                .admission_refused
                .get_or_create(&AdmissionLabels {
                    pool: exhausted.kind().as_str(),
                    role: identity.role.as_str(),
                    budget: exhausted.budget(),
                })
                .inc();
            exhausted.status()
        })
    }

    /// Bearer token, or else a verified client certificate; no anonymous access. A success
    /// moves the connection out of the unauthenticated part of the connection table.
    fn authenticate(&self, parts: &Parts, peer: &Peer) -> Result<Identity, StatusError> {
        let identity = self.identify(parts, peer)?;
        if !peer.connection.is_authenticated() {
            // Over its share the request is refused and the connection stays unauthenticated
            // (so the first-request timeout or a newer connection closes it).
            let share = self.admit(&self.connection_slots, &identity)?;
            peer.connection.authenticated(share);
        }
        Ok(identity)
    }

    fn identify(&self, parts: &Parts, peer: &Peer) -> Result<Identity, StatusError> {
        let bearer = parts
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        let refused = |reason: &'static str, error: AuthError| {
            self.metrics
                .authentication_failures
                .get_or_create(&ReasonLabels { reason })
                .inc();
            StatusError::new(StatusReason::Unauthorized, error.to_string())
        };
        if let Some(bearer) = bearer {
            return self
                .tokens
                .load()
                .authenticate(bearer)
                .cloned()
                .map_err(|error| refused("unknown_token", error));
        }
        match &peer.certificate {
            Some(Ok(identity)) => Ok(identity.clone()),
            Some(Err(error)) => Err(refused("certificate", error.clone())),
            None => {
                self.metrics
                    .authentication_failures
                    .get_or_create(&ReasonLabels {
                        reason: "no_credentials",
                    })
                    .inc();
                Err(StatusError::new(
                    StatusReason::Unauthorized,
                    "Unauthorized: send a bearer token (sluice controlplane token create) or a \
                     client certificate signed by the control plane's client CA",
                ))
            }
        }
    }

    async fn authorize(
        &self,
        identity: &Identity,
        spec: &KindSpec,
        resource: &ResourceRequest<'_>,
    ) -> Result<Visibility, StatusError> {
        let asked = auth::Request {
            verb: resource.verb,
            group: resource.group,
            resource: resource.resource,
            subresource: resource.subresource,
            namespace: resource.namespace,
            name: resource.name,
        };
        match auth::authorize(identity, &asked) {
            Ok(Decision::Allow) => Ok(Visibility::All),
            Ok(Decision::AllowWithinSpan { vm }) => self.span_visibility(vm).await,
            Ok(Decision::AllowOwn { name }) => Ok(Visibility::Own { name }),
            Err(denied) => {
                let mut error = StatusError::forbidden(
                    spec,
                    resource.namespace,
                    resource.name.unwrap_or(""),
                    &identity.user_name(),
                    resource.verb.as_str(),
                );
                error.message = denied.message;
                Err(error)
            }
        }
    }

    fn discovery(&self, path: &str) -> Result<Reply, StatusError> {
        let not_found = || request_error(RequestError::NotFound);
        let document = match path {
            "/api" => discovery::api_versions(&self.registry),
            "/apis" => discovery::api_group_list(&self.registry, &[super::reviews::REVIEW_GROUP]),
            "/version" => discovery::version_info(
                "1",
                "32",
                concat!("v1.32.0-sluice-", env!("CARGO_PKG_VERSION")),
                "linux/amd64",
            ),
            "/openapi/v3" => openapi::openapi_index(&self.registry),
            "/openapi/v2" => {
                return Ok(Reply::Bytes {
                    content_type: openapi::OPENAPI_V2_PROTOBUF,
                    body: openapi::openapi_v2_document().into(),
                })
            }
            _ => {
                if let Some(group_version) = path.strip_prefix("/openapi/v3/apis/") {
                    let (group, version) = group_version.split_once('/').ok_or_else(not_found)?;
                    openapi::openapi_document(&self.registry, group, version)
                        .ok_or_else(not_found)?
                } else if let Some(version) = path.strip_prefix("/openapi/v3/api/") {
                    openapi::openapi_document(&self.registry, "", version).ok_or_else(not_found)?
                } else if let Some(version) = path.strip_prefix("/api/") {
                    discovery::api_resource_list(&self.registry, "", version)
                        .ok_or_else(not_found)?
                } else {
                    if let Some(document) = super::reviews::review_discovery(path) {
                        return Ok(Reply::ok(document));
                    }
                    let rest = path.strip_prefix("/apis/").ok_or_else(not_found)?;
                    match rest.split_once('/') {
                        None => discovery::api_group(&self.registry, rest).ok_or_else(not_found)?,
                        Some((group, version)) => {
                            discovery::api_resource_list(&self.registry, group, version)
                                .ok_or_else(not_found)?
                        }
                    }
                }
            }
        };
        Ok(Reply::ok(document))
    }

    async fn health(&self, path: &str) -> Result<Reply, StatusError> {
        match path {
            "/metrics" => Ok(Reply::Text(self.encode_metrics())),
            "/readyz" => match super::overload::readiness()
                .map(|()| self.store.current_revision())?
                .await
            {
                Ok(revision) => {
                    self.metrics.store_revision.set(revision as i64);
                    Ok(Reply::Text("ok\n".into()))
                }
                Err(error) => Err(StatusError::new(
                    StatusReason::ServiceUnavailable,
                    format!("the store is not reachable: {error}"),
                )),
            },
            _ => Ok(Reply::Text("ok\n".into())),
        }
    }
}

fn request_error(error: RequestError) -> StatusError {
    let reason = match error {
        RequestError::NotFound => StatusReason::NotFound,
        RequestError::MethodNotAllowed => StatusReason::MethodNotAllowed,
        RequestError::PathTooLong => StatusReason::BadRequest,
    };
    let mut status = StatusError::new(reason, error.to_string());
    status.code = error.http_status();
    status
}
