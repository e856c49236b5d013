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
        review: false,
    };
    edit(&mut claims);
    jws::encode(&claims, &signer(0).key).unwrap()
}

/// The claims of a token, unverified.
fn claims_of(token: &str) -> Claims {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

#[test]
fn a_signed_assertion_verifies_to_its_identity() {
    let token = sign_now();
    let verified = verifier(VerifierOptions::default())
        .verify(&token, METHOD, PATH, at(NOW))
        .unwrap();
    assert_eq!(verified, identity());
    // The claims are what the design names.
    let claims = claims_of(&token);
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
    assert_eq!(verifier.senders(), 1);
}

#[test]
fn a_signer_numbers_its_assertions_and_another_signer_is_another_sender() {
    let numbers = |signer: &AssertionSigner| -> Vec<(u64, u64)> {
        (0..3)
            .map(|_| {
                let token = signer
                    .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
                    .unwrap();
                jti(&claims_of(&token).jti).unwrap()
            })
            .collect()
    };
    let sent = numbers(&signer(0));
    assert_eq!(
        sent.iter()
            .map(|(_, sequence)| *sequence)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(sent.iter().all(|(sender, _)| *sender == sent[0].0));
    // The same key loaded again (a restarted gateway) starts at 1 under another sender id.
    let again = numbers(&signer(0));
    assert_eq!(again[0].1, 1);
    assert_ne!(again[0].0, sent[0].0);
}

#[test]
fn assertions_may_arrive_out_of_order_within_the_window_and_each_once() {
    let mut windowed = verifier(VerifierOptions {
        replay_window: 64,
        ..VerifierOptions::default()
    });
    let signer = signer(0);
    let tokens: Vec<String> = (0..100)
        .map(|_| {
            signer
                .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
                .unwrap()
        })
        .collect();
    // The newest first, then the 63 before it in reverse: all within a 64-wide window.
    for token in tokens[36..].iter().rev() {
        windowed.verify(token, METHOD, PATH, at(NOW)).unwrap();
    }
    for token in &tokens[36..] {
        assert_eq!(
            windowed.verify(token, METHOD, PATH, at(NOW)),
            Err(AssertionError::Replayed)
        );
    }
    assert_eq!(
        windowed.verify(&tokens[35], METHOD, PATH, at(NOW)),
        Err(AssertionError::OutsideReplayWindow {
            sequence: 36,
            newest: 100,
            window: 64
        })
    );
    // More than the old per-assertion cache's 65,536 within one lifetime: the memory is per
    // gateway, not per assertion.
    let mut defaults = verifier(VerifierOptions::default());
    for _ in 0..70_000 {
        let token = signer
            .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
            .unwrap();
        defaults.verify(&token, METHOD, PATH, at(NOW)).unwrap();
    }
    assert_eq!(defaults.senders(), 1);
    // The defaults docs/CONFIG.md states.
    let options = VerifierOptions::default();
    assert_eq!((options.replay_window, options.max_senders), (8_192, 4_096));
}

#[test]
fn a_review_assertion_is_good_for_the_gateways_reviews_only() {
    for path in REVIEW_PATHS {
        let token = signer(0).sign_review(AGENT, path, at(NOW)).unwrap();
        assert_eq!(
            verifier(VerifierOptions::default()).verify_vouched(&token, "POST", path, at(NOW)),
            Ok(Vouched::GatewayReview)
        );
        // Never as a user's: `verify` is for user requests alone.
        assert_eq!(
            verifier(VerifierOptions::default()).verify(&token, "POST", path, at(NOW)),
            Err(AssertionError::NotAReview)
        );
    }
    // Bound to its request like any assertion, and signed for nothing but a review.
    let token = signer(0)
        .sign_review(AGENT, REVIEW_PATHS[0], at(NOW))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify_vouched(&token, METHOD, PATH, at(NOW)),
        Err(AssertionError::WrongRequest)
    );
    for (method, path) in [("GET", REVIEW_PATHS[0]), ("POST", PATH)] {
        let token = forge(|claims| {
            claims.review = true;
            claims.user = String::new();
            claims.req = request_binding(method, path);
        });
        assert_eq!(
            verifier(VerifierOptions::default()).verify_vouched(&token, method, path, at(NOW)),
            Err(AssertionError::NotAReview),
            "{method} {path}"
        );
    }
    // The gateway never signs one for another request either.
    let token = signer(0).sign_review(AGENT, PATH, at(NOW)).unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify_vouched(&token, "POST", PATH, at(NOW)),
        Err(AssertionError::NotAReview)
    );
    // A review claim that also names a user is not one the gateway signs.
    let both = forge(|claims| {
        claims.review = true;
        claims.req = request_binding("POST", REVIEW_PATHS[1]);
    });
    assert_eq!(
        verifier(VerifierOptions::default()).verify_vouched(
            &both,
            "POST",
            REVIEW_PATHS[1],
            at(NOW)
        ),
        Err(AssertionError::NotAReview)
    );
    // A user may ask a review of their own, impersonated as any request.
    let users = signer(0)
        .sign(&identity(), AGENT, "POST", REVIEW_PATHS[0], at(NOW))
        .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default()).verify_vouched(
            &users,
            "POST",
            REVIEW_PATHS[0],
            at(NOW)
        ),
        Ok(Vouched::User(identity()))
    );
}

