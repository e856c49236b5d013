//! Writes: etcd transactions whose compares carry the preconditions, tried again on another
//! member after a transient failure, without ever applying a write twice.
//!
//! An attempt that failed after sending (the connection broke, the deadline passed, the leader
//! changed) may have been applied. Sending the same transaction again is safe because each is a
//! compare-and-swap: a create compares the key's absence, an update or delete its expected
//! mod_revision, so at most one attempt applies. What the repeat must not do is report its
//! failed compare as the caller's: when an earlier attempt's outcome is unknown
//! ([`super::Answer::uncertain`]), the key's state, read in the same transaction, says whether
//! that attempt landed (see [`landed`]), and the write is reported done with that state.
//!
//! An update without a precondition (the API server always sends one) compares only that the
//! key exists: after an unknown outcome it may be applied twice, with the same value.

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp, TxnResponse};

use super::convert::{etcd_revision, revision, Failure};
use super::{Answer, EtcdOp, EtcdStore};
use crate::checks::check_write;
use crate::error::StoreError;
use crate::types::KeyValue;

impl EtcdStore {
    pub(super) async fn create_key(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError> {
        check_write(key, Some(&value), self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(etcd_key.clone(), value.to_vec(), None)])
            .or_else(vec![TxnOp::get(etcd_key, None)]);
        let answer = self.txn(txn, value.len()).await?;
        let response = &answer.value;
        if response.succeeded() {
            let revision = header_revision(response)?;
            return Ok(KeyValue {
                key: key.to_owned(),
                value,
                create_revision: revision,
                mod_revision: revision,
                version: 1,
            });
        }
        let current = self.shared.first_kv(&response.op_responses(), 0)?;
        match current {
            Some(current) if answer.uncertain && landed(&current, &value, None) => {
                self.shared.members.stats.applied();
                Ok(current)
            }
            _ => Err(StoreError::AlreadyExists {
                key: key.to_owned(),
            }),
        }
    }

