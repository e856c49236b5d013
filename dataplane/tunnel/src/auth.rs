//! Who may use the node: agents by bearer token (stored as SHA-256 only), clients by short-lived
//! HS256 JWTs, as kas does.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sluice_config::{AgentTokenConfig, JwtConfig};

use crate::registry::AgentId;

/// Why a caller was refused; each maps to a bounded metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing authorization: expected `authorization: Bearer <token>`")]
    Missing,
    #[error("malformed authorization header: expected `Bearer <token>`")]
    Malformed,
    #[error("unknown agent token")]
    UnknownAgentToken,
    #[error("invalid token: {0}")]
    InvalidToken(&'static str),
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet")]
    NotYetValid,
    #[error("token issuer is not the expected one")]
    WrongIssuer,
    #[error("token audience is not the expected one")]
    WrongAudience,
    #[error("token algorithm is not HS256")]
    WrongAlgorithm,
    #[error("token lives longer than the allowed {0:?}")]
    TooLongLived(Duration),
    /// RFC 7515 §4.1.11: a recipient that does not understand a critical extension must reject
    /// the token, and this node understands none.
    #[error("token header lists critical extensions (crit), which this node does not support")]
    CriticalExtension,
}

impl AuthError {
    /// Label for `sluice_tunnel_auth_failures_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed => "malformed",
            AuthError::UnknownAgentToken => "unknown_agent_token",
            AuthError::InvalidToken(_) => "invalid_token",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::WrongIssuer => "wrong_issuer",
            AuthError::WrongAudience => "wrong_audience",
            AuthError::WrongAlgorithm => "wrong_algorithm",
            AuthError::TooLongLived(_) => "too_long_lived",
            AuthError::CriticalExtension => "critical_extension",
        }
    }
}

/// The bearer token of an `authorization` header.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let value = headers
        .get(http::header::AUTHORIZATION)
        .ok_or(AuthError::Missing)?;
    let text = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = text.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(token.trim())
}

/// Agent tokens by their SHA-256: the agent id comes from which token matched, never from
/// anything the agent says, so one agent cannot pose as another.
#[derive(Debug, Clone, Default)]
pub struct AgentTokens {
    /// foldhash, not SipHash: looked up on every call a tunnel carries (`still_allowed`).
    by_digest: foldhash::HashMap<[u8; 32], AgentId>,
    /// The agents with a token: looked up when an agent's connection ends, so a drain of N
    /// agents is not N scans of every token.
    agents: foldhash::HashSet<AgentId>,
}

impl AgentTokens {
    pub fn new(agents: &[AgentTokenConfig]) -> Self {
        Self {
            by_digest: agents
                .iter()
                .map(|agent| (agent.token_sha256, agent.id))
                .collect(),
            agents: agents.iter().map(|agent| agent.id).collect(),
        }
    }

    pub fn authenticate(&self, headers: &HeaderMap) -> Result<AgentId, AuthError> {
        self.authenticate_digest(headers).map(|(agent, _)| agent)
    }

    /// The agent and the digest of the token it presented (kept with its tunnels, so a
    /// revoked token's tunnels can be told from a rotated one's).
    pub fn authenticate_digest(
        &self,
        headers: &HeaderMap,
    ) -> Result<(AgentId, [u8; 32]), AuthError> {
        let token = bearer_token(headers)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest
            .get(&digest)
            .map(|agent| (*agent, digest))
            .ok_or(AuthError::UnknownAgentToken)
    }

    /// Whether `agent` may still use the token whose digest is `digest`.
    pub fn allows(&self, agent: AgentId, digest: &[u8; 32]) -> bool {
        self.by_digest.get(digest) == Some(&agent)
    }

    /// Whether any token here belongs to `agent`.
    pub fn knows(&self, agent: AgentId) -> bool {
        self.agents.contains(&agent)
    }

