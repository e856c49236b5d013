//! Authentication and impersonation checks that need the apiserver: TokenReview for bearer
//! tokens and SubjectAccessReview for client-sent Impersonate-* headers, asked with the
//! gateway's own identity and cached per core (no lock on the request path; each core asks at
//! most once per TTL).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request};
use serde_json::{json, Value};
use sluice_gateway::identity::{ImpersonationCheck, UserInfo};

use crate::pool::CorePool;
use crate::state::Generation;

/// Entries a core's cache may hold; past it, expired entries go, then everything.
const CACHE_LIMIT: usize = 10_000;
/// Larger review answers are refused (real ones are a few hundred bytes).
const MAX_REVIEW_BYTES: usize = 1024 * 1024;
/// Bearer tokens longer than this are refused without asking the apiserver.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone)]
enum TokenVerdict {
    User(UserInfo),
    Rejected,
}

/// One core's review caches.
#[derive(Debug, Default)]
pub struct CoreAuth {
    tokens: RefCell<HashMap<(u64, String), (TokenVerdict, Instant)>>,
    access: RefCell<HashMap<(u64, String), (bool, Instant)>>,
    /// Reviews in flight: later requests for the same token wait for the first one's answer
    /// instead of sending their own (a burst of new clients must not become a burst of
    /// TokenReviews).
    pending: RefCell<HashMap<(u64, String), Rc<event_listener::Event>>>,
}

/// Wakes the requests waiting on a review, however it ends.
struct PendingReview<'a> {
    pending: &'a RefCell<HashMap<(u64, String), Rc<event_listener::Event>>>,
    key: (u64, String),
}

impl Drop for PendingReview<'_> {
    fn drop(&mut self) {
        if let Some(event) = self.pending.borrow_mut().remove(&self.key) {
            event.notify(usize::MAX);
        }
    }
}

fn insert_bounded<V>(
    map: &mut HashMap<(u64, String), (V, Instant)>,
    key: (u64, String),
    value: V,
    ttl: Duration,
) {
    let now = Instant::now();
    if map.len() >= CACHE_LIMIT {
        map.retain(|_, (_, expires)| *expires > now);
        if map.len() >= CACHE_LIMIT {
            map.clear();
        }
    }
    map.insert(key, (value, now + ttl));
}

impl CoreAuth {
    /// The user a bearer token stands for (`None`: the apiserver rejected it), asking the
    /// cluster's apiserver with TokenReview on a cache miss. `cluster` keys the cache: one
    /// cluster's tokens mean nothing to another.
    pub async fn user_for_token(
        &self,
        pool: &CorePool,
        generation: &Generation,
        cluster: usize,
        token: &str,
        (metrics, worker): (&crate::metrics::GatewayMetrics, usize),
    ) -> Result<Option<UserInfo>, String> {
        let (hits, misses) = (&metrics.auth_cache_hits, &metrics.auth_cache_misses);
        let key = (cluster_key(generation, cluster), token.to_string());
        let _review = loop {
            if let Some((verdict, expires)) = self.tokens.borrow().get(&key) {
                if *expires > Instant::now() {
                    hits.inc(worker);
                    return Ok(match verdict {
                        TokenVerdict::User(user) => Some(user.clone()),
                        TokenVerdict::Rejected => None,
                    });
                }
            }
            let waiting = self.pending.borrow().get(&key).map(|event| event.listen());
            match waiting {
                // Another request of this core is asking: wait, then read the cache again
                // (if that review failed, this request asks itself).
                Some(listener) => listener.await,
                None => {
                    self.pending
                        .borrow_mut()
                        .insert(key.clone(), Rc::new(event_listener::Event::new()));
                    break PendingReview {
                        pending: &self.pending,
                        key: key.clone(),
                    };
                }
            }
        };
        misses.inc(worker);
        let settings = &generation.snapshot.clusters()[cluster].authentication;
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let answer = review(
            pool,
            generation,
            cluster,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body,
            settings.review_timeout,
        )
        .await?;
        let status = &answer["status"];
        let verdict = if status["authenticated"].as_bool() == Some(true) {
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
                TokenVerdict::Rejected
            } else {
                TokenVerdict::User(UserInfo {
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
                })
            }
        } else {
            TokenVerdict::Rejected
        };
        let ttl = match verdict {
            TokenVerdict::User(_) => settings.token_review_success_ttl,
            TokenVerdict::Rejected => settings.token_review_failure_ttl,
        };
        insert_bounded(&mut self.tokens.borrow_mut(), key, verdict.clone(), ttl);
        Ok(match verdict {
            TokenVerdict::User(user) => Some(user),
            TokenVerdict::Rejected => None,
        })
    }

    /// Whether `user` may impersonate what `check` names (SubjectAccessReview, cached).
    pub async fn may_impersonate(
        &self,
        pool: &CorePool,
        generation: &Generation,
        cluster: usize,
        user: &UserInfo,
        check: &ImpersonationCheck,
    ) -> Result<bool, String> {
        let key = (
            cluster_key(generation, cluster),
            format!(
                "{}\u{0}{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
                user.name,
                user.groups,
                check.api_group,
                check.resource,
                check.subresource,
                check.namespace,
                check.name
            ),
        );
        if let Some((allowed, expires)) = self.access.borrow().get(&key) {
            if *expires > Instant::now() {
                return Ok(*allowed);
            }
        }
        let settings = &generation.snapshot.clusters()[cluster].authentication;
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
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "uid": user.uid,
                "groups": user.groups,
                "extra": user.extra,
                "resourceAttributes": attributes,
            },
        });
        let answer = review(
            pool,
            generation,
            cluster,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body,
            settings.review_timeout,
        )
        .await?;
        let allowed = answer["status"]["allowed"].as_bool() == Some(true);
        insert_bounded(
            &mut self.access.borrow_mut(),
            key,
            allowed,
            settings.subject_access_review_ttl,
        );
        Ok(allowed)
    }
}

