use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use test_support::Ed25519Keys;

use super::*;

const AGENT: u64 = 42;
const METHOD: &str = "GET";
const PATH: &str = "/api/v1/namespaces/default/pods?watch=true";

/// Two key pairs made by openssl, shared by the tests (each costs two processes).
fn keys() -> &'static [Ed25519Keys; 2] {
    static KEYS: OnceLock<[Ed25519Keys; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            Ed25519Keys::generate().expect("openssl makes a key"),
            Ed25519Keys::generate().expect("openssl makes a key"),
        ]
    })
}

fn identity() -> Identity {
    Identity {
        user: "alice".into(),
        uid: Some("1234".into()),
        groups: vec!["dev".into(), "system:authenticated".into()],
        extra: BTreeMap::from([("example.org/team".into(), vec!["blue".into(), "red".into()])]),
    }
}

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

const NOW: u64 = 1_800_000_000;

fn signer(index: usize) -> AssertionSigner {
    AssertionSigner::from_pem(&keys()[index].private_pem).unwrap()
}

fn verifier(options: VerifierOptions) -> AssertionVerifier {
    AssertionVerifier::new(vec![keys()[0].public_pem.clone()], AGENT, options).unwrap()
}

fn sign_now() -> String {
    signer(0)
        .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
        .unwrap()
}

/// A token with claims the gateway would never sign, signed with the trusted key.
fn forge(edit: impl FnOnce(&mut Claims)) -> String {
    let mut claims = Claims {
        iss: ISSUER.into(),
        aud: audience(AGENT),
        iat: NOW,
        exp: NOW + 30,
        jti: URL_SAFE_NO_PAD.encode([9u8; 16]),
        req: request_binding(METHOD, PATH),
        user: "alice".into(),
        uid: None,
        groups: vec![],
        extra: BTreeMap::new(),
    };
    edit(&mut claims);
    jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &signer(0).key).unwrap()
}

#[test]
fn a_signed_assertion_verifies_to_its_identity() {
    let token = sign_now();
    let verified = verifier(VerifierOptions::default())
        .verify(&token, METHOD, PATH, at(NOW))
        .unwrap();
    assert_eq!(verified, identity());
    // The claims are what the design names.
    let claims: Claims = jsonwebtoken::dangerous::insecure_decode_claims(&token).unwrap();
    assert_eq!(
        (claims.iss.as_str(), claims.aud.as_str()),
        ("sluice-gateway", "sluice-agent:42")
    );
    assert_eq!((claims.iat, claims.exp), (NOW, NOW + 30));
    assert_eq!(claims.jti.len(), 22);
    let digest = Sha256::digest(format!("{METHOD} {PATH}"));
    assert_eq!(claims.req, URL_SAFE_NO_PAD.encode(digest));
    let minimal = Identity {
        user: "bob".into(),
        ..Identity::default()
    };
    let token = signer(0)
        .sign(&minimal, AGENT, METHOD, PATH, at(NOW))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default())
            .verify(&token, METHOD, PATH, at(NOW))
            .unwrap(),
        minimal
    );
}

#[test]
fn expiry_allows_the_clock_skew_and_no_more() {
    let token = sign_now();
    verifier(VerifierOptions::default())
        .verify(&token, METHOD, PATH, at(NOW + 35))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&token, METHOD, PATH, at(NOW + 36)),
        Err(AssertionError::Expired {
            exp: NOW + 30,
            now: NOW + 36
        })
    );
}

#[test]
fn an_assertion_from_the_future_is_refused_beyond_the_skew() {
    let token = sign_now();
    verifier(VerifierOptions::default())
        .verify(&token, METHOD, PATH, at(NOW - 5))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&token, METHOD, PATH, at(NOW - 6)),
        Err(AssertionError::NotYetValid {
            iat: NOW,
            now: NOW - 6
        })
    );
}

#[test]
fn a_lifetime_longer_than_60_seconds_is_refused() {
    let at_limit = forge(|claims| claims.exp = NOW + 60);
    verifier(VerifierOptions::default())
        .verify(&at_limit, METHOD, PATH, at(NOW))
        .unwrap();
    let over = forge(|claims| claims.exp = NOW + 61);
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&over, METHOD, PATH, at(NOW)),
        Err(AssertionError::LifetimeTooLong {
            lifetime: 61,
            limit: 60
        })
    );
    let backwards = forge(|claims| claims.exp = NOW - 1);
    assert_eq!(
        verifier(VerifierOptions::default())
            .verify(&backwards, METHOD, PATH, at(NOW))
            .unwrap_err()
            .reason(),
        "malformed"
    );
}