    pub(super) async fn update_key(
        &self,
        key: &str,
        value: Bytes,
        expected: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        check_write(key, Some(&value), self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        // The new state's revisions are read back in the same transaction, without the value
        // (the caller has it).
        let then = vec![
            TxnOp::put(etcd_key.clone(), value.to_vec(), None),
            TxnOp::get(etcd_key, Some(GetOptions::new().with_keys_only())),
        ];
        let answer = self.conditional(key, expected, then, value.len()).await?;
        match answer {
            Conditional::Applied(response) => {
                let written = required(self.shared.first_kv(&response.op_responses(), 1)?)?;
                Ok(KeyValue { value, ..written })
            }
            // The uncertain attempt replaced the expected state with this value.
            Conditional::Current {
                current,
                uncertain: true,
            } if landed(&current, &value, expected) => {
                self.shared.members.stats.applied();
                Ok(*current)
            }
            Conditional::Current { current, .. } => Err(StoreError::Conflict { current }),
            Conditional::Absent { .. } => Err(StoreError::NotFound {
                key: key.to_owned(),
            }),
        }
    }

    pub(super) async fn delete_key(
        &self,
        key: &str,
        expected: Option<u64>,
    ) -> Result<KeyValue, StoreError> {
        check_write(key, None, self.max_value_bytes)?;
        let etcd_key = self.shared.namespace.key(key);
        let then = vec![TxnOp::delete(
            etcd_key,
            Some(DeleteOptions::new().with_prev_key()),
        )];
        match self.conditional(key, expected, then, 0).await? {
            Conditional::Applied(response) => {
                required(self.shared.first_kv(&response.op_responses(), 0)?)
            }
            Conditional::Current { current, .. } => Err(StoreError::Conflict { current }),
            Conditional::Absent {
                uncertain: true,
                etcd_key,
            } => match expected {
                Some(expected) => self.deleted_at(key, etcd_key, expected).await,
                // Without a precondition there is no state to tell the deletion by.
                None => Err(StoreError::NotFound {
                    key: key.to_owned(),
                }),
            },
            Conditional::Absent { .. } => Err(StoreError::NotFound {
                key: key.to_owned(),
            }),
        }
    }

    /// A delete of `key` at mod_revision `expected` found the key gone after an attempt with
    /// an unknown outcome: if the key was at `expected` until deleted, that attempt deleted
    /// it (a concurrent delete of the same state would have been one of two compare-and-swaps
    /// of which only one applies), and the deleted state is the key at `expected`.
    async fn deleted_at(
        &self,
        key: &str,
        etcd_key: Vec<u8>,
        expected: u64,
    ) -> Result<KeyValue, StoreError> {
        let options = GetOptions::new().with_revision(etcd_revision(expected));
        let read = self.shared.read(EtcdOp::Read, |member| {
            let (mut kv, etcd_key, options) =
                (member.kv.clone(), etcd_key.clone(), options.clone());
            async move { kv.get(etcd_key, Some(options)).await }
        });
        let previous = match read.await {
            Ok(response) => response
                .kvs()
                .first()
                .map(|kv| super::convert::key_value(&self.shared.namespace, kv))
                .transpose()?,
            // Compacted since: the deleted state cannot be told any more.
            Err(Failure::Compacted) => None,
            Err(failure) => return Err(self.shared.explain(failure, expected).await),
        };
        match previous {
            Some(previous) if previous.mod_revision == expected => {
                self.shared.members.stats.applied();
                Ok(previous)
            }
            _ => Err(StoreError::NotFound {
                key: key.to_owned(),
            }),
        }
    }

    /// Runs one transaction; `value_len` explains etcd's size refusal.
    async fn txn(&self, txn: Txn, value_len: usize) -> Result<Answer<TxnResponse>, StoreError> {
        let run = self.shared.run(EtcdOp::Write, |member| {
            let (mut kv, txn) = (member.kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        });
        match run.await {
            Ok(answer) => Ok(answer),
            Err(Failure::TooLarge) => Err(StoreError::ValueTooLarge {
                size: value_len,
                max: self.max_value_bytes,
            }),
            Err(other) => Err(self.shared.explain(other, 0).await),
        }
    }

    /// A conditional update or delete: `then` runs when `key` exists (with mod_revision
    /// `expected` when given), else the key's state is read to say why not.
    async fn conditional(
        &self,
        key: &str,
        expected: Option<u64>,
        then: Vec<TxnOp>,
        value_len: usize,
    ) -> Result<Conditional, StoreError> {
        let etcd_key = self.shared.namespace.key(key);
        // Version 0 means absent; without this compare a missing key would match an
        // expected mod_revision of 0 and be created by an update.
        let mut compares = vec![Compare::version(etcd_key.clone(), CompareOp::Greater, 0)];
        if let Some(expected) = expected {
            compares.push(Compare::mod_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                etcd_revision(expected),
            ));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(then)
            .or_else(vec![TxnOp::get(etcd_key.clone(), None)]);
        let Answer {
            value: response,
            uncertain,
            ..
        } = self.txn(txn, value_len).await?;
        if response.succeeded() {
            return Ok(Conditional::Applied(response));
        }
        Ok(match self.shared.first_kv(&response.op_responses(), 0)? {
            None => Conditional::Absent {
                uncertain,
                etcd_key,
            },
            Some(current) => Conditional::Current {
                current: Box::new(current),
                uncertain,
            },
        })
    }
}

/// What a conditional write's transaction found.
enum Conditional {
    /// The compares held: the write is applied.
    Applied(TxnResponse),
    /// The key exists in another state than expected.
    Current {
        current: Box<KeyValue>,
        /// An earlier attempt's outcome is unknown (see [`Answer::uncertain`]).
        uncertain: bool,
    },
    /// The key does not exist.
    Absent { uncertain: bool, etcd_key: Vec<u8> },
}

/// Whether `current`, found instead of the expected state after an attempt with an unknown
/// outcome, is that attempt's write of `value`: the key holds exactly `value`, and when the
/// write expected mod_revision `expected`, it was modified after that. Another writer's write
/// of the same bytes is indistinguishable, and equivalent for the caller.
fn landed(current: &KeyValue, value: &[u8], expected: Option<u64>) -> bool {
    current.value.as_ref() == value
        && expected.is_none_or(|expected| current.mod_revision > expected)
}

/// The revision a transaction committed at.
fn header_revision(response: &TxnResponse) -> Result<u64, StoreError> {
    response
        .header()
        .map(|header| revision(header.revision()))
        .ok_or(StoreError::Corrupt {
            revision: 0,
            reason: "etcd answered a transaction without a header",
        })
}

/// The state a successful write reported, which etcd's answer must carry.
fn required(kv: Option<KeyValue>) -> Result<KeyValue, StoreError> {
    kv.ok_or(StoreError::Corrupt {
        revision: 0,
        reason: "etcd's answer to a write lacks the key's state",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &str, mod_revision: u64) -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            create_revision: 2,
            mod_revision,
            version: 2,
        }
    }

    #[test]
    fn a_write_landed_when_the_key_holds_its_value_past_the_expected_revision() {
        // A create: exactly our value.
        assert!(landed(&kv("ours", 5), b"ours", None));
        assert!(!landed(&kv("theirs", 5), b"ours", None));
        // An update from revision 5: our value at a later revision.
        assert!(landed(&kv("ours", 7), b"ours", Some(5)));
        // Still at the expected revision (the value was ours before): not applied yet.
        assert!(!landed(&kv("ours", 5), b"ours", Some(5)));
        // Someone else's write: a conflict.
        assert!(!landed(&kv("theirs", 7), b"ours", Some(5)));
        assert!(!landed(&kv("", 7), b"ours", Some(5)));
    }
}