    /// The agents with a token in `self` that `newer` no longer accepts for them.
    pub fn revoked_by(&self, newer: &AgentTokens) -> Vec<AgentId> {
        let mut revoked: Vec<AgentId> = self
            .by_digest
            .iter()
            .filter(|(digest, agent)| !newer.allows(**agent, digest))
            .map(|(_, agent)| *agent)
            .collect();
        revoked.sort_unstable();
        revoked.dedup();
        revoked
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[derive(Debug, Deserialize)]
struct Claims {
    exp: u64,
    iat: u64,
}

/// Validates the JWTs clients present on the external endpoint.
#[derive(Clone)]
pub struct JwtValidator {
    key: DecodingKey,
    validation: Validation,
    leeway: Duration,
    max_lifetime: Duration,
    /// Which validator of the node this is (a reload that rotates the key makes the next one):
    /// a [`VerifiedTokens`] cache filled under another generation is emptied before use, so a
    /// token signed with a retired key stops working at once.
    generation: u64,
}

impl std::fmt::Debug for JwtValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtValidator")
            .field("max_lifetime", &self.max_lifetime)
            .finish_non_exhaustive()
    }
}

impl JwtValidator {
    pub fn new(config: &JwtConfig) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[config.issuer.as_str()]);
        validation.set_audience(&[config.audience.as_str()]);
        validation.leeway = config.leeway.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.required_spec_claims =
            HashSet::from(["exp", "iat", "iss", "aud"].map(String::from));
        Self {
            key: DecodingKey::from_secret(&config.secret),
            validation,
            leeway: config.leeway,
            max_lifetime: config.max_lifetime,
            generation: 0,
        }
    }

    /// This validator as generation `generation` (see [`Self::generation`]).
    pub fn with_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Checks signature, algorithm, issuer, audience, exp, nbf, iat (not in the future), that
    /// the token's lifetime (`exp - iat`) is short and that its header names no critical
    /// extension (`crit`).
    pub fn validate(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        self.validate_token(bearer_token(headers)?).map(|_| ())
    }

    /// [`Self::validate`] on a bare token; returns its `exp`.
    pub fn validate_token(&self, token: &str) -> Result<u64, AuthError> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |error| match error.kind() {
                ErrorKind::InvalidSignature => AuthError::BadSignature,
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::ImmatureSignature => AuthError::NotYetValid,
                ErrorKind::InvalidIssuer => AuthError::WrongIssuer,
                ErrorKind::InvalidAudience => AuthError::WrongAudience,
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    AuthError::WrongAlgorithm
                }
                ErrorKind::MissingRequiredClaim(_) => {
                    AuthError::InvalidToken("a required claim (exp, iat, iss, aud) is missing")
                }
                _ => AuthError::InvalidToken("not a well-formed JWT"),
            },
        )?;
        if data.header.crit.is_some() {
            return Err(AuthError::CriticalExtension);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if data.claims.iat > now + self.leeway.as_secs() {
            return Err(AuthError::NotYetValid);
        }
        if data.claims.exp.saturating_sub(data.claims.iat) > self.max_lifetime.as_secs() {
            return Err(AuthError::TooLongLived(self.max_lifetime));
        }
        Ok(data.claims.exp)
    }
}

/// Tokens one core has fully verified, with their expiry, so a client that sends the same JWT
/// on many calls (a connection's worth) pays for one signature check, as Envoy's `jwt_authn`
/// cache does. Only expiry can change a verified token's verdict (signature, issuer, audience,
/// lifetime and not-before/issued-at already held), so a hit re-checks expiry alone.
#[derive(Debug)]
pub struct VerifiedTokens {
    /// foldhash, not SipHash: every call hashes its token here, and SipHash over a JWT was
    /// about 1.4 % of a node's CPU per call. The keys are verified tokens only, so a client
    /// cannot fill the map with colliding ones.
    tokens: foldhash::HashMap<Box<str>, u64>,
    /// Tokens kept at most; beyond it expired ones are dropped, then all.
    capacity: usize,
    /// The generation of the validator that verified `tokens`.
    generation: u64,
}