#[test]
fn only_a_trusted_key_is_accepted() {
    let token = signer(1)
        .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&token, METHOD, PATH, at(NOW)),
        Err(AssertionError::BadSignature)
    );
    // Trusting both (two texts, or both keys in one text for a rotation) accepts either.
    let both = [keys()[0].public_pem.clone(), keys()[1].public_pem.clone()];
    let mut two_texts =
        AssertionVerifier::new(both.to_vec(), AGENT, VerifierOptions::default()).unwrap();
    two_texts.verify(&token, METHOD, PATH, at(NOW)).unwrap();
    let mut one_text =
        AssertionVerifier::new(vec![both.concat()], AGENT, VerifierOptions::default()).unwrap();
    one_text.verify(&token, METHOD, PATH, at(NOW)).unwrap();
    one_text.verify(&sign_now(), METHOD, PATH, at(NOW)).unwrap();
}

#[test]
fn an_assertion_for_another_agent_is_refused() {
    let token = signer(0)
        .sign(&identity(), 43, METHOD, PATH, at(NOW))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&token, METHOD, PATH, at(NOW)),
        Err(AssertionError::WrongAgent {
            audience: "sluice-agent:43".into()
        })
    );
}

#[test]
fn an_assertion_is_bound_to_its_method_and_path() {
    let token = sign_now();
    for (method, path) in [
        ("DELETE", PATH),
        ("get", PATH),
        (METHOD, "/api/v1/namespaces/kube-system/secrets"),
        (METHOD, "/api/v1/namespaces/default/pods?watch=true&x=1"),
        ("GET /api/v1/namespaces/default/pods?watch=true", ""),
    ] {
        assert_eq!(
            verifier(VerifierOptions::default()).verify(&token, method, path, at(NOW)),
            Err(AssertionError::WrongRequest),
            "{method} {path}"
        );
    }
}

#[test]
fn an_assertion_is_accepted_once() {
    let mut verifier = verifier(VerifierOptions::default());
    let token = sign_now();
    verifier.verify(&token, METHOD, PATH, at(NOW)).unwrap();
    assert_eq!(
        verifier.verify(&token, METHOD, PATH, at(NOW + 1)),
        Err(AssertionError::Replayed)
    );
    // A refused assertion is not remembered: it may not use up the cache.
    let other_agent = signer(0)
        .sign(&identity(), 43, METHOD, PATH, at(NOW))
        .unwrap();
    assert!(verifier
        .verify(&other_agent, METHOD, PATH, at(NOW))
        .is_err());
    assert_eq!(verifier.remembered(), 1);
}

#[test]
fn a_full_replay_cache_refuses_until_entries_expire() {
    let options = VerifierOptions {
        replay_capacity: 3,
        ..VerifierOptions::default()
    };
    let mut verifier = verifier(options);
    for _ in 0..3 {
        verifier.verify(&sign_now(), METHOD, PATH, at(NOW)).unwrap();
    }
    assert_eq!(
        verifier.verify(&sign_now(), METHOD, PATH, at(NOW)),
        Err(AssertionError::ReplayCacheFull { capacity: 3 })
    );
    assert_eq!(verifier.remembered(), 3);
    // Still remembered at the last second they could be accepted...
    let later = signer(0)
        .sign(&identity(), AGENT, METHOD, PATH, at(NOW + 35))
        .unwrap();
    assert_eq!(
        verifier.verify(&later, METHOD, PATH, at(NOW + 35)),
        Err(AssertionError::ReplayCacheFull { capacity: 3 })
    );
    // ...and forgotten after it.
    verifier.verify(&later, METHOD, PATH, at(NOW + 36)).unwrap();
    assert_eq!(verifier.remembered(), 1);
}

