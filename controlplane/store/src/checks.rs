//! The checks every backend applies before a write, so that a key or value one backend accepts
//! the other accepts too.

use bytes::Bytes;

use crate::error::StoreError;

/// Keys longer than this are refused: the API server's keys are a few hundred bytes at most,
/// and a bound keeps the embedded row header's 32-bit key length honest.
pub(crate) const MAX_KEY_BYTES: usize = 8 * 1024;

/// Refuses keys a store cannot hold: empty (etcd refuses them too) or too long.
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(StoreError::InvalidKey {
            reason: "a key must be 1 to 8192 bytes long",
        });
    }
    Ok(())
}

/// Checks a value against the size limit before any backend work.
pub(crate) fn check_value_size(value: &Bytes, max: usize) -> Result<(), StoreError> {
    if value.len() > max {
        return Err(StoreError::ValueTooLarge {
            size: value.len(),
            max,
        });
    }
    Ok(())
}

/// Checks a write's key and, for a create or update, its value.
pub(crate) fn check_write(key: &str, value: Option<&Bytes>, max: usize) -> Result<(), StoreError> {
    check_key(key)?;
    match value {
        Some(value) => check_value_size(value, max),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_be_non_empty_and_bounded() {
        assert!(check_key("/a").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
    }

    #[test]
    fn values_are_bounded_and_checked_after_the_key() {
        let value = Bytes::from_static(b"12345");
        assert!(check_write("/a", Some(&value), 5).is_ok());
        assert!(matches!(
            check_write("/a", Some(&value), 4),
            Err(StoreError::ValueTooLarge { size: 5, max: 4 })
        ));
        assert!(matches!(
            check_write("", Some(&value), 4),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(check_write("/a", None, 0).is_ok());
    }
}
