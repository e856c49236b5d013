//! Ed25519 keys from PEM: the gateway's private key (PKCS#8, as `openssl genpkey -algorithm
//! ed25519` writes it) and the public keys an agent trusts (SPKI, `openssl pkey -pubout`). Each
//! is parsed once when loaded (a wrong file is refused at start, never at the first request)
//! and kept parsed.

use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{SigningKey, VerifyingKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};

use super::AssertionError;

/// The DER of an Ed25519 SubjectPublicKeyInfo (RFC 8410) before its 32 key bytes:
/// SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (33 bytes, no unused bits) }.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

pub(super) fn private_key(pem: &[u8]) -> Result<SigningKey, AssertionError> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem).map_err(|error| {
        AssertionError::Key(format!("not a PKCS#8 private key in PEM: {error}"))
    })?;
    // Checks the algorithm is Ed25519 (RFC 8410), and a v2 key's public half against the seed.
    SigningKey::from_pkcs8_der(der.secret_pkcs8_der())
        .map_err(|_| AssertionError::Key("the private key is not an Ed25519 key".into()))
}

/// Every public key of one PEM text (several let an operator trust the next key of a rotation
/// beside the current one in one file).
pub(super) fn public_keys(pem: &[u8]) -> Result<Vec<VerifyingKey>, AssertionError> {
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

fn public_key(der: &[u8]) -> Result<VerifyingKey, AssertionError> {
    let raw: [u8; 32] = der
        .strip_prefix(&ED25519_SPKI_PREFIX)
        .and_then(|raw| raw.try_into().ok())
        .ok_or_else(|| AssertionError::Key("the public key is not an Ed25519 key".into()))?;
    let key = VerifyingKey::from_bytes(&raw)
        .map_err(|_| AssertionError::Key("the public key is not a valid Ed25519 point".into()))?;
    // A small-order key would verify signatures nobody made with a private key.
    if key.is_weak() {
        return Err(AssertionError::Key(
            "the public key is a weak (small-order) Ed25519 point".into(),
        ));
    }
    Ok(key)
}
