//! Kubernetes API requests through the tunnel (`sluice_kube_tunnel`): the `sluice.kubernetes.v1`
//! messages as both ends decode them, with tight and default bounds; the order of an exchange;
//! the agent's check of the gateway's assertion, on raw strings and on claims the harness signs
//! with the trusted key (so the claim checks are reached); the apiserver head built from what
//! passed.
#![no_main]
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};
use sluice_kube_tunnel::codec::check_path;
use sluice_kube_tunnel::{
    apiserver_headers, decode_request, decode_response, encode_request_data, encode_request_end,
    encode_request_head, encode_request_upgrade_data, encode_response_data, encode_response_end,
    encode_response_head, encode_response_upgrade_data, AssertionError, AssertionVerifier,
    ExchangeLimits, ExchangeOrder, Identity, MessageKind, RequestMessage, ResponseMessage,
    VerifierOptions,
};

const AGENT: u64 = 42;
const NOW: u64 = 1_800_000_000;
const METHOD: &str = "GET";
const PATH: &str = "/api/v1/pods";

/// The harness's own Ed25519 key, from a fixed seed (a test key, trusted by nothing else):
/// its PKCS#8 DER for signing and its SPKI PEM for the verifier.
fn keys() -> &'static (jsonwebtoken::EncodingKey, Vec<u8>) {
    static KEYS: OnceLock<(jsonwebtoken::EncodingKey, Vec<u8>)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let seed = [7u8; 32];
        let mut pkcs8 = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        pkcs8.extend(seed);
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        let mut spki = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        spki.extend(public.to_bytes());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(spki)
        );
        (
            jsonwebtoken::EncodingKey::from_ed_der(&pkcs8),
            pem.into_bytes(),
        )
    })
}

fn verifier() -> AssertionVerifier {
    AssertionVerifier::new(vec![keys().1.clone()], AGENT, VerifierOptions::default())
        .expect("the harness's public key is trusted")
}

fn tight_limits() -> ExchangeLimits {
    ExchangeLimits {
        max_method_bytes: 4,
        max_path_bytes: 16,
        max_header_fields: 3,
        max_header_bytes: 32,
        max_assertion_bytes: 8,
        max_data_bytes: 16,
    }
}

/// An accepted request is within every bound and re-encodes to itself.
fn request(bytes: &[u8], limits: &ExchangeLimits) {
    let Ok(message) = decode_request(bytes, limits) else {
        return;
    };
    let again = match &message {
        RequestMessage::Head(head) => {
            assert!(head.method.as_str().len() <= limits.max_method_bytes);
            check_path(&head.path, limits).expect("an accepted path passes check_path");
            assert!(head.path.starts_with('/') && !head.path.starts_with("//"));
            assert!(head.headers.len() <= limits.max_header_fields);
            assert!(head.assertion.len() <= limits.max_assertion_bytes);
            apiserver_head(&head.headers);
            encode_request_head(&head.method, &head.path, &head.headers, &head.assertion)
        }
        RequestMessage::Data(data) => {
            assert!(data.len() <= limits.max_data_bytes);
            encode_request_data(data.clone())
        }
        RequestMessage::End => encode_request_end(),
        RequestMessage::UpgradeData(data) => {
            assert!(data.len() <= limits.max_data_bytes);
            encode_request_upgrade_data(data.clone())
        }
    };
    assert_eq!(decode_request(&again, limits), Ok(message));
}

fn response(bytes: &[u8], limits: &ExchangeLimits) {
    let Ok(message) = decode_response(bytes, limits) else {
        return;
    };
    let again = match &message {
        ResponseMessage::Head(head) => {
            assert!(head.headers.len() <= limits.max_header_fields);
            assert!(
                head.status == StatusCode::SWITCHING_PROTOCOLS || !head.status.is_informational()
            );
            encode_response_head(head.status, &head.headers)
        }
        ResponseMessage::Data(data) => {
            assert!(data.len() <= limits.max_data_bytes);
            encode_response_data(data.clone())
        }
        ResponseMessage::End => encode_response_end(),
        ResponseMessage::UpgradeData(data) => {
            assert!(data.len() <= limits.max_data_bytes);
            encode_response_upgrade_data(data.clone())
        }
    };
    assert_eq!(decode_response(&again, limits), Ok(message));
}

