//! Ed25519 keys from PEM: the gateway's private key (PKCS#8, as `openssl genpkey -algorithm
//! ed25519` writes it) and the public keys an agent trusts (SPKI, `openssl pkey -pubout`). Each
//! is tried once when loaded, so a wrong file is refused at start and never at the first request.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};

use super::AssertionError;

/// The DER of an Ed25519 SubjectPublicKeyInfo (RFC 8410) before its 32 key bytes:
/// SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (33 bytes, no unused bits) }.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
const ED25519_KEY_BYTES: usize = 32;

pub(super) fn private_key(pem: &[u8]) -> Result<EncodingKey, AssertionError> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem).map_err(|error| {
        AssertionError::Key(format!("not a PKCS#8 private key in PEM: {error}"))
    })?;
    let key = EncodingKey::from_ed_der(der.secret_pkcs8_der());
    // The signer parses the PKCS#8 structure and checks its algorithm is Ed25519 (RFC 8410).
    jsonwebtoken::crypto::sign(b"probe", &key, Algorithm::EdDSA)
        .map_err(|_| AssertionError::Key("the private key is not an Ed25519 key".into()))?;
    Ok(key)
}

/// Every public key of one PEM text (several let an operator trust the next key of a rotation
/// beside the current one in one file).
pub(super) fn public_keys(pem: &[u8]) -> Result<Vec<DecodingKey>, AssertionError> {
    let mut keys = Vec::new();
    for der in SubjectPublicKeyInfoDer::pem_slice_iter(pem) {
        let der = der.map_err(|error| AssertionError::Key(format!("unreadable PEM: {error}")))?;
        keys.push(public_key(&der)?);
    }
    if keys.is_empty() {
        return Err(AssertionError::Key("no PUBLIC KEY in the PEM text".into()));
    }
    Ok(keys)
}

fn public_key(der: &[u8]) -> Result<DecodingKey, AssertionError> {
    let raw = der
        .strip_prefix(&ED25519_SPKI_PREFIX)
        .filter(|raw| raw.len() == ED25519_KEY_BYTES)
        .ok_or_else(|| AssertionError::Key("the public key is not an Ed25519 key".into()))?;
    let key = DecodingKey::from_ed_der(raw);
    // The verifier rejects bytes that are not a point of the curve when it is made; the
    // signature is any well-formed one (it does not verify, and need not).
    let probe = jsonwebtoken::crypto::verify(&"A".repeat(86), b"probe", &key, Algorithm::EdDSA);
    if probe.is_err() {
        return Err(AssertionError::Key(
            "the public key is not a valid Ed25519 point".into(),
        ));
    }
    Ok(key)
}