impl VerifiedTokens {
    const CAPACITY: usize = 1024;
    /// Longer tokens are verified every time rather than kept.
    const MAX_TOKEN_LEN: usize = 2048;

    pub fn new() -> Self {
        Self::with_capacity(Self::CAPACITY)
    }

    fn with_capacity(capacity: usize) -> Self {
        Self {
            tokens: foldhash::HashMap::default(),
            capacity,
            generation: 0,
        }
    }

    /// [`JwtValidator::validate`], answered from this cache when the token was verified before.
    pub fn validate(
        &mut self,
        validator: &JwtValidator,
        headers: &HeaderMap,
    ) -> Result<(), AuthError> {
        let token = bearer_token(headers)?;
        if self.generation != validator.generation {
            // The key (or issuer, audience, lifetime) changed: earlier verdicts no longer hold.
            self.tokens.clear();
            self.generation = validator.generation;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let live = |exp: u64| exp.saturating_add(validator.leeway.as_secs()) >= now;
        if let Some(&exp) = self.tokens.get(token) {
            if live(exp) {
                return Ok(());
            }
            self.tokens.remove(token);
            return Err(AuthError::Expired);
        }
        let exp = validator.validate_token(token)?;
        if token.len() <= Self::MAX_TOKEN_LEN {
            if self.tokens.len() >= self.capacity {
                self.tokens.retain(|_, exp| live(*exp));
                if self.tokens.len() >= self.capacity {
                    self.tokens.clear();
                }
            }
            self.tokens.insert(token.into(), exp);
        }
        Ok(())
    }
}

impl Default for VerifiedTokens {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use proptest::prelude::*;
    use serde::Serialize;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn config() -> JwtConfig {
        JwtConfig {
            secret: SECRET.to_vec(),
            secret_file: "jwt.secret".into(),
            issuer: "gitlab".into(),
            audience: "gitlab-kas".into(),
            leeway: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(60),
        }
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[derive(Serialize)]
    struct TestClaims<'a> {
        iss: &'a str,
        aud: &'a str,
        iat: u64,
        exp: u64,
    }

    fn token(secret: &[u8], iss: &str, aud: &str, iat: u64, exp: u64) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &TestClaims { iss, aud, iat, exp },
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn valid_tokens_pass() {
        let validator = JwtValidator::new(&config());
        let good = token(SECRET, "gitlab", "gitlab-kas", now(), now() + 5);
        assert_eq!(
            validator.validate(&headers(&format!("Bearer {good}"))),
            Ok(())
        );
    }

    #[test]
    fn the_cache_answers_like_the_validator_and_rechecks_expiry() {
        let validator = JwtValidator::new(&config());
        let mut cache = VerifiedTokens::new();
        let n = now();
        let good = headers(&format!(
            "Bearer {}",
            token(SECRET, "gitlab", "gitlab-kas", n, n + 30)
        ));
        assert_eq!(cache.validate(&validator, &good), Ok(()));
        assert_eq!(cache.tokens.len(), 1);
        assert_eq!(cache.validate(&validator, &good), Ok(()), "a hit");
        // A bad token is never kept, and refused every time with its reason.
        let forged = headers(&format!(
            "Bearer {}",
            token(
                b"another-secret-another-secret-xx",
                "gitlab",
                "gitlab-kas",
                n,
                n + 30
            )
        ));
        for _ in 0..2 {
            assert_eq!(
                cache.validate(&validator, &forged),
                Err(AuthError::BadSignature)
            );
        }
        assert_eq!(cache.tokens.len(), 1);
        // An entry past its expiry (plus leeway) is refused and dropped.
        let token_text = cache.tokens.keys().next().unwrap().clone();
        cache.tokens.insert(token_text, n - 10);
        assert_eq!(cache.validate(&validator, &good), Err(AuthError::Expired));
        assert!(cache.tokens.is_empty());
    }