#[test]
fn a_cache_full_of_live_gateways_refuses_a_new_one_until_one_expires() {
    let mut verifier = verifier(VerifierOptions {
        max_senders: 2,
        ..VerifierOptions::default()
    });
    // sign_now makes a new signer, a new sender, each time.
    for _ in 0..2 {
        verifier.verify(&sign_now(), METHOD, PATH, at(NOW)).unwrap();
    }
    assert_eq!(
        verifier.verify(&sign_now(), METHOD, PATH, at(NOW)),
        Err(AssertionError::ReplayCacheFull { capacity: 2 })
    );
    // Still remembered at the last second their assertions could be accepted...
    let later = signer(0)
        .sign(&identity(), AGENT, METHOD, PATH, at(NOW + 35))
        .unwrap();
    assert_eq!(
        verifier.verify(&later, METHOD, PATH, at(NOW + 35)),
        Err(AssertionError::ReplayCacheFull { capacity: 2 })
    );
    // ...and forgotten after it.
    verifier.verify(&later, METHOD, PATH, at(NOW + 36)).unwrap();
    assert_eq!(verifier.senders(), 1);
}

/// The first key pair as `jsonwebtoken` takes it.
fn jsonwebtoken_keys() -> (jsonwebtoken::EncodingKey, jsonwebtoken::DecodingKey) {
    use rustls_pki_types::pem::PemObject;
    let private =
        rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(&keys()[0].private_pem).unwrap();
    let public = verifier(VerifierOptions::default()).keys[0].to_bytes();
    (
        jsonwebtoken::EncodingKey::from_ed_der(private.secret_pkcs8_der()),
        jsonwebtoken::DecodingKey::from_ed_der(&public),
    )
}

#[test]
fn tokens_are_standard_jws_both_ways() {
    use jsonwebtoken::{Algorithm, Header, Validation};
    let ours = sign_now();
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_audience(&["sluice-agent:42"]);
    validation.validate_exp = false;
    let decoded =
        jsonwebtoken::decode::<serde_json::Value>(&ours, &jsonwebtoken_keys().1, &validation)
            .unwrap();
    assert_eq!(decoded.claims["user"], "alice");
    // A token jsonwebtoken signed with the same key verifies here.
    let mut claims = claims_of(&sign_now());
    claims.jti = URL_SAFE_NO_PAD.encode([3u8; 16]);
    let theirs = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &jsonwebtoken_keys().0,
    )
    .unwrap();
    assert_eq!(
        verifier(VerifierOptions::default())
            .verify(&theirs, METHOD, PATH, at(NOW))
            .unwrap(),
        identity()
    );
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
        AssertionError::NotAReview,
        AssertionError::Replayed,
        AssertionError::OutsideReplayWindow {
            sequence: 0,
            newest: 0,
            window: 0,
        },
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

/// What one request's assertion costs the gateway (sign) and the agent (verify), beside the
/// same through `jsonwebtoken`, interleaved in one run (the fastest of five rounds of each):
/// `cargo test --release -p sluice-kube-tunnel jws_cost -- --ignored --nocapture`. A
/// measurement, not a check: no timing is asserted.
#[test]
#[ignore]
fn jws_cost() {
    use jsonwebtoken::{Algorithm, Header, Validation};
    const CALLS: u32 = 2_000;
    let signer = signer(0);
    let claims = claims_of(&sign_now());
    let (encoding, decoding) = jsonwebtoken_keys();
    let token = sign_now();
    let trusted = verifier(VerifierOptions::default()).keys;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.validate_aud = false;
    validation.validate_exp = false;
    type Timed<'a> = (&'static str, Box<dyn FnMut() + 'a>);
    let mut work: [Timed; 4] = [
        (
            "sign",
            Box::new(|| {
                std::hint::black_box(
                    signer
                        .sign(&identity(), AGENT, METHOD, PATH, at(NOW))
                        .unwrap(),
                );
            }),
        ),
        (
            "sign (jsonwebtoken)",
            Box::new(|| {
                std::hint::black_box(
                    jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &encoding)
                        .unwrap(),
                );
            }),
        ),
        (
            "verify",
            Box::new(|| {
                std::hint::black_box(jws::decode(&token, &trusted).unwrap());
            }),
        ),
        (
            "verify (jsonwebtoken)",
            Box::new(|| {
                std::hint::black_box(
                    jsonwebtoken::decode::<serde_json::Value>(&token, &decoding, &validation)
                        .unwrap(),
                );
            }),
        ),
    ];
    let mut fastest = [std::time::Duration::MAX; 4];
    for _ in 0..5 {
        for (index, (_, call)) in work.iter_mut().enumerate() {
            let start = std::time::Instant::now();
            for _ in 0..CALLS {
                call();
            }
            fastest[index] = fastest[index].min(start.elapsed() / CALLS);
        }
    }
    for ((name, _), time) in work.iter().zip(fastest) {
        eprintln!("{name}: {time:?}");
    }
}
