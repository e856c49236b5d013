//! The gateway's word for who the user is. The agent impersonates whoever a request names, so it
//! must not take that from the request: the gateway (which authenticated the user) signs a
//! short-lived JWT (EdDSA) naming the user, addressed to one agent and bound to one request's
//! method and path; the agent accepts it only if a key it trusts signed it, it is current, and
//! it has not been used before.

mod jws;
mod keys;
mod replay;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_gateway::identity::UserInfo;

use replay::ReplayWindows;

/// `iss` of every assertion.
pub const ISSUER: &str = "sluice-gateway";
/// How long an assertion the gateway signs is valid: long enough for the tunnel's wait for an
/// agent to connect, short enough that a leaked one is soon useless.
pub const SIGNED_LIFETIME: Duration = Duration::from_secs(30);

/// The only requests a review assertion is good for: the gateway's own TokenReviews and
/// SubjectAccessReviews, for a cluster it reaches through agents alone.
pub const REVIEW_PATHS: [&str; 2] = [
    "/apis/authentication.k8s.io/v1/tokenreviews",
    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
];

/// Whom an accepted assertion vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vouched {
    /// A user the gateway authenticated: the agent impersonates them.
    User(Identity),
    /// The gateway itself, asking a review (POST to one of [`REVIEW_PATHS`]): the agent sends
    /// it as itself, impersonating nobody.
    GatewayReview,
}

/// The user a request acts as (Kubernetes `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl From<&UserInfo> for Identity {
    fn from(user: &UserInfo) -> Self {
        Self {
            user: user.name.clone(),
            uid: Some(user.uid.clone()).filter(|uid| !uid.is_empty()),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
        }
    }
}

impl From<&Identity> for UserInfo {
    fn from(identity: &Identity) -> Self {
        Self {
            name: identity.user.clone(),
            uid: identity.uid.clone().unwrap_or_default(),
            groups: identity.groups.clone(),
            extra: identity.extra.clone(),
        }
    }
}

/// Why an assertion was refused (or could not be made). The agent answers every refusal with
/// PERMISSION_DENIED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionError {
    #[error("malformed assertion: {0}")]
    Malformed(String),
    #[error("no trusted key verifies the assertion's signature")]
    BadSignature,
    #[error("the assertion expired at {exp} (now {now}, Unix seconds)")]
    Expired { exp: u64, now: u64 },
    #[error("the assertion is not valid before {iat} (now {now}, Unix seconds)")]
    NotYetValid { iat: u64, now: u64 },
    #[error("the assertion is valid for {lifetime} s, longer than {limit} s")]
    LifetimeTooLong { lifetime: u64, limit: u64 },
    #[error("the assertion is addressed to {audience:?}, not to this agent")]
    WrongAgent { audience: String },
    #[error("the assertion is bound to another request (method and path)")]
    WrongRequest,
    #[error("a review assertion is good only for POST to a TokenReview or SubjectAccessReview, and a user's never")]
    NotAReview,
    #[error("the assertion was already used")]
    Replayed,
    #[error(
        "the assertion is number {sequence} of its gateway, {window} or more before the newest accepted ({newest}): too old to tell whether it was used"
    )]
    OutsideReplayWindow {
        sequence: u64,
        newest: u64,
        window: u64,
    },
    #[error(
        "assertions of {capacity} gateways are remembered already, none expired: refused rather than remember more"
    )]
    ReplayCacheFull { capacity: usize },
    #[error("assertion key: {0}")]
    Key(String),
    #[error("cannot sign the assertion: {0}")]
    Signing(String),
}

impl AssertionError {
    /// A bounded label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::BadSignature => "bad_signature",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::LifetimeTooLong { .. } => "lifetime_too_long",
            Self::WrongAgent { .. } => "wrong_agent",
            Self::WrongRequest => "wrong_request",
            Self::NotAReview => "not_a_review",
            Self::Replayed => "replayed",
            Self::OutsideReplayWindow { .. } => "outside_replay_window",
            Self::ReplayCacheFull { .. } => "replay_cache_full",
            Self::Key(_) => "key",
            Self::Signing(_) => "signing",
        }
    }

    /// The gRPC status of a refused call.
    pub fn grpc_code(&self) -> u32 {
        crate::grpc_code::PERMISSION_DENIED
    }
}

