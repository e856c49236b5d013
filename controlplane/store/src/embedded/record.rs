//! One row of the MVCC log and its byte encoding.
//!
//! The log is the only place a value lives, so the encoding is versioned (first byte) and every
//! decode failure is reported as [`StoreError::Corrupt`] with the row's revision rather than a
//! panic: a damaged row must fail the request that reads it, not the server.

use bytes::Bytes;

use crate::error::StoreError;
use crate::types::KeyValue;

/// The encoding's version, first byte of every row.
const FORMAT_V1: u8 = 1;
/// Flag bit: the row is a deletion (a tombstone).
const FLAG_DELETED: u8 = 1;
/// version byte, flags byte, create_revision, prev_revision, version, key length.
const HEADER_LEN: usize = 1 + 1 + 8 + 8 + 8 + 4;

/// One write of the log, stored under its revision (kine's row: name, deleted flag,
/// create_revision, prev_revision, value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key written.
    pub key: String,
    /// The value written; empty for a deletion.
    pub value: Bytes,
    /// The revision that created the key's current incarnation (0 for a deletion).
    pub create_revision: u64,
    /// The revision of the key's previous row in the log, live or deletion; 0 if none.
    /// Lists at an older revision walk this chain back.
    pub prev_revision: u64,
    /// Writes since creation (1 after create); 0 for a deletion, as etcd.
    pub version: u64,
    /// Whether this row deletes the key.
    pub deleted: bool,
}

impl Record {
    /// The key's state as this row at `revision` left it; `None` for a deletion.
    pub fn key_value(&self, revision: u64) -> Option<KeyValue> {
        (!self.deleted).then(|| KeyValue {
            key: self.key.clone(),
            value: self.value.clone(),
            create_revision: self.create_revision,
            mod_revision: revision,
            version: self.version,
        })
    }

    /// The row's bytes: header, key, then the value (to the end, so it needs no length).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.key.len() + self.value.len());
        out.push(FORMAT_V1);
        out.push(if self.deleted { FLAG_DELETED } else { 0 });
        out.extend_from_slice(&self.create_revision.to_be_bytes());
        out.extend_from_slice(&self.prev_revision.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        // Keys are bounded by the value limit's order of magnitude, far below 4 GiB; a longer
        // one is refused before it is written (see `checks::check_key`).
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    /// Decodes the row stored at `revision`.
    pub fn decode(revision: u64, bytes: &[u8]) -> Result<Record, StoreError> {
        let corrupt = |reason| StoreError::Corrupt { revision, reason };
        let header = bytes
            .get(..HEADER_LEN)
            .ok_or(corrupt("row shorter than its header"))?;
        if header[0] != FORMAT_V1 {
            return Err(corrupt("unknown row format"));
        }
        if header[1] & !FLAG_DELETED != 0 {
            return Err(corrupt("unknown row flags"));
        }
        let deleted = header[1] & FLAG_DELETED != 0;
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&header[at..at + 8]);
            u64::from_be_bytes(word)
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&header[26..30]);
        let key_len = u32::from_be_bytes(len) as usize;
        let rest = &bytes[HEADER_LEN..];
        let key = rest
            .get(..key_len)
            .ok_or(corrupt("key runs past the row"))?;
        let key = std::str::from_utf8(key).map_err(|_| corrupt("key is not UTF-8"))?;
        Ok(Record {
            key: key.to_owned(),
            value: Bytes::copy_from_slice(&rest[key_len..]),
            create_revision: u64_at(2),
            prev_revision: u64_at(10),
            version: u64_at(18),
            deleted,
        })
    }

    /// Only the key of an encoded row, without copying the value: watches and compaction scan
    /// rows of other prefixes and need nothing else from them.
    pub fn decode_key(revision: u64, bytes: &[u8]) -> Result<&str, StoreError> {
        let corrupt = |reason| StoreError::Corrupt { revision, reason };
        let header = bytes
            .get(..HEADER_LEN)
            .ok_or(corrupt("row shorter than its header"))?;
        let mut len = [0u8; 4];
        len.copy_from_slice(&header[26..30]);
        let key_len = u32::from_be_bytes(len) as usize;
        let key = bytes[HEADER_LEN..]
            .get(..key_len)
            .ok_or(corrupt("key runs past the row"))?;
        std::str::from_utf8(key).map_err(|_| corrupt("key is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn live(key: &str, value: &'static [u8]) -> Record {
        Record {
            key: key.into(),
            value: Bytes::from_static(value),
            create_revision: 3,
            prev_revision: 5,
            version: 2,
            deleted: false,
        }
    }

    #[test]
    fn live_row_round_trips_and_gives_its_key_value() {
        let record = live("/g/r/a", b"{\"x\":1}");
        let decoded = Record::decode(7, &record.encode()).unwrap();
        assert_eq!(decoded, record);
        let kv = decoded.key_value(7).unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (3, 7, 2));
        assert_eq!(Record::decode_key(7, &record.encode()).unwrap(), "/g/r/a");
    }

    #[test]
    fn deletion_round_trips_and_has_no_key_value() {
        let record = Record {
            key: "/g/r/a".into(),
            value: Bytes::new(),
            create_revision: 0,
            prev_revision: 6,
            version: 0,
            deleted: true,
        };
        let decoded = Record::decode(8, &record.encode()).unwrap();
        assert_eq!(decoded, record);
        assert_eq!(decoded.key_value(8), None);
    }

    #[test]
    fn damaged_rows_are_corrupt_not_panics() {
        let bytes = live("/k", b"v").encode();
        let mut unknown_format = bytes.clone();
        unknown_format[0] = 9;
        let mut unknown_flag = bytes.clone();
        unknown_flag[1] = 0x80;
        let mut long_key = bytes.clone();
        long_key[26..30].copy_from_slice(&1000u32.to_be_bytes());
        let mut bad_utf8 = bytes.clone();
        bad_utf8[HEADER_LEN] = 0xff;
        for row in [
            &bytes[..5],
            &unknown_format,
            &unknown_flag,
            &long_key,
            &bad_utf8,
        ] {
            let error = Record::decode(4, row).unwrap_err();
            assert!(
                matches!(error, StoreError::Corrupt { revision: 4, .. }),
                "{error}"
            );
        }
        assert!(Record::decode_key(4, &long_key).is_err());
        assert!(Record::decode_key(4, &bytes[..3]).is_err());
    }

    proptest! {
        #[test]
        fn any_record_round_trips(
            key in ".{0,40}",
            value in proptest::collection::vec(any::<u8>(), 0..200),
            create_revision in any::<u64>(),
            prev_revision in any::<u64>(),
            version in any::<u64>(),
            deleted in any::<bool>(),
        ) {
            let record = Record {
                key, value: Bytes::from(value), create_revision, prev_revision, version, deleted,
            };
            let bytes = record.encode();
            prop_assert_eq!(Record::decode(1, &bytes).unwrap(), record.clone());
            prop_assert_eq!(Record::decode_key(1, &bytes).unwrap(), record.key.as_str());
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Record::decode(1, &bytes);
            let _ = Record::decode_key(1, &bytes);
        }
    }
}
