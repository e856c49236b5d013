//! Name and label syntax (`k8s.io/apimachinery/pkg/util/validation`).

/// Why a DNS-1123 subdomain is refused, in kube's words; `None` when it is valid.
pub fn dns1123_subdomain_error(name: &str) -> Option<String> {
    if name.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    let labels_ok = !name.is_empty()
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        });
    if labels_ok {
        return None;
    }
    Some(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
         or '.', and must start and end with an alphanumeric character (e.g. 'example.com', \
         regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            .into(),
    )
}

/// Why a DNS-1123 label (namespaces) is refused; `None` when it is valid.
pub fn dns1123_label_error(name: &str) -> Option<String> {
    if name.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    if !name.contains('.') && dns1123_subdomain_error(name).is_none() {
        return None;
    }
    Some(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
         and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc', \
         regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            .into(),
    )
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_name_part(part: &str) -> bool {
    let bytes = part.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

/// Why a label key (`[prefix/]name`) is refused; `None` when it is valid.
pub fn label_key_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if let Some(reason) = dns1123_subdomain_error(prefix) {
            return Some(format!("prefix part {reason}"));
        }
    }
    if is_label_name_part(name) {
        return None;
    }
    Some(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
         end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')"
            .into(),
    )
}

/// Why a label value is refused; `None` when it is valid (empty is valid).
pub fn label_value_error(value: &str) -> Option<String> {
    if value.is_empty() || is_label_name_part(value) {
        return None;
    }
    Some(
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' \
         or '.', and must start and end with an alphanumeric character (e.g. 'MyValue', or \
         'my_value', or '12345'), at most 63 characters"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains() {
        assert!(dns1123_subdomain_error("a-b.c9").is_none());
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", &"a".repeat(254)] {
            assert!(dns1123_subdomain_error(bad).is_some(), "{bad}");
        }
        assert!(dns1123_label_error("default").is_none());
        assert!(dns1123_label_error("a.b").is_some());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(label_key_error("app").is_none());
        assert!(label_key_error("sluice.dev/role").is_none());
        assert!(label_key_error("Bad_/x").is_some());
        assert!(label_key_error("a b").is_some());
        assert!(label_value_error("").is_none());
        assert!(label_value_error("v1.2_x").is_none());
        assert!(label_value_error("-x").is_some());
    }
}
