//! Bearer tokens. `sluice controlplane token create --role R --subject S` prints a token once;
//! the control plane keeps only its SHA-256 with the identity it stands for, so a copy of the
//! store reveals no credential.

use std::collections::hash_map::Entry;
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
    /// Each digest's identity and how many stored objects hold it (an admin may store one
    /// digest twice; deleting one copy keeps the token working).
    by_digest: HashMap<[u8; 32], (Identity, u32)>,
    /// What each stored Token object holds, and the revision it was last changed at: a change
    /// removes its own object's digest only, and one older than that revision is ignored.
    by_key: HashMap<String, Held>,
    /// The store revision the records were read at, or the token watch has applied up to
    /// (0: not read from a store).
    revision: u64,
}

#[derive(Debug, Clone)]
struct Held {
    digest: Option<[u8; 32]>,
    revision: u64,
}

/// One change to a stored Token object, for [`TokenBook::applied`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenChange {
    /// The object at `key` now holds `record` (`None`: nothing that identifies anyone).
    Put {
        key: String,
        revision: u64,
        record: Option<TokenRecord>,
    },
    Delete {
        key: String,
        revision: u64,
    },
}

impl TokenBook {
    /// A book of `records`; a record whose digest is not 64 hex digits is skipped and returned,
    /// so the caller can report it (it cannot match any token).
    #[cfg(test)]
    pub fn new(records: impl IntoIterator<Item = TokenRecord>) -> (Self, Vec<TokenRecord>) {
        let keyed = records
            .into_iter()
            .enumerate()
            .map(|(index, record)| (index.to_string(), 0, record));
        Self::stored(keyed)
    }

    /// A book of the stored Token objects `(key, mod revision, record)`; a record whose digest
    /// is not 64 hex digits is skipped and returned, so the caller can report it.
    pub fn stored(
        objects: impl IntoIterator<Item = (String, u64, TokenRecord)>,
    ) -> (Self, Vec<TokenRecord>) {
        let mut book = Self::default();
        let mut unusable = Vec::new();
        for (key, revision, record) in objects {
            if let Err(record) = book.put(key, revision, Some(record)) {
                unusable.push(record);
            }
        }
        (book, unusable)
    }

    /// This book with the token watch's `changes` applied (in revision order), having seen
    /// every change up to `revision`. Records whose digest is unusable are returned.
    pub fn applied(&self, changes: &[TokenChange], revision: u64) -> (Self, Vec<TokenRecord>) {
        let mut book = self.clone();
        let mut unusable = Vec::new();
        for change in changes {
            let outcome = match change {
                TokenChange::Put {
                    key,
                    revision,
                    record,
                } => book.put(key.clone(), *revision, record.clone()),
                TokenChange::Delete { key, revision } => {
                    book.delete(key, *revision);
                    Ok(())
                }
            };
            if let Err(record) = outcome {
                unusable.push(record);
            }
        }
        book.revision = book.revision.max(revision);
        (book, unusable)
    }

