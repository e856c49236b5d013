//! The agent's side towards its apiserver: one HTTP/2 connection shared by every call (dialled
//! on first use, again after it died; TLS with the configured CA, ALPN h2) and the agent's own
//! bearer token, read again when its file changes (projected service-account tokens rotate).

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use h2::client::SendRequest;
use http::HeaderValue;
use sluice_config::{Endpoint, KubeCredential};
use sluice_grpc::transport::H2Settings;

use super::KubeSetup;
use crate::agent::dial;
use crate::error::{ErrorKind, TunnelError};

/// How often the token file is looked at (a `stat`) for a change.
const TOKEN_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Most bytes of a token file (a service-account JWT is about 1 KiB).
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The forwarder's per-run state (the agent task's worker only).
pub(in crate::agent) struct KubeApi {
    pub(super) setup: Arc<KubeSetup>,
    connection: RefCell<Option<SendRequest<Bytes>>>,
    driver: RefCell<Option<monoio::task::JoinHandle<Option<()>>>>,
    settings: H2Settings,
    token: Option<TokenFile>,
    pub(super) in_flight: Cell<usize>,
}

impl KubeApi {
    pub(in crate::agent) fn new(setup: Arc<KubeSetup>) -> Self {
        let token = match &setup.config.credential {
            KubeCredential::TokenFile(path) => Some(TokenFile::new(path.clone())),
            KubeCredential::ClientCertificate { .. } => None,
        };
        Self {
            setup,
            connection: RefCell::new(None),
            driver: RefCell::new(None),
            settings: H2Settings::default(),
            token,
            in_flight: Cell::new(0),
        }
    }

    /// A handle ready to open one stream on the shared connection.
    pub(super) async fn ready(&self) -> Result<SendRequest<Bytes>, TunnelError> {
        let existing = self.connection.borrow().clone();
        if let Some(connection) = existing {
            match connection.ready().await {
                Ok(ready) => return Ok(ready),
                Err(_) => {
                    self.connection.borrow_mut().take();
                }
            }
        }
        let config = &self.setup.config;
        let endpoint = Endpoint {
            url: config.url.clone(),
            tls: true,
            host: config.host.clone(),
            port: config.port,
        };
        let tls = Some(self.setup.tls.clone());
        let kind = ErrorKind::BackendUnavailable;
        let connection = Box::pin(dial(&endpoint, &tls, &self.settings, kind)).await?;
        let ready = connection
            .ready()
            .await
            .map_err(|error| TunnelError::new(kind, error.to_string()))?;
        *self.connection.borrow_mut() = Some(connection.send_request);
        *self.driver.borrow_mut() = Some(connection.driver);
        Ok(ready)
    }

    /// `Authorization: Bearer <token>` when the agent authenticates with a token.
    pub(super) fn bearer(&self) -> Result<Option<HeaderValue>, TunnelError> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        token.current(Instant::now()).map(Some).map_err(|why| {
            TunnelError::new(
                ErrorKind::BackendUnavailable,
                format!("agent.kubernetes_api.token_file: {why}"),
            )
        })
    }

    /// Closes the connection and waits (bounded) for its driver, at the agent's stop.
    pub(in crate::agent) async fn close(&self) {
        self.connection.borrow_mut().take();
        let driver = self.driver.borrow_mut().take();
        if let Some(driver) = driver {
            let _ = monoio::time::timeout(Duration::from_secs(2), driver).await;
        }
    }
}

/// What identifies one version of the token file: a rotation writes a new file (a projected
/// volume swaps a symbolic link), which changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode: metadata.ino(),
    })
}

/// The agent's token file, re-read when it changed (looked at no more than once a second).
struct TokenFile {
    path: PathBuf,
    state: RefCell<TokenState>,
}

#[derive(Default)]
struct TokenState {
    value: Option<HeaderValue>,
    stamp: Option<Stamp>,
    checked: Option<Instant>,
}

impl TokenFile {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            state: RefCell::new(TokenState::default()),
        }
    }

    fn current(&self, now: Instant) -> Result<HeaderValue, String> {
        let mut state = self.state.borrow_mut();
        let due = state
            .checked
            .is_none_or(|at| now.saturating_duration_since(at) >= TOKEN_CHECK_EVERY);
        if let (false, Some(value)) = (due, &state.value) {
            return Ok(value.clone());
        }
        state.checked = Some(now);
        let seen = stamp(&self.path).map_err(|error| format!("{}: {error}", self.path.display()));
        match (seen, &state.value) {
            (Ok(seen), Some(value)) if state.stamp == Some(seen) => return Ok(value.clone()),
            // Mid-rotation the file may be briefly absent: the last token is still good.
            (Err(_), Some(value)) => return Ok(value.clone()),
            (Err(why), None) => return Err(why),
            _ => {}
        }
        let value = read_token(&self.path)?;
        state.stamp = stamp(&self.path).ok();
        state.value = Some(value.clone());
        Ok(value)
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_TOKEN_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|error| format!("{}: {error}", path.display()))?;
    if bytes.len() as u64 > MAX_TOKEN_BYTES {
        return Err(format!(
            "{}: more than {MAX_TOKEN_BYTES} bytes",
            path.display()
        ));
    }
    bearer_of(&bytes).map_err(|why| format!("{}: {why}", path.display()))
}

/// The `Authorization` value for a token file's bytes (surrounding whitespace dropped).
pub(super) fn bearer_of(bytes: &[u8]) -> Result<HeaderValue, &'static str> {
    let token = bytes.trim_ascii();
    if token.is_empty() {
        return Err("the token file is empty");
    }
    let mut value = Vec::with_capacity(token.len() + 7);
    value.extend_from_slice(b"Bearer ");
    value.extend_from_slice(token);
    let mut value = HeaderValue::from_bytes(&value)
        .map_err(|_| "the token holds bytes not allowed in a header")?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_becomes_a_sensitive_bearer_value() {
        let value = bearer_of(b"  abc.def\n").unwrap();
        assert_eq!(value, "Bearer abc.def");
        assert!(value.is_sensitive());
        assert!(bearer_of(b" \n").is_err());
        assert!(bearer_of(b"a\nb").is_err());
    }

    #[test]
    fn a_rotated_token_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let file = TokenFile::new(path.clone());
        let start = Instant::now();
        assert_eq!(file.current(start).unwrap(), "Bearer first");
        // Rotation the way a projected volume does it: a new file takes the old one's name.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second-token\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(
            file.current(start).unwrap(),
            "Bearer first",
            "looked at no more than once a second"
        );
        let later = start + TOKEN_CHECK_EVERY;
        assert_eq!(file.current(later).unwrap(), "Bearer second-token");
        std::fs::remove_file(&path).unwrap();
        let much_later = later + TOKEN_CHECK_EVERY;
        assert_eq!(
            file.current(much_later).unwrap(),
            "Bearer second-token",
            "a file missing mid-rotation keeps the last token"
        );
    }
}
