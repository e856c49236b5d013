//! `POST /apis/authorization.k8s.io/v1/selfsubject{access,rules}reviews`: the caller asks what
//! it may do (`kubectl auth can-i`); the answer comes from [`crate::auth::review`], nothing is
//! stored. Every authenticated caller may ask about itself, as kube's `system:basic-user`.

use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use sluice_apimachinery::discovery;
use sluice_apimachinery::{StatusError, StatusReason};

use super::reply::Reply;
use super::ApiServer;
use crate::auth::review::{self, ACCESS_REVIEWS, GROUP, RULES_REVIEWS, VERSION};
use crate::auth::review_proto;
use crate::auth::{Identity, Verb};
use crate::request::ResourceRequest;

/// A review is a few attributes; 64 KiB is far more than any.
const MAX_REVIEW_BYTES: usize = 64 * 1024;

/// Whether a body is Kubernetes protobuf (kubectl's typed clients send reviews so).
pub(crate) fn is_protobuf(content_type: Option<&http::HeaderValue>) -> bool {
    content_type
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with(review_proto::PROTOBUF))
}

/// Whether a resource request is for the reviews' group (answered here, not from the store).
pub(crate) fn is_review(request: &ResourceRequest<'_>) -> bool {
    request.group == GROUP
}

/// The group's discovery documents: `/apis/authorization.k8s.io[/v1]`.
pub(crate) fn review_discovery(path: &str) -> Option<Value> {
    let rest = path.strip_prefix("/apis/")?;
    match rest.split_once('/') {
        None if rest == GROUP => Some(discovery::api_group_of(GROUP, VERSION)),
        Some((GROUP, VERSION)) => Some(discovery::resource_list(
            &format!("{GROUP}/{VERSION}"),
            vec![
                discovery::virtual_resource(
                    ACCESS_REVIEWS,
                    "SelfSubjectAccessReview",
                    false,
                    &["create"],
                ),
                discovery::virtual_resource(
                    RULES_REVIEWS,
                    "SelfSubjectRulesReview",
                    false,
                    &["create"],
                ),
            ],
        )),
        _ => None,
    }
}

/// The group and version [`discovery::api_group_list`] adds to the stored kinds' groups.
pub(crate) const REVIEW_GROUP: (&str, &str) = (GROUP, VERSION);

impl ApiServer {
    pub(crate) async fn review(
        &self,
        identity: &Identity,
        request: &ResourceRequest<'_>,
        protobuf: bool,
        body: Incoming,
    ) -> Result<Reply, StatusError> {
        let not_found = || {
            StatusError::new(
                StatusReason::NotFound,
                "the server could not find the requested resource",
            )
        };
        if request.version != VERSION
            || request.namespace.is_some()
            || request.name.is_some()
            || ![ACCESS_REVIEWS, RULES_REVIEWS].contains(&request.resource)
        {
            return Err(not_found());
        }
        if request.verb != Verb::Create {
            return Err(StatusError::new(
                StatusReason::MethodNotAllowed,
                format!(
                    "{} of {} is not supported: only create",
                    request.verb, request.resource
                ),
            ));
        }
        let body = match Limited::new(body, MAX_REVIEW_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                return Err(StatusError::bad_request(format!(
                    "the review could not be read, or is larger than {MAX_REVIEW_BYTES} bytes"
                )))
            }
        };
        let asked: Value = if protobuf {
            review_proto::decode_review(&body)
                .map_err(|error| StatusError::bad_request(error.to_string()))?
        } else {
            serde_json::from_slice(&body).map_err(|error| {
                StatusError::bad_request(format!("the request body is not JSON: {error}"))
            })?
        };
        let answer = if request.resource == ACCESS_REVIEWS {
            review::access_review(identity, &asked)
                .map_err(|error| StatusError::bad_request(error.to_string()))?
        } else {
            review::rules_review(identity, &self.registry, &asked)
        };
        let mut answer = answer;
        if answer.get("metadata").is_none() {
            answer["metadata"] = json!({});
        }
        Ok(Reply::json(StatusCode::CREATED, answer))
    }
}
