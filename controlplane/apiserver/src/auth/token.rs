//! Bearer tokens. `sluice controlplane token create --role R --subject S` prints a token once;
//! the control plane keeps only its SHA-256 with the identity it stands for, so a copy of the
//! store reveals no credential.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::identity::{AuthError, Identity};

/// What a token looks like: the prefix makes leaked tokens easy to find by secret scanners.
const PREFIX: &str = "sluice_";

/// A newly issued token: `secret` is shown to the operator once; `record` is what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub secret: String,
    pub record: TokenRecord,
}

/// A stored token: its digest and who it identifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Lowercase hex SHA-256 of the whole token text.
    pub sha256: String,
    pub identity: Identity,
}

/// Issues a token of 256 random bits for `identity`.
pub fn issue(identity: Identity) -> Result<IssuedToken, AuthError> {
    let mut random = [0u8; 32];
    getrandom::getrandom(&mut random).map_err(|error| AuthError::Random(error.to_string()))?;
    let secret = format!("{PREFIX}{}", hex::encode(random));
    Ok(IssuedToken {
        record: TokenRecord {
            sha256: digest(&secret),
            identity,
        },
        secret,
    })
}

/// Lowercase hex SHA-256 of a token's text.
pub fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The tokens a control plane accepts, looked up by digest.
///
/// Looking a token up by its SHA-256 rather than comparing secrets keeps the lookup's timing
/// independent of how much of a guessed token is right: a guess's digest shares nothing
/// predictable with the real one.
#[derive(Debug, Clone, Default)]
pub struct TokenBook {
    by_digest: HashMap<[u8; 32], Identity>,
    /// The store revision the records were read at (0: not read from a store).
    revision: u64,
}

impl TokenBook {
    /// A book of `records`; a record whose digest is not 64 hex digits is skipped and returned,
    /// so the caller can report it (it cannot match any token).
    pub fn new(records: impl IntoIterator<Item = TokenRecord>) -> (Self, Vec<TokenRecord>) {
        let mut book = Self::default();
        let mut unusable = Vec::new();
        for record in records {
            let mut key = [0u8; 32];
            match hex::decode_to_slice(&record.sha256, &mut key) {
                Ok(()) => {
                    book.by_digest.insert(key, record.identity);
                }
                Err(_) => unusable.push(record),
            }
        }
        (book, unusable)
    }

    /// This book, read from the store at `revision`.
    pub fn at_revision(mut self, revision: u64) -> Self {
        self.revision = revision;
        self
    }

    /// Which of two books to serve: the one read at the later revision. Reloads (a token
    /// create's read-your-write, the token watch's) may finish in another order than they
    /// read, and an older book installed over a newer one drops the tokens stored in between
    /// until the next token change.
    pub fn newer(current: &Arc<TokenBook>, candidate: &Arc<TokenBook>) -> Arc<TokenBook> {
        if current.revision > candidate.revision {
            Arc::clone(current)
        } else {
            Arc::clone(candidate)
        }
    }

    /// The identity behind an `Authorization: Bearer` value.
    pub fn authenticate(&self, bearer: &str) -> Result<&Identity, AuthError> {
        let key: [u8; 32] = Sha256::digest(bearer.as_bytes()).into();
        self.by_digest.get(&key).ok_or(AuthError::UnknownToken)
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::identity::Role;
    use super::*;

    fn identity(role: Role, subject: &str) -> Identity {
        Identity::new(role, subject).unwrap()
    }

    #[test]
    fn an_issued_token_authenticates_as_its_identity_and_nothing_else_does() {
        let gateway = issue(identity(Role::Gateway, "gw-1")).unwrap();
        let admin = issue(identity(Role::Admin, "ops")).unwrap();
        assert!(gateway.secret.starts_with("sluice_"));
        assert_eq!(gateway.secret.len(), PREFIX.len() + 64);
        assert_ne!(gateway.secret, admin.secret);
        assert_eq!(gateway.record.sha256, digest(&gateway.secret));
        assert!(!gateway
            .record
            .sha256
            .contains(&gateway.secret[PREFIX.len()..]));

        let (book, unusable) = TokenBook::new([gateway.record.clone(), admin.record.clone()]);
        assert!(unusable.is_empty());
        assert_eq!(book.len(), 2);
        assert_eq!(
            book.authenticate(&gateway.secret),
            Ok(&identity(Role::Gateway, "gw-1"))
        );
        assert_eq!(
            book.authenticate(&admin.secret).map(|i| i.role),
            Ok(Role::Admin)
        );
        for guess in ["", "sluice_", &gateway.record.sha256, &gateway.secret[1..]] {
            assert_eq!(
                book.authenticate(guess),
                Err(AuthError::UnknownToken),
                "{guess:?}"
            );
        }
        let mut flipped = gateway.secret.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(book.authenticate(&flipped), Err(AuthError::UnknownToken));
    }

    #[test]
    fn a_record_with_a_malformed_digest_is_reported_not_accepted() {
        let record = TokenRecord {
            sha256: "not-hex".into(),
            identity: identity(Role::Node, "n1"),
        };
        let (book, unusable) = TokenBook::new([record.clone()]);
        assert!(book.is_empty());
        assert_eq!(unusable, [record]);
    }

    #[test]
    fn a_book_read_earlier_never_replaces_one_read_later() {
        let first = issue(identity(Role::VmAgent, "vm-1")).unwrap();
        let second = issue(identity(Role::VmAgent, "vm-2")).unwrap();
        let earlier = Arc::new(TokenBook::new([first.record.clone()]).0.at_revision(7));
        let later = Arc::new(
            TokenBook::new([first.record.clone(), second.record.clone()])
                .0
                .at_revision(9),
        );
        // The later read finished first: the earlier one, arriving after, is not installed.
        let served = TokenBook::newer(&later, &earlier);
        assert!(served.authenticate(&second.secret).is_ok());
        assert!(Arc::ptr_eq(&TokenBook::newer(&earlier, &later), &later));
        // Equal revisions read the same records: the candidate is as good as the current one.
        let again = Arc::new(
            TokenBook::new([first.record, second.record])
                .0
                .at_revision(9),
        );
        assert!(Arc::ptr_eq(&TokenBook::newer(&later, &again), &again));
    }
}
