//! Throw-away Ed25519 key pairs, made by openssl as an operator would
//! (`openssl genpkey -algorithm ed25519`), so tests read the same PKCS#8 and SPKI PEM files the
//! daemons are configured with.

use std::io::Write;
use std::process::{Command, Stdio};

/// An Ed25519 private key (PKCS#8 PEM) and its public key (SPKI PEM).
#[derive(Debug, Clone)]
pub struct Ed25519Keys {
    pub private_pem: Vec<u8>,
    pub public_pem: Vec<u8>,
}

impl Ed25519Keys {
    pub fn generate() -> std::io::Result<Self> {
        let private_pem = openssl(&["genpkey", "-algorithm", "ed25519"], &[])?;
        let public_pem = openssl(&["pkey", "-pubout"], &private_pem)?;
        Ok(Self {
            private_pem,
            public_pem,
        })
    }
}

fn openssl(args: &[&str], input: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| {
            std::io::Error::other(format!("cannot run openssl (apt install openssl): {error}"))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input)?;
    }
    let output = child.wait_with_output()?;
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(std::io::Error::other(format!(
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
