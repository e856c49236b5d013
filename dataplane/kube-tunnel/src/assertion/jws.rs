//! The assertion's JWS compact form (RFC 7515), EdDSA only (RFC 8037).
//!
//! Hand-written rather than through `jsonwebtoken` (which the tests still check it against, both
//! ways): that crate takes key bytes per call and re-derives the Ed25519 key each time (a PKCS#8
//! parse and a base-point multiplication per signature). With the key kept parsed a signature
//! costs the gateway about half as much (`assertion::tests::jws_cost`, release, interleaved:
//! 21.5-23.3 us against 40.2-54.1 us); verification costs the agent about the same either way
//! (48.7-50.7 us against 50.4-52.9 us: the check itself dominates), and is strict (no
//! small-order point, no malleable signature), as RFC 8032's cofactorless check plus the weak-key
//! refusal at load.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::Deserialize;

use super::{AssertionError, Claims};

/// base64url(`{"alg":"EdDSA","typ":"JWT"}`): the only header the gateway writes.
const HEADER: &str = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9";

/// The header fields read; any other is ignored (RFC 7515 allows none that could loosen the
/// check: `crit` is not accepted as a reason to skip one).
#[derive(Deserialize)]
struct JwsHeader {
    alg: String,
}

pub(super) fn encode(claims: &Claims, key: &SigningKey) -> Result<String, AssertionError> {
    let payload =
        serde_json::to_vec(claims).map_err(|error| AssertionError::Signing(error.to_string()))?;
    // Header, payload and the 86 characters of a signature, with their dots.
    let mut token = String::with_capacity(HEADER.len() + payload.len() * 4 / 3 + 92);
    token.push_str(HEADER);
    token.push('.');
    URL_SAFE_NO_PAD.encode_string(&payload, &mut token);
    let signature = key.sign(token.as_bytes());
    token.push('.');
    URL_SAFE_NO_PAD.encode_string(signature.to_bytes(), &mut token);
    Ok(token)
}

/// The claims of `token`, once one of `keys` verifies its signature (strictly: no malleable
/// signature, no small-order point).
pub(super) fn decode(token: &str, keys: &[VerifyingKey]) -> Result<Claims, AssertionError> {
    let malformed = |why: &str| AssertionError::Malformed(why.to_string());
    let (signed, signature) = token
        .rsplit_once('.')
        .ok_or_else(|| malformed("not three dot-separated parts"))?;
    let (header, payload) = signed
        .split_once('.')
        .filter(|(_, payload)| !payload.contains('.'))
        .ok_or_else(|| malformed("not three dot-separated parts"))?;
    let header: JwsHeader = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or_else(|| malformed("the header is not base64url JSON with an `alg`"))?;
    if header.alg != "EdDSA" {
        // Not echoed: the text is the sender's, unverified and unbounded.
        return Err(malformed("the header's algorithm is not EdDSA"));
    }
    let signature: [u8; 64] = URL_SAFE_NO_PAD
        .decode(signature)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| malformed("the signature is not 64 bytes in base64url"))?;
    let signature = Signature::from_bytes(&signature);
    if !keys
        .iter()
        .any(|key| key.verify_strict(signed.as_bytes(), &signature).is_ok())
    {
        return Err(AssertionError::BadSignature);
    }
    URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok())
        .ok_or_else(|| malformed("the claims are not base64url JSON of the expected fields"))
}