    #[test]
    fn a_rotated_key_empties_the_cache() {
        let old = JwtValidator::new(&config());
        let mut cache = VerifiedTokens::new();
        let n = now();
        let signed_with_old = headers(&format!(
            "Bearer {}",
            token(SECRET, "gitlab", "gitlab-kas", n, n + 30)
        ));
        assert_eq!(cache.validate(&old, &signed_with_old), Ok(()));
        let new_secret = b"fedcba9876543210fedcba9876543210";
        let rotated = JwtValidator::new(&JwtConfig {
            secret: new_secret.to_vec(),
            ..config()
        })
        .with_generation(old.generation() + 1);
        // The old token was verified before, but not by this key.
        assert_eq!(
            cache.validate(&rotated, &signed_with_old),
            Err(AuthError::BadSignature)
        );
        let signed_with_new = headers(&format!(
            "Bearer {}",
            token(new_secret, "gitlab", "gitlab-kas", n, n + 30)
        ));
        assert_eq!(cache.validate(&rotated, &signed_with_new), Ok(()));
        assert_eq!(cache.tokens.len(), 1);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let validator = JwtValidator::new(&config());
        let mut cache = VerifiedTokens::with_capacity(100);
        let n = now();
        for i in 0..300 {
            // Distinct tokens: distinct (issued-at, expiry) pairs within the allowed lifetime.
            let text = token(SECRET, "gitlab", "gitlab-kas", n - i % 50, n + 1 + i / 50);
            assert_eq!(
                cache.validate(&validator, &headers(&format!("Bearer {text}"))),
                Ok(())
            );
            assert!(cache.tokens.len() <= 100);
        }
    }

    #[test]
    fn every_bad_token_is_refused_with_its_reason() {
        let validator = JwtValidator::new(&config());
        let n = now();
        let cases = [
            (HeaderMap::new(), AuthError::Missing),
            (headers("Basic abc"), AuthError::Malformed),
            (headers("Bearer"), AuthError::Malformed),
            (
                headers(&format!(
                    "Bearer {}",
                    token(
                        b"another-secret-another-secret-xx",
                        "gitlab",
                        "gitlab-kas",
                        n,
                        n + 5
                    )
                )),
                AuthError::BadSignature,
            ),
            (
                headers(&format!(
                    "Bearer {}",
                    token(SECRET, "gitlab", "gitlab-kas", n - 100, n - 50)
                )),
                AuthError::Expired,
            ),
            (
                headers(&format!(
                    "Bearer {}",
                    token(SECRET, "evil", "gitlab-kas", n, n + 5)
                )),
                AuthError::WrongIssuer,
            ),
            (
                headers(&format!(
                    "Bearer {}",
                    token(SECRET, "gitlab", "other", n, n + 5)
                )),
                AuthError::WrongAudience,
            ),
            (
                headers(&format!(
                    "Bearer {}",
                    token(SECRET, "gitlab", "gitlab-kas", n + 100, n + 105)
                )),
                AuthError::NotYetValid,
            ),
            (
                headers(&format!(
                    "Bearer {}",
                    token(SECRET, "gitlab", "gitlab-kas", n, n + 3600)
                )),
                AuthError::TooLongLived(Duration::from_secs(60)),
            ),
            (
                headers("Bearer not.a.jwt"),
                AuthError::InvalidToken("not a well-formed JWT"),
            ),
        ];
        for (headers, expected) in cases {
            assert_eq!(
                validator.validate(&headers),
                Err(expected.clone()),
                "{expected}"
            );
        }
    }

