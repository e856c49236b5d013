//! Client-chosen text in a log line: cut to a bound and escaped, so a request cannot make a
//! line huge, split it, forge another, or carry bytes a log pipeline chokes on.

/// The most bytes of a request path a line keeps (nginx logs the whole line; a hostile client
/// can send 1 MB of path, which must not become 1 MB of log per request).
pub const MAX_PATH_BYTES: usize = 512;
/// The most bytes of other client-chosen text (method, request id, principal).
pub const MAX_TEXT_BYTES: usize = 128;

/// `raw` as printable ASCII of at most `max` bytes plus a marker: bytes outside `!`..`~` and
/// space (control characters, invalid or non-ASCII UTF-8) and the backslash become `\xNN`, as
/// nginx escapes its variables; a cut text ends in `...(N bytes)` with its full length.
pub fn bounded(raw: &[u8], max: usize) -> String {
    let mut out = String::with_capacity(raw.len().min(max) + 16);
    for &byte in raw {
        let escaped = !(b' '..=b'~').contains(&byte) || byte == b'\\';
        let width = if escaped { 4 } else { 1 };
        if out.len() + width > max {
            out.push_str(&format!("...({} bytes)", raw.len()));
            return out;
        }
        if escaped {
            out.push_str(&format!("\\x{byte:02X}"));
        } else {
            out.push(char::from(byte));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_kept() {
        assert_eq!(bounded(b"/api/v1/pods?limit=5", 64), "/api/v1/pods?limit=5");
        assert_eq!(bounded(b"", 64), "");
    }

    #[test]
    fn control_bytes_invalid_utf8_and_backslashes_are_escaped() {
        assert_eq!(
            bounded(b"/a\nb\r\x1b[31m\xff\xc3\x28\\", 128),
            "/a\\x0Ab\\x0D\\x1B[31m\\xFF\\xC3(\\x5C"
        );
        assert_eq!(bounded("/é".as_bytes(), 64), "/\\xC3\\xA9");
    }

    #[test]
    fn long_text_is_cut_and_says_its_length() {
        let long = vec![b'a'; 100_000];
        let line = bounded(&long, MAX_PATH_BYTES);
        assert!(line.len() <= MAX_PATH_BYTES + 20, "{}", line.len());
        assert!(line.ends_with("...(100000 bytes)"), "{line}");
        // An escape is never cut in half.
        let line = bounded(&[0u8; 100], 10);
        assert_eq!(line, "\\x00\\x00...(100 bytes)");
    }
}