/// Caches are per cluster name (stable across reloads).
fn cluster_key(generation: &Generation, cluster: usize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    generation.snapshot.clusters()[cluster]
        .name
        .hash(&mut hasher);
    hasher.finish()
}

/// POSTs a review object to a healthy server of the cluster as the gateway itself and returns
/// the answer, within `timeout`.
async fn review(
    pool: &CorePool,
    generation: &Generation,
    cluster: usize,
    path: &str,
    body: Value,
    timeout: Duration,
) -> Result<Value, String> {
    match monoio::time::timeout(timeout, post_json(pool, generation, cluster, path, body)).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer to {path} within {timeout:?}")),
    }
}

async fn post_json(
    pool: &CorePool,
    generation: &Generation,
    cluster: usize,
    path: &str,
    body: Value,
) -> Result<Value, String> {
    let compiled = &generation.snapshot.clusters()[cluster];
    let runtime = &generation.clusters[cluster];
    let server = compiled
        .servers
        .iter()
        .zip(runtime.health.iter())
        .find(|(server, health)| !server.disabled && health.is_healthy())
        .map(|(server, _)| server)
        .ok_or_else(|| "no healthy server to ask".to_string())?;
    let (send, _slot) = pool
        .stream(
            &compiled.name,
            server,
            &runtime.client_tls,
            &compiled.connection_pool,
        )
        .await?;
    let mut send = send.ready().await.map_err(|error| error.to_string())?;
    let scheme = if server.tls { "https" } else { "http" };
    let mut request = Request::post(format!("{scheme}://{}:{}{path}", server.host, server.port))
        .body(())
        .map_err(|error| error.to_string())?;
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
    let payload = Bytes::from(serde_json::to_vec(&body).map_err(|error| error.to_string())?);
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(|error| error.to_string())?;
    sluice_grpc::transport::send_data(&mut stream, payload, true)
        .await
        .map_err(|error| error.to_string())?;
    let response = response.await.map_err(|error| error.to_string())?;
    let status = response.status();
    let mut recv = response.into_body();
    let mut collected = BytesMut::new();
    while let Some(chunk) = poll_fn(|cx| recv.poll_data(cx)).await {
        let chunk = chunk.map_err(|error| error.to_string())?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        if collected.len() + chunk.len() > MAX_REVIEW_BYTES {
            return Err(format!(
                "{path} answered more than {MAX_REVIEW_BYTES} bytes"
            ));
        }
        collected.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(format!(
            "{path} answered {status}: {}",
            String::from_utf8_lossy(&collected[..collected.len().min(200)])
        ));
    }
    serde_json::from_slice(&collected).map_err(|error| format!("{path}: invalid JSON: {error}"))
}
