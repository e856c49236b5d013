//! The review calls the gateway makes to a cluster's apiserver as itself: TokenReview and
//! SubjectAccessReview, as JSON over a pooled HTTP/2 stream on the connections reserved for
//! them (`CorePool::reserved_stream`: client requests, however many, never hold those streams,
//! so a user holding every client stream cannot starve authentication). A cluster whose servers
//! are all agents is asked through an agent instead (`via_agent/review.rs`), which is why the
//! callers hold a [`Reviewer`]. Building the request objects and reading the answers are plain
//! functions; `post_json` is the only I/O here.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request};
use serde_json::{json, Value};
use sluice_gateway::identity::{ImpersonationCheck, UserInfo};

use crate::error::{ApiCallFailure, UpstreamFailure};
use crate::pool::CorePool;
use crate::state::Generation;
use crate::upstream::first_usable;

pub const TOKEN_REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEW_PATH: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
/// Larger review answers are refused (real ones are a few hundred bytes).
pub const MAX_REVIEW_BYTES: usize = 1024 * 1024;

/// Carries one review to a cluster and returns the answer's JSON.
pub trait Reviewer {
    fn post<'a>(
        &'a self,
        generation: &'a Generation,
        cluster: usize,
        path: &'static str,
        body: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ApiCallFailure>> + 'a>>;
}
/// How much of a failed answer's body its error quotes.
const EXCERPT_BYTES: usize = 200;

/// What a TokenReview said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenVerdict {
    /// Shared: every cache hit hands the same user to its request without copying it.
    User(Rc<UserInfo>),
    Rejected,
}

impl TokenVerdict {
    pub fn user(&self) -> Option<Rc<UserInfo>> {
        match self {
            TokenVerdict::User(user) => Some(user.clone()),
            TokenVerdict::Rejected => None,
        }
    }
}

/// The TokenReview object for `token`.
pub fn token_review(token: &str) -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    })
}

/// The verdict of a TokenReview answer: a user only when authenticated with a non-empty name.
pub fn token_verdict(answer: &Value) -> TokenVerdict {
    let status = &answer["status"];
    if status["authenticated"].as_bool() != Some(true) {
        return TokenVerdict::Rejected;
    }
    let user = &status["user"];
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let name = user["username"].as_str().unwrap_or_default().to_string();
    if name.is_empty() {
        return TokenVerdict::Rejected;
    }
    TokenVerdict::User(Rc::new(UserInfo {
        name,
        uid: user["uid"].as_str().unwrap_or_default().to_string(),
        groups: strings(&user["groups"]),
        extra: user["extra"]
            .as_object()
            .map(|extra| {
                extra
                    .iter()
                    .map(|(key, values)| (key.clone(), strings(values)))
                    .collect()
            })
            .unwrap_or_default(),
    }))
}

/// The SubjectAccessReview object asking whether `user` may impersonate what `check` names.
pub fn access_review(user: &UserInfo, check: &ImpersonationCheck) -> Value {
    let mut attributes = json!({
        "verb": "impersonate",
        "group": check.api_group,
        "resource": check.resource,
        "name": check.name,
    });
    if !check.subresource.is_empty() {
        attributes["subresource"] = json!(check.subresource);
    }
    if !check.namespace.is_empty() {
        attributes["namespace"] = json!(check.namespace);
    }
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user.name,
            "uid": user.uid,
            "groups": user.groups,
            "extra": user.extra,
            "resourceAttributes": attributes,
        },
    })
}

/// Whether a SubjectAccessReview answer allows (anything but an explicit `true` denies).
pub fn access_allowed(answer: &Value) -> bool {
    answer["status"]["allowed"].as_bool() == Some(true)
}

/// POSTs a review object to a healthy server of the cluster as the gateway itself and returns
/// the answer, within `timeout`.
pub async fn review(
    reviewer: &dyn Reviewer,
    generation: &Generation,
    cluster: usize,
    path: &'static str,
    body: Value,
    timeout: Duration,
) -> Result<Value, ApiCallFailure> {
    match monoio::time::timeout(timeout, reviewer.post(generation, cluster, path, body)).await {
        Ok(answer) => answer,
        Err(_) => Err(ApiCallFailure::Timeout {
            path: path.into(),
            timeout,
        }),
    }
}