    /// Client and node JWTs both pass through `validate_token`; a `crit` header (even an empty
    /// list, which RFC 7515 forbids outright) is refused, however valid the rest.
    #[test]
    fn a_critical_header_is_refused() {
        let validator = JwtValidator::new(&config());
        let n = now();
        let claims = TestClaims {
            iss: "gitlab",
            aud: "gitlab-kas",
            iat: n,
            exp: n + 5,
        };
        for crit in [vec!["exp".to_string()], vec!["b64".to_string()], Vec::new()] {
            let mut header = Header::new(Algorithm::HS256);
            header.crit = Some(crit.clone());
            let signed = encode(&header, &claims, &EncodingKey::from_secret(SECRET)).unwrap();
            let refused = validator.validate_token(&signed);
            assert_eq!(refused, Err(AuthError::CriticalExtension), "crit {crit:?}");
            assert_eq!(AuthError::CriticalExtension.reason(), "critical_extension");
        }
        let plain = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert!(validator.validate_token(&plain).is_ok());
    }

    #[test]
    fn alg_none_is_refused() {
        // {"alg":"none","typ":"JWT"} . claims . (no signature)
        let header = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0";
        let claims = format!(
            "{{\"iss\":\"gitlab\",\"aud\":\"gitlab-kas\",\"iat\":{},\"exp\":{}}}",
            now(),
            now() + 5
        );
        let claims = base64_url(claims.as_bytes());
        let validator = JwtValidator::new(&config());
        let error = validator
            .validate(&headers(&format!("Bearer {header}.{claims}.")))
            .unwrap_err();
        assert!(
            matches!(
                error,
                AuthError::WrongAlgorithm | AuthError::InvalidToken(_)
            ),
            "{error:?}"
        );
    }

    fn base64_url(bytes: &[u8]) -> String {
        const TABLE: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn a_new_table_revokes_removed_and_replaced_tokens_only() {
        let old = AgentTokens::new(&[
            AgentTokenConfig {
                id: 7,
                token_sha256: [7; 32],
            },
            AgentTokenConfig {
                id: 8,
                token_sha256: [8; 32],
            },
            AgentTokenConfig {
                id: 9,
                token_sha256: [9; 32],
            },
        ]);
        let new = AgentTokens::new(&[
            AgentTokenConfig {
                id: 7,
                token_sha256: [7; 32],
            },
            AgentTokenConfig {
                id: 8,
                token_sha256: [88; 32],
            },
        ]);
        assert_eq!(old.revoked_by(&new), [8, 9]);
        assert!(new.allows(7, &[7; 32]) && !new.allows(8, &[8; 32]) && !new.allows(7, &[88; 32]));
        assert!(new.revoked_by(&new).is_empty());
        // A disconnect asks whether its agent still has a token: 8 does (a new one), 9 not.
        assert!(new.knows(7) && new.knows(8) && !new.knows(9));
        assert!(old.knows(9) && !AgentTokens::default().knows(7));
    }

    #[test]
    fn agent_tokens_map_to_their_ids_only() {
        let tokens = AgentTokens::new(&[
            AgentTokenConfig {
                id: 7,
                token_sha256: Sha256::digest(b"seven").into(),
            },
            AgentTokenConfig {
                id: 8,
                token_sha256: Sha256::digest(b"eight").into(),
            },
        ]);
        assert_eq!(tokens.authenticate(&headers("Bearer seven")), Ok(7));
        assert_eq!(tokens.authenticate(&headers("bearer eight")), Ok(8));
        assert_eq!(
            tokens.authenticate(&headers("Bearer nine")),
            Err(AuthError::UnknownAgentToken)
        );
        assert_eq!(
            tokens.authenticate(&HeaderMap::new()),
            Err(AuthError::Missing)
        );
    }

    proptest! {
        #[test]
        fn arbitrary_authorization_values_never_panic(value in "[ -~]{0,300}") {
            if let Ok(value) = HeaderValue::from_str(&value) {
                let mut headers = HeaderMap::new();
                headers.insert(http::header::AUTHORIZATION, value);
                let _ = JwtValidator::new(&config()).validate(&headers);
                let _ = AgentTokens::default().authenticate(&headers);
            }
        }
    }
}