/// The JWT's claims: the registered ones, the request binding and the identity.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    aud: String,
    iat: u64,
    exp: u64,
    /// base64url(sender id (8 bytes) | sequence (8 bytes, big-endian)): see `replay.rs`.
    jti: String,
    /// base64url(SHA-256("<METHOD> <path>")): the one request the assertion is good for.
    req: String,
    user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    extra: BTreeMap<String, Vec<String>>,
    /// The gateway's own review, not a user's request (`user` is then empty).
    #[serde(default, skip_serializing_if = "is_false")]
    review: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

fn audience(agent_id: u64) -> String {
    format!("sluice-agent:{agent_id}")
}

fn request_binding(method: &str, path: &str) -> String {
    let digest = Sha256::new()
        .chain_update(method.as_bytes())
        .chain_update(b" ")
        .chain_update(path.as_bytes())
        .finalize();
    URL_SAFE_NO_PAD.encode(digest)
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// The gateway's signing key, and the numbering of its assertions.
pub struct AssertionSigner {
    key: SigningKey,
    /// Random per signer: a restarted gateway numbers from 1 again as another sender.
    sender: [u8; 8],
    /// One atomic add per request, shared by the workers: the alternative, a sender per
    /// worker, would multiply the agents' replay windows by the cores.
    next_sequence: AtomicU64,
}

impl std::fmt::Debug for AssertionSigner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("AssertionSigner { key: <Ed25519 private key> }")
    }
}

impl AssertionSigner {
    /// From an Ed25519 private key in PKCS#8 PEM (`openssl genpkey -algorithm ed25519`).
    pub fn from_pem(pem: &[u8]) -> Result<Self, AssertionError> {
        let mut sender = [0u8; 8];
        getrandom::getrandom(&mut sender)
            .map_err(|error| AssertionError::Signing(format!("no randomness: {error}")))?;
        Ok(Self {
            key: keys::private_key(pem)?,
            sender,
            next_sequence: AtomicU64::new(1),
        })
    }

    /// An assertion that `identity` makes the request `method path` through agent `agent_id`,
    /// valid from `now` for [`SIGNED_LIFETIME`], usable once.
    pub fn sign(
        &self,
        identity: &Identity,
        agent_id: u64,
        method: &str,
        path: &str,
        now: SystemTime,
    ) -> Result<String, AssertionError> {
        self.sign_for(Some(identity), agent_id, (method, path), now)
    }

    /// An assertion that the gateway itself asks the review at `path` (one of
    /// [`REVIEW_PATHS`]) through agent `agent_id`.
    pub fn sign_review(
        &self,
        agent_id: u64,
        path: &str,
        now: SystemTime,
    ) -> Result<String, AssertionError> {
        self.sign_for(None, agent_id, ("POST", path), now)
    }

    fn sign_for(
        &self,
        identity: Option<&Identity>,
        agent_id: u64,
        (method, path): (&str, &str),
        now: SystemTime,
    ) -> Result<String, AssertionError> {
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        let mut jti = [0u8; 16];
        jti[..8].copy_from_slice(&self.sender);
        jti[8..].copy_from_slice(&sequence.to_be_bytes());
        let iat = unix_seconds(now);
        let user = identity.cloned().unwrap_or_default();
        let claims = Claims {
            iss: ISSUER.to_string(),
            aud: audience(agent_id),
            iat,
            exp: iat + SIGNED_LIFETIME.as_secs(),
            jti: URL_SAFE_NO_PAD.encode(jti),
            req: request_binding(method, path),
            user: user.user,
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            review: identity.is_none(),
        };
        jws::encode(&claims, &self.key)
    }
}

/// What an agent accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifierOptions {
    /// Longest `exp - iat` accepted: a gateway's assertions live [`SIGNED_LIFETIME`].
    pub max_lifetime: Duration,
    /// How far the gateway's clock may be from the agent's, either way.
    pub clock_skew: Duration,
    /// Per gateway, how far behind its newest accepted assertion one may arrive (in
    /// assertions; a multiple of 64 bits of memory per gateway).
    pub replay_window: u64,
    /// Most gateways whose assertions are remembered at once (until all of one's expire).
    pub max_senders: usize,
}

impl Default for VerifierOptions {
    fn default() -> Self {
        Self {
            max_lifetime: Duration::from_secs(60),
            clock_skew: Duration::from_secs(5),
            replay_window: 8_192,
            max_senders: 4_096,
        }
    }
}