/// The review on a reserved stream to the cluster's first usable server that the gateway dials.
pub async fn post_json(
    pool: &CorePool,
    generation: &Generation,
    cluster: usize,
    path: &'static str,
    body: Value,
) -> Result<Value, ApiCallFailure> {
    let compiled = &generation.snapshot.clusters()[cluster];
    let runtime = &generation.clusters[cluster];
    let server = first_usable(&compiled.servers, &runtime.health)
        .map(|index| &compiled.servers[index])
        .ok_or(ApiCallFailure::NoHealthyServer)?;
    let (send, _slot) = pool
        .reserved_stream(
            &compiled.name,
            server,
            &runtime.client_tls,
            &compiled.connection_pool,
        )
        .await?;
    let mut send = send.ready().await.map_err(UpstreamFailure::Ready)?;
    let scheme = if server.tls { "https" } else { "http" };
    let mut request =
        Request::post(format!("{scheme}://{}:{}{path}", server.host, server.port)).body(())?;
    let headers = request.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json"),
    );
    if let Some(bearer) = &runtime.bearer {
        headers.insert(http::header::AUTHORIZATION, bearer.clone());
    }
    let payload = Bytes::from(serde_json::to_vec(&body)?);
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(UpstreamFailure::Send)?;
    sluice_grpc::transport::send_data(&mut stream, payload, true)
        .await
        .map_err(UpstreamFailure::Send)?;
    let response = response.await.map_err(UpstreamFailure::Response)?;
    let status = response.status();
    let mut recv = response.into_body();
    let mut collected = BytesMut::new();
    while let Some(chunk) = poll_fn(|cx| recv.poll_data(cx)).await {
        let chunk = chunk.map_err(UpstreamFailure::Response)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        if collected.len() + chunk.len() > MAX_REVIEW_BYTES {
            return Err(ApiCallFailure::TooLarge {
                path: path.into(),
                limit: MAX_REVIEW_BYTES,
            });
        }
        collected.extend_from_slice(&chunk);
    }
    review_answer(path, status, &collected)
}

/// The answer's JSON, or why it is not one.
pub fn review_answer(
    path: &'static str,
    status: http::StatusCode,
    body: &[u8],
) -> Result<Value, ApiCallFailure> {
    if !status.is_success() {
        return Err(ApiCallFailure::Status {
            path: path.into(),
            status,
            excerpt: excerpt(body),
        });
    }
    serde_json::from_slice(body).map_err(|source| ApiCallFailure::InvalidJson {
        path: path.into(),
        source,
    })
}

/// The start of a body, for an error message.
pub fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authenticated_token_names_its_user_with_groups_uid_and_extra() {
        let answer = json!({"status": {"authenticated": true, "user": {
            "username": "bob", "uid": "42", "groups": ["ops", 7, "dev"],
            "extra": {"scopes": ["a", "b"]},
        }}});
        let TokenVerdict::User(user) = token_verdict(&answer) else {
            panic!("rejected");
        };
        assert_eq!(user.name, "bob");
        assert_eq!(user.uid, "42");
        assert_eq!(user.groups, ["ops", "dev"], "non-strings are skipped");
        assert_eq!(user.extra["scopes"], ["a", "b"]);
    }

    #[test]
    fn unauthenticated_malformed_or_nameless_answers_reject() {
        for answer in [
            json!({"status": {"authenticated": false, "user": {"username": "bob"}}}),
            json!({"status": {"authenticated": "true", "user": {"username": "bob"}}}),
            json!({"status": {"authenticated": true, "user": {"username": ""}}}),
            json!({"status": {"authenticated": true}}),
            json!({}),
            json!("nonsense"),
        ] {
            assert_eq!(token_verdict(&answer), TokenVerdict::Rejected, "{answer}");
        }
    }

    #[test]
    fn a_token_review_carries_the_token() {
        let body = token_review("abc");
        assert_eq!(body["kind"], "TokenReview");
        assert_eq!(body["spec"]["token"], "abc");
    }

    #[test]
    fn an_access_review_asks_for_impersonate_on_the_target() {
        let user = UserInfo::new("alice", &["devs"]);
        let check = ImpersonationCheck {
            api_group: "",
            resource: "serviceaccounts",
            subresource: String::new(),
            namespace: "kube-system".into(),
            name: "deployer".into(),
        };
        let body = access_review(&user, &check);
        assert_eq!(body["kind"], "SubjectAccessReview");
        assert_eq!(body["spec"]["user"], "alice");
        assert_eq!(body["spec"]["groups"], json!(["devs"]));
        let attributes = &body["spec"]["resourceAttributes"];
        assert_eq!(attributes["verb"], "impersonate");
        assert_eq!(attributes["resource"], "serviceaccounts");
        assert_eq!(attributes["namespace"], "kube-system");
        assert_eq!(attributes["name"], "deployer");
        assert!(
            attributes.get("subresource").is_none(),
            "empty fields are left out"
        );
    }

    #[test]
    fn only_an_explicit_true_allows() {
        assert!(access_allowed(&json!({"status": {"allowed": true}})));
        for answer in [
            json!({"status": {"allowed": false}}),
            json!({"status": {"allowed": "true"}}),
            json!({"status": {}}),
            json!({}),
        ] {
            assert!(!access_allowed(&answer), "{answer}");
        }
    }

    #[test]
    fn an_excerpt_is_bounded_and_lossy() {
        assert_eq!(excerpt(b"short"), "short");
        assert_eq!(excerpt(&[b'x'; 500]).len(), EXCERPT_BYTES);
        assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
    }
}