    /// The store revision the book has seen every change up to.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    fn put(
        &mut self,
        key: String,
        revision: u64,
        record: Option<TokenRecord>,
    ) -> Result<(), TokenRecord> {
        if self
            .by_key
            .get(&key)
            .is_some_and(|held| held.revision > revision)
        {
            return Ok(());
        }
        let mut digest = [0u8; 32];
        let usable = match record {
            Some(record) => match hex::decode_to_slice(&record.sha256, &mut digest) {
                Ok(()) => Ok(Some((digest, record.identity))),
                Err(_) => Err(record),
            },
            None => Ok(None),
        };
        let previous = self.by_key.remove(&key);
        if let Some(old) = previous.and_then(|held| held.digest) {
            self.release(&old);
        }
        let (held, outcome) = match usable {
            Ok(Some((digest, identity))) => {
                match self.by_digest.entry(digest) {
                    Entry::Occupied(mut held) => {
                        let (known, holders) = held.get_mut();
                        *known = identity;
                        *holders += 1;
                    }
                    Entry::Vacant(free) => {
                        free.insert((identity, 1));
                    }
                }
                (Some(digest), Ok(()))
            }
            Ok(None) => (None, Ok(())),
            Err(record) => (None, Err(record)),
        };
        self.by_key.insert(
            key,
            Held {
                digest: held,
                revision,
            },
        );
        outcome
    }

    fn delete(&mut self, key: &str, revision: u64) {
        // A deletion older than what the book holds for the key is of an earlier object of
        // the same name (the newer one was added by its create, ahead of the watch).
        if self
            .by_key
            .get(key)
            .is_some_and(|held| held.revision > revision)
        {
            return;
        }
        if let Some(old) = self.by_key.remove(key).and_then(|held| held.digest) {
            self.release(&old);
        }
    }

    fn release(&mut self, digest: &[u8; 32]) {
        if let Some((_, holders)) = self.by_digest.get_mut(digest) {
            *holders -= 1;
            if *holders == 0 {
                self.by_digest.remove(digest);
            }
        }
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
        self.by_digest
            .get(&key)
            .map(|(identity, _)| identity)
            .ok_or(AuthError::UnknownToken)
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

    fn put(key: &str, revision: u64, record: &TokenRecord) -> TokenChange {
        TokenChange::Put {
            key: key.into(),
            revision,
            record: Some(record.clone()),
        }
    }

    fn delete(key: &str, revision: u64) -> TokenChange {
        TokenChange::Delete {
            key: key.into(),
            revision,
        }
    }

    /// The token watch's changes, applied one object at a time, leave the book a full read
    /// would: an update replaces its object's digest, a deletion removes its own.
    #[test]
    fn watched_changes_update_the_book_object_by_object() {
        let one = issue(identity(Role::VmAgent, "vm-1")).unwrap();
        let two = issue(identity(Role::VmAgent, "vm-2")).unwrap();
        let rotated = issue(identity(Role::VmAgent, "vm-1")).unwrap();
        let (book, _) =
            TokenBook::default().applied(&[put("a", 5, &one.record), put("b", 6, &two.record)], 6);
        assert_eq!(book.len(), 2);
        assert_eq!(book.revision(), 6);
        let (book, _) = book.applied(&[put("a", 7, &rotated.record), delete("b", 8)], 8);
        assert_eq!(book.authenticate(&one.secret), Err(AuthError::UnknownToken));
        assert_eq!(book.authenticate(&two.secret), Err(AuthError::UnknownToken));
        assert!(book.authenticate(&rotated.secret).is_ok());
        assert_eq!((book.len(), book.revision()), (1, 8));
        // A record that identifies nobody takes its object's digest away too.
        let (book, _) = book.applied(
            &[TokenChange::Put {
                key: "a".into(),
                revision: 9,
                record: None,
            }],
            9,
        );
        assert!(book.is_empty());
    }

    #[test]
    fn a_digest_stored_twice_works_until_both_objects_go() {
        let token = issue(identity(Role::Node, "n1")).unwrap();
        let (book, _) = TokenBook::default()
            .applied(&[put("a", 1, &token.record), put("b", 2, &token.record)], 2);
        let (book, _) = book.applied(&[delete("a", 3)], 3);
        assert!(book.authenticate(&token.secret).is_ok());
        let (book, _) = book.applied(&[delete("b", 4)], 4);
        assert_eq!(
            book.authenticate(&token.secret),
            Err(AuthError::UnknownToken)
        );
    }

    /// A create applies its token ahead of the watch; the watch's older deletion of an earlier
    /// object of the same name must not take it away.
    #[test]
    fn a_change_older_than_the_objects_last_is_ignored() {
        let old = issue(identity(Role::Gateway, "gw")).unwrap();
        let new = issue(identity(Role::Gateway, "gw")).unwrap();
        let (book, _) = TokenBook::default().applied(&[put("t", 3, &old.record)], 3);
        let (book, _) = book.applied(&[put("t", 9, &new.record)], 0);
        assert_eq!(
            book.revision(),
            3,
            "a create does not move the watch's revision"
        );
        let (book, _) = book.applied(&[delete("t", 5), put("t", 9, &new.record)], 9);
        assert!(book.authenticate(&new.secret).is_ok());
        assert_eq!(book.authenticate(&old.secret), Err(AuthError::UnknownToken));
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn an_unusable_digest_is_reported_by_the_watch_too() {
        let record = TokenRecord {
            sha256: "not-hex".into(),
            identity: identity(Role::Node, "n1"),
        };
        let (book, unusable) = TokenBook::default().applied(&[put("x", 1, &record)], 1);
        assert!(book.is_empty());
        assert_eq!(unusable, [record]);
    }
}
