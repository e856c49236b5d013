//! The gateway's word for who the user is. The agent impersonates whoever a request names, so it
//! must not take that from the request: the gateway (which authenticated the user) signs a
//! short-lived JWT (EdDSA) naming the user, addressed to one agent and bound to one request's
//! method and path; the agent accepts it only if a key it trusts signed it, it is current, and
//! it has not been used before.

mod keys;
mod replay;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_gateway::identity::UserInfo;

use replay::ReplayCache;

/// `iss` of every assertion.
pub const ISSUER: &str = "sluice-gateway";
/// How long an assertion the gateway signs is valid: long enough for the tunnel's wait for an
/// agent to connect, short enough that a leaked one is soon useless.
pub const SIGNED_LIFETIME: Duration = Duration::from_secs(30);

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
    #[error("the assertion was already used")]
    Replayed,
    #[error(
        "{capacity} unexpired assertions are remembered already: refused rather than remember more"
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
            Self::Replayed => "replayed",
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

/// The gateway's signing key.
pub struct AssertionSigner {
    key: EncodingKey,
}

impl std::fmt::Debug for AssertionSigner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("AssertionSigner { key: <Ed25519 private key> }")
    }
}

impl AssertionSigner {
    /// From an Ed25519 private key in PKCS#8 PEM (`openssl genpkey -algorithm ed25519`).
    pub fn from_pem(pem: &[u8]) -> Result<Self, AssertionError> {
        Ok(Self {
            key: keys::private_key(pem)?,
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
        let mut jti = [0u8; 16];
        getrandom::getrandom(&mut jti)
            .map_err(|error| AssertionError::Signing(format!("no randomness: {error}")))?;
        let iat = unix_seconds(now);
        let claims = Claims {
            iss: ISSUER.to_string(),
            aud: audience(agent_id),
            iat,
            exp: iat + SIGNED_LIFETIME.as_secs(),
            jti: URL_SAFE_NO_PAD.encode(jti),
            req: request_binding(method, path),
            user: identity.user.clone(),
            uid: identity.uid.clone(),
            groups: identity.groups.clone(),
            extra: identity.extra.clone(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.key)
            .map_err(|error| AssertionError::Signing(error.to_string()))
    }
}

/// What an agent accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifierOptions {
    /// Longest `exp - iat` accepted: a gateway's assertions live [`SIGNED_LIFETIME`].
    pub max_lifetime: Duration,
    /// How far the gateway's clock may be from the agent's, either way.
    pub clock_skew: Duration,
    /// Most assertions remembered (until they expire) to refuse their replay.
    pub replay_capacity: usize,
}

impl Default for VerifierOptions {
    fn default() -> Self {
        Self {
            max_lifetime: Duration::from_secs(60),
            clock_skew: Duration::from_secs(5),
            replay_capacity: 65_536,
        }
    }
}

/// An agent's check of the assertions the gateway sends with each request.
pub struct AssertionVerifier {
    keys: Vec<DecodingKey>,
    audience: String,
    options: VerifierOptions,
    validation: Validation,
    replays: ReplayCache,
}

impl std::fmt::Debug for AssertionVerifier {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AssertionVerifier")
            .field("keys", &self.keys.len())
            .field("audience", &self.audience)
            .field("options", &self.options)
            .field("remembered", &self.replays.len())
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
        // The signature and algorithm only: every claim is checked below, each with its own
        // error.
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        Ok(Self {
            keys: trusted,
            audience: audience(agent_id),
            options,
            validation,
            replays: ReplayCache::new(options.replay_capacity),
        })
    }

    /// The identity `token` vouches for, if it is valid for the request `method path` now;
    /// an accepted token is remembered and refused the next time.
    pub fn verify(
        &mut self,
        token: &str,
        method: &str,
        path: &str,
        now: SystemTime,
    ) -> Result<Identity, AssertionError> {
        let claims = self.verified_claims(token)?;
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
        let jti = jti(&claims.jti)?;
        self.replays.insert(jti, forget_after, now)?;
        Ok(Identity {
            user: claims.user,
            uid: claims.uid,
            groups: claims.groups,
            extra: claims.extra,
        })
    }

    /// The claims, once one trusted key verifies the signature.
    fn verified_claims(&self, token: &str) -> Result<Claims, AssertionError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|error| AssertionError::Malformed(error.to_string()))?;
        if header.alg != Algorithm::EdDSA {
            return Err(AssertionError::Malformed(format!(
                "algorithm {:?} is not EdDSA",
                header.alg
            )));
        }
        for key in &self.keys {
            match jsonwebtoken::decode::<Claims>(token, key, &self.validation) {
                Ok(data) => return Ok(data.claims),
                Err(error) if matches!(error.kind(), ErrorKind::InvalidSignature) => continue,
                Err(error) => return Err(AssertionError::Malformed(error.to_string())),
            }
        }
        Err(AssertionError::BadSignature)
    }

    /// Assertions remembered against replay now.
    pub fn remembered(&self) -> usize {
        self.replays.len()
    }
}

/// The 128-bit random `jti`, as the gateway encodes it.
fn jti(text: &str) -> Result<u128, AssertionError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
        .ok_or_else(|| AssertionError::Malformed("jti is not 128 bits in base64url".into()))?;
    Ok(u128::from_be_bytes(bytes))
}