/// Whatever the client sent, the apiserver sees only the vouched-for identity and no host.
fn apiserver_head(client: &HeaderMap) {
    let identity = Identity {
        user: "alice".into(),
        uid: None,
        groups: vec!["dev".into()],
        extra: BTreeMap::new(),
    };
    let bearer = HeaderValue::from_static("Bearer agent");
    let headers = apiserver_headers(client, &identity, Some(&bearer)).expect("a plain identity");
    for (name, value) in &headers {
        let name = name.as_str();
        assert!(name != "host" && !name.starts_with("x-remote-"), "{name}");
        if name.starts_with("impersonate-") {
            assert!(
                ["impersonate-user", "impersonate-group"].contains(&name),
                "{name}"
            );
        }
        if name == "authorization" {
            assert_eq!(value, "Bearer agent");
        }
    }
    assert_eq!(headers.get_all("impersonate-user").iter().count(), 1);
    assert_eq!(
        headers
            .get_all("impersonate-group")
            .iter()
            .collect::<Vec<_>>(),
        ["dev"]
    );
}

/// Each byte is one message of one side: bit 7 the side, bits 0-1 the kind, bit 2 a 101 head.
/// A refused message leaves the state as it was; each side's head comes first and once; upgrade
/// data only ever follows a 101 and body data never does.
fn order(events: &[u8]) {
    let mut order = ExchangeOrder::new();
    let mut heads = [false; 2];
    let kinds = [
        MessageKind::Head,
        MessageKind::Data,
        MessageKind::End,
        MessageKind::UpgradeData,
    ];
    for &event in events {
        let kind = kinds[usize::from(event & 3)];
        let side = usize::from(event >> 7);
        let before = order.clone();
        let accepted = if side == 1 {
            order.request_kind(kind).is_ok()
        } else {
            let status = if event & 4 != 0 {
                StatusCode::SWITCHING_PROTOCOLS
            } else {
                StatusCode::OK
            };
            order.response_kind(kind, Some(status)).is_ok()
        };
        if !accepted {
            assert_eq!(order, before);
            continue;
        }
        assert_eq!(kind == MessageKind::Head, !heads[side]);
        heads[side] = true;
        match kind {
            MessageKind::UpgradeData => assert!(order.upgraded()),
            MessageKind::Data => assert!(!order.upgraded()),
            MessageKind::Head | MessageKind::End => {}
        }
    }
}

/// Claims signed with the trusted key: the fuzzed JSON object, with the claims it lacks filled
/// in valid, so each check is reached on its own.
fn signed_claims(json: &[u8]) {
    let Ok(serde_json::Value::Object(mut claims)) = serde_json::from_slice(json) else {
        return;
    };
    let binding = URL_SAFE_NO_PAD.encode(Sha256::digest(format!("{METHOD} {PATH}")));
    let defaults = [
        ("iss", serde_json::json!("sluice-gateway")),
        ("aud", serde_json::json!(format!("sluice-agent:{AGENT}"))),
        ("iat", serde_json::json!(NOW)),
        ("exp", serde_json::json!(NOW + 30)),
        ("jti", serde_json::json!(URL_SAFE_NO_PAD.encode([1u8; 16]))),
        ("req", serde_json::json!(binding)),
        ("user", serde_json::json!("alice")),
    ];
    for (name, value) in defaults {
        claims.entry(name).or_insert(value);
    }
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA),
        &claims,
        &keys().0,
    )
    .expect("the harness signs");
    let mut verifier = verifier();
    let at = UNIX_EPOCH + Duration::from_secs(NOW);
    let Ok(identity) = verifier.verify(&token, METHOD, PATH, at) else {
        return;
    };
    let number = |name: &str| claims[name].as_u64().expect("an accepted time is a number");
    let (iat, exp) = (number("iat"), number("exp"));
    assert_eq!(claims["iss"], "sluice-gateway");
    assert_eq!(claims["aud"], format!("sluice-agent:{AGENT}"));
    assert_eq!(claims["req"], binding);
    assert!(exp >= iat && exp - iat <= 60 && NOW <= exp + 5 && iat <= NOW + 5);
    assert_eq!(claims["user"], identity.user.as_str());
    assert_eq!(
        verifier.verify(&token, METHOD, PATH, at),
        Err(AssertionError::Replayed)
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let limits = if mode & 1 != 0 {
        tight_limits()
    } else {
        ExchangeLimits::default()
    };
    request(rest, &limits);
    response(rest, &limits);
    order(rest);
    // No string the harness did not sign verifies.
    if let Ok(token) = std::str::from_utf8(rest) {
        let at = UNIX_EPOCH + Duration::from_secs(NOW);
        assert!(verifier().verify(token, METHOD, PATH, at).is_err());
    }
    signed_claims(rest);
});
