//! The `authorization` header on the tunnel's endpoints: `sluice_tunnel::auth::bearer_token`,
//! agent tokens (`AgentTokens::authenticate`) and client JWTs (`JwtValidator::validate`).
//! Mode byte 0: the rest is the raw header value. Otherwise the rest is a JWT claims object that
//! the harness signs with the right key (HS256), so the fuzzer reaches the claim checks (exp,
//! iat, iss, aud, lifetime) behind the signature.
#![no_main]
use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use libfuzzer_sys::fuzz_target;
use sluice_config::{AgentTokenConfig, JwtConfig};
use sluice_tunnel::auth::{bearer_token, AgentTokens, JwtValidator};

const SECRET: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-sec";

fn validator() -> &'static JwtValidator {
    static VALIDATOR: OnceLock<JwtValidator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        JwtValidator::new(&JwtConfig {
            secret: SECRET.to_vec(),
            secret_file: Default::default(),
            issuer: "sluice".into(),
            audience: "sluice-tunnel".into(),
            leeway: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(300),
        })
    })
}

fn agents() -> &'static AgentTokens {
    static AGENTS: OnceLock<AgentTokens> = OnceLock::new();
    AGENTS.get_or_init(|| {
        use sha2::Digest as _;
        AgentTokens::new(&[AgentTokenConfig {
            id: 7,
            token_sha256: sha2::Sha256::digest(b"agent-token").into(),
        }])
    })
}

fn check(value: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    if let Ok(token) = bearer_token(&headers) {
        assert!(!token.is_empty());
        let _ = validator().validate_token(token);
    }
    let _ = validator().validate(&headers);
    if let Ok(agent) = agents().authenticate(&headers) {
        assert_eq!(agent, 7);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode == 0 {
        check(rest);
        return;
    }
    let Ok(claims) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let Ok(token) = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET),
    ) else {
        return;
    };
    check(format!("Bearer {token}").as_bytes());
});