/// An agent's check of the assertions the gateway sends with each request.
pub struct AssertionVerifier {
    keys: Vec<VerifyingKey>,
    audience: String,
    options: VerifierOptions,
    replays: ReplayWindows,
}

impl std::fmt::Debug for AssertionVerifier {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AssertionVerifier")
            .field("keys", &self.keys.len())
            .field("audience", &self.audience)
            .field("options", &self.options)
            .field("senders", &self.replays.senders())
            .finish()
    }
}

impl AssertionVerifier {
    /// Trusts the Ed25519 public keys (SPKI PEM, one or more per text) for assertions
    /// addressed to agent `agent_id`.
    pub fn new(
        keys: Vec<Vec<u8>>,
        agent_id: u64,
        options: VerifierOptions,
    ) -> Result<Self, AssertionError> {
        let mut trusted = Vec::new();
        for pem in &keys {
            trusted.extend(keys::public_keys(pem)?);
        }
        if trusted.is_empty() {
            return Err(AssertionError::Key("no trusted public key".into()));
        }
        Ok(Self {
            keys: trusted,
            audience: audience(agent_id),
            options,
            replays: ReplayWindows::new(options.replay_window, options.max_senders),
        })
    }

    /// The user `token` vouches for, if it is a user's assertion valid for the request
    /// `method path` now (see [`AssertionVerifier::verify_vouched`]).
    pub fn verify(
        &mut self,
        token: &str,
        method: &str,
        path: &str,
        now: SystemTime,
    ) -> Result<Identity, AssertionError> {
        match self.verify_vouched(token, method, path, now)? {
            Vouched::User(identity) => Ok(identity),
            Vouched::GatewayReview => Err(AssertionError::NotAReview),
        }
    }

    /// Whom `token` vouches for, if it is valid for the request `method path` now; an
    /// accepted token is remembered and refused the next time.
    pub fn verify_vouched(
        &mut self,
        token: &str,
        method: &str,
        path: &str,
        now: SystemTime,
    ) -> Result<Vouched, AssertionError> {
        let claims = jws::decode(token, &self.keys)?;
        if claims.iss != ISSUER {
            return Err(AssertionError::Malformed(format!(
                "issuer {:?} is not {ISSUER}",
                claims.iss
            )));
        }
        if claims.aud != self.audience {
            return Err(AssertionError::WrongAgent {
                audience: claims.aud,
            });
        }
        let lifetime = claims
            .exp
            .checked_sub(claims.iat)
            .ok_or_else(|| AssertionError::Malformed("it expires before it was issued".into()))?;
        if lifetime > self.options.max_lifetime.as_secs() {
            return Err(AssertionError::LifetimeTooLong {
                lifetime,
                limit: self.options.max_lifetime.as_secs(),
            });
        }
        let now = unix_seconds(now);
        let skew = self.options.clock_skew.as_secs();
        let forget_after = claims.exp.saturating_add(skew);
        if now > forget_after {
            return Err(AssertionError::Expired {
                exp: claims.exp,
                now,
            });
        }
        if claims.iat > now.saturating_add(skew) {
            return Err(AssertionError::NotYetValid {
                iat: claims.iat,
                now,
            });
        }
        if claims.req != request_binding(method, path) {
            return Err(AssertionError::WrongRequest);
        }
        // A user may POST a review of their own (impersonated, as any request); the gateway's
        // review assertion is good for nothing else.
        let review_request = method == "POST" && REVIEW_PATHS.contains(&path);
        if claims.review && (!review_request || !claims.user.is_empty()) {
            return Err(AssertionError::NotAReview);
        }
        let (sender, sequence) = jti(&claims.jti)?;
        self.replays.accept(sender, sequence, forget_after, now)?;
        if claims.review {
            return Ok(Vouched::GatewayReview);
        }
        Ok(Vouched::User(Identity {
            user: claims.user,
            uid: claims.uid,
            groups: claims.groups,
            extra: claims.extra,
        }))
    }

    /// Gateways whose assertions are remembered against replay now.
    pub fn senders(&self) -> usize {
        self.replays.senders()
    }
}

/// The sender and sequence of a `jti`, as the gateway encodes them.
fn jti(text: &str) -> Result<(u64, u64), AssertionError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
        .ok_or_else(|| AssertionError::Malformed("jti is not 128 bits in base64url".into()))?;
    let number = u128::from_be_bytes(bytes);
    Ok(((number >> 64) as u64, number as u64))
}