#[test]
fn a_tampered_assertion_is_refused() {
    let token = sign_now();
    let parts: Vec<&str> = token.split('.').collect();
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["user"] = "admin".into();
    claims["groups"] = serde_json::json!(["system:masters"]);
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    let tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert_eq!(
        verifier(VerifierOptions::default()).verify(&tampered, METHOD, PATH, at(NOW)),
        Err(AssertionError::BadSignature)
    );
    // Another algorithm in the header (`none`, or HMAC keyed with the public key) is refused.
    for header in [
        r#"{"alg":"none","typ":"JWT"}"#,
        r#"{"alg":"HS256","typ":"JWT"}"#,
    ] {
        let forged = format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            parts[1],
            parts[2]
        );
        assert_eq!(
            verifier(VerifierOptions::default())
                .verify(&forged, METHOD, PATH, at(NOW))
                .unwrap_err()
                .reason(),
            "malformed",
            "{header}"
        );
    }
    for garbage in ["", "abc", "a.b.c", &format!("{}.{}", parts[0], parts[1])] {
        assert_eq!(
            verifier(VerifierOptions::default())
                .verify(garbage, METHOD, PATH, at(NOW))
                .unwrap_err()
                .reason(),
            "malformed",
            "{garbage:?}"
        );
    }
}

#[test]
fn claims_the_gateway_never_signs_are_malformed() {
    for token in [
        forge(|claims| claims.iss = "someone-else".into()),
        forge(|claims| claims.jti = "short".into()),
        forge(|claims| claims.jti = URL_SAFE_NO_PAD.encode([1u8; 17])),
    ] {
        assert_eq!(
            verifier(VerifierOptions::default())
                .verify(&token, METHOD, PATH, at(NOW))
                .unwrap_err()
                .reason(),
            "malformed"
        );
    }
}

#[test]
fn keys_must_be_ed25519_pem() {
    let ecdsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    for private in [
        b"".to_vec(),
        b"not a key".to_vec(),
        keys()[0].public_pem.clone(),
        ecdsa.serialize_pem().into_bytes(),
    ] {
        assert_eq!(
            AssertionSigner::from_pem(&private).unwrap_err().reason(),
            "key",
            "{}",
            String::from_utf8_lossy(&private)
        );
    }
    for public in [
        b"".to_vec(),
        keys()[0].private_pem.clone(),
        ecdsa.public_key_pem().into_bytes(),
    ] {
        assert_eq!(
            AssertionVerifier::new(vec![public], AGENT, VerifierOptions::default())
                .unwrap_err()
                .reason(),
            "key"
        );
    }
    assert!(AssertionVerifier::new(vec![], AGENT, VerifierOptions::default()).is_err());
    // rcgen (ring) writes PKCS#8 v2, with the public key inside: also accepted.
    let ring_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let signer = AssertionSigner::from_pem(ring_key.serialize_pem().as_bytes()).unwrap();
    let token = signer
        .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
        .unwrap();
    let mut verifier = AssertionVerifier::new(
        vec![ring_key.public_key_pem().into_bytes()],
        AGENT,
        VerifierOptions::default(),
    )
    .unwrap();
    assert_eq!(
        verifier.verify(&token, METHOD, PATH, at(NOW)).unwrap(),
        identity()
    );
    assert!(!format!("{signer:?}").contains("PRIVATE"));
}

#[test]
fn identities_convert_to_and_from_the_gateways_user_info() {
    let user = UserInfo::from(&identity());
    assert_eq!(user.name, "alice");
    assert_eq!(user.uid, "1234");
    assert_eq!(Identity::from(&user), identity());
    let no_uid = Identity {
        uid: None,
        ..identity()
    };
    assert_eq!(Identity::from(&UserInfo::from(&no_uid)), no_uid);
}

#[test]
fn every_error_has_a_distinct_reason_and_is_permission_denied() {
    let errors = [
        AssertionError::Malformed(String::new()),
        AssertionError::BadSignature,
        AssertionError::Expired { exp: 0, now: 0 },
        AssertionError::NotYetValid { iat: 0, now: 0 },
        AssertionError::LifetimeTooLong {
            lifetime: 0,
            limit: 0,
        },
        AssertionError::WrongAgent {
            audience: String::new(),
        },
        AssertionError::WrongRequest,
        AssertionError::Replayed,
        AssertionError::ReplayCacheFull { capacity: 0 },
        AssertionError::Key(String::new()),
        AssertionError::Signing(String::new()),
    ];
    let reasons: std::collections::BTreeSet<&str> =
        errors.iter().map(AssertionError::reason).collect();
    assert_eq!(reasons.len(), errors.len());
    assert!(errors
        .iter()
        .all(|error| error.grpc_code() == crate::grpc_code::PERMISSION_DENIED));
}
