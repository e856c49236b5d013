//! Where the store's keys live in etcd: under one prefix, so several stores (or other users)
//! can share a cluster. Pure functions, unit-tested without etcd.

/// The etcd key space of one store: every key is `prefix + key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace {
    prefix: Vec<u8>,
}

impl Namespace {
    pub fn new(prefix: &str) -> Namespace {
        Namespace {
            prefix: prefix.as_bytes().to_vec(),
        }
    }

    /// The etcd key of `key`.
    pub fn key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(&self.prefix);
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// The store's key of an etcd key, `None` when it lies outside the namespace or is not
    /// UTF-8 (something else wrote it: the store's own keys are strings).
    pub fn strip<'a>(&self, etcd_key: &'a [u8]) -> Option<&'a str> {
        let key = etcd_key.strip_prefix(self.prefix.as_slice())?;
        std::str::from_utf8(key).ok()
    }

    /// The etcd range `[start, end)` of a list under `prefix`, strictly after `start_after` when
    /// that lies at or beyond the prefix (a cursor before it must not widen the list).
    pub fn list_range(&self, prefix: &str, start_after: Option<&str>) -> (Vec<u8>, Vec<u8>) {
        let first = self.key(prefix);
        let end = range_end(&first);
        let start = match start_after {
            Some(after) if after >= prefix => {
                // The smallest key greater than `after`.
                let mut start = self.key(after);
                start.push(0);
                start
            }
            _ => first,
        };
        (start, end)
    }

    /// The etcd range `[start, end)` of every key under `prefix`.
    pub fn prefix_range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let start = self.key(prefix);
        let end = range_end(&start);
        (start, end)
    }
}

/// The end of the range of keys starting with `prefix`: the prefix with its last byte below
/// 0xff incremented (and what follows dropped); etcd's `"\0"` (every key from the start on)
/// when there is no such byte.
pub(crate) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix() {
        let namespace = Namespace::new("/sluice");
        assert_eq!(namespace.key("/g/r/a"), b"/sluice/g/r/a");
        assert_eq!(namespace.strip(b"/sluice/g/r/a"), Some("/g/r/a"));
        assert_eq!(namespace.strip(b"/other/g"), None);
        assert_eq!(namespace.strip(b"/sluice\xff"), None);
    }

    #[test]
    fn range_ends_increment_the_last_byte_below_0xff() {
        assert_eq!(range_end(b"/a/"), b"/a0");
        assert_eq!(range_end(b"a\xff\xff"), b"b");
        assert_eq!(range_end(b"\xff"), b"\0");
        assert_eq!(range_end(b""), b"\0");
    }

    #[test]
    fn lists_start_after_the_cursor_only_inside_the_prefix() {
        let namespace = Namespace::new("/s");
        assert_eq!(
            namespace.list_range("/a/", None),
            (b"/s/a/".to_vec(), b"/s/a0".to_vec())
        );
        assert_eq!(
            namespace.list_range("/a/", Some("/a/x")),
            (b"/s/a/x\0".to_vec(), b"/s/a0".to_vec())
        );
        assert_eq!(namespace.list_range("/b/", Some("/a/z")).0, b"/s/b/");
        // The whole namespace, with nothing beyond it.
        assert_eq!(namespace.prefix_range(""), (b"/s".to_vec(), b"/t".to_vec()));
        assert_eq!(Namespace::new("").prefix_range("").1, b"\0");
    }
}
