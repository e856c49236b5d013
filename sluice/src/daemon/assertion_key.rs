//! `gateway.agent_assertion_key_file`: the Ed25519 private key (PKCS#8 PEM, as `openssl genpkey
//! -algorithm ed25519` writes it) the gateway signs each request's user with for the agent
//! behind an agent server. Read bounded and tried once here, so `check-config`, a start and a
//! reload refuse a wrong file naming the field, never the first request.

use std::io::Read;
use std::path::Path;

use jsonwebtoken::{Algorithm, EncodingKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;

/// The config field, as errors name it.
pub const FIELD: &str = "gateway.agent_assertion_key_file";

/// Most bytes the file may hold: an Ed25519 PKCS#8 PEM is about 120, and a bound keeps a
/// mistaken path (a log, `/dev/zero`) from being read whole.
const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

/// Why a key file was refused (the message names the file).
#[derive(Debug, thiserror::Error)]
pub enum AssertionKeyError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error(
        "{file} holds more than {MAX_KEY_FILE_BYTES} bytes: it should hold one Ed25519 private key"
    )]
    TooLarge { file: String },
    #[error("{file} is not a PKCS#8 private key in PEM (-----BEGIN PRIVATE KEY-----, as `openssl genpkey -algorithm ed25519` writes): {reason}")]
    NotPkcs8 { file: String, reason: String },
    #[error("{file} holds a private key that is not an Ed25519 key (make one with `openssl genpkey -algorithm ed25519`)")]
    NotEd25519 { file: String },
}

/// The key file's PEM text, checked to be an Ed25519 PKCS#8 private key that signs.
pub fn read(path: &Path) -> Result<Vec<u8>, AssertionKeyError> {
    let file = path.display().to_string();
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|opened| opened.take(MAX_KEY_FILE_BYTES + 1).read_to_end(&mut pem))
        .map_err(|source| AssertionKeyError::Read {
            file: file.clone(),
            source,
        })?;
    if pem.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(AssertionKeyError::TooLarge { file });
    }
    check(&pem).map_err(|failure| match failure {
        Failure::NotPkcs8(reason) => AssertionKeyError::NotPkcs8 { file, reason },
        Failure::NotEd25519 => AssertionKeyError::NotEd25519 { file },
    })?;
    Ok(pem)
}

enum Failure {
    NotPkcs8(String),
    NotEd25519,
}

/// A PKCS#8 `PRIVATE KEY` block whose algorithm is Ed25519: the signer parses the structure
/// and checks the algorithm (RFC 8410) when it signs a probe.
fn check(pem: &[u8]) -> Result<(), Failure> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem)
        .map_err(|error| Failure::NotPkcs8(error.to_string()))?;
    let key = EncodingKey::from_ed_der(der.secret_pkcs8_der());
    jsonwebtoken::crypto::sign(b"probe", &key, Algorithm::EdDSA)
        .map_err(|_| Failure::NotEd25519)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn an_ed25519_pkcs8_key_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let path = written(&dir, "key.pem", key.serialize_pem().as_bytes());
        let pem = read(&path).unwrap();
        assert!(pem.starts_with(b"-----BEGIN PRIVATE KEY-----"));
    }

    #[test]
    fn other_keys_and_files_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ecdsa = rcgen::KeyPair::generate().unwrap();
        let ecdsa = written(&dir, "ecdsa.pem", ecdsa.serialize_pem().as_bytes());
        let error = read(&ecdsa).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("{} holds a private key that is not an Ed25519 key (make one with `openssl genpkey -algorithm ed25519`)", ecdsa.display())
        );
        let certificate = written(
            &dir,
            "cert.pem",
            b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        let error = read(&certificate).unwrap_err();
        assert!(
            matches!(error, AssertionKeyError::NotPkcs8 { .. }),
            "{error}"
        );
        let garbage = written(&dir, "garbage.pem", b"not a key\n");
        assert!(matches!(
            read(&garbage),
            Err(AssertionKeyError::NotPkcs8 { .. })
        ));
        let huge = written(&dir, "huge.pem", &vec![b'a'; 20_000]);
        assert!(matches!(
            read(&huge),
            Err(AssertionKeyError::TooLarge { .. })
        ));
        let missing = read(&dir.path().join("missing.pem")).unwrap_err();
        assert!(
            matches!(missing, AssertionKeyError::Read { .. }),
            "{missing}"
        );
    }
}
