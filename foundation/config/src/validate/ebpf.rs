//! `ebpf:`: the interfaces a node counts its traffic on with the eBPF programs (docs/EBPF.md).

use std::collections::BTreeSet;

use super::{scalar, Errors};
use crate::raw::RawEbpf;
use crate::EbpfConfig;

/// Interfaces one node may name: each costs two programs' attachments and its counter keys.
pub(crate) const MAX_EBPF_INTERFACES: usize = 64;
/// Linux's interface names are at most 15 bytes (IFNAMSIZ - 1).
const MAX_INTERFACE_NAME: usize = 15;

pub(crate) fn ebpf(raw: &RawEbpf, errors: &mut Errors) -> EbpfConfig {
    let mut interfaces = Vec::new();
    let mut seen = BTreeSet::new();
    if raw.interfaces.is_empty() {
        errors.push(
            "ebpf.interfaces",
            "is required: the interfaces to count on (e.g. [eth0]); remove `ebpf:` to count nothing",
        );
    }
    if raw.interfaces.len() > MAX_EBPF_INTERFACES {
        errors.push(
            "ebpf.interfaces",
            format!(
                "{} interfaces: at most {MAX_EBPF_INTERFACES}",
                raw.interfaces.len()
            ),
        );
    }
    for (index, value) in raw.interfaces.iter().enumerate() {
        let path = format!("ebpf.interfaces[{index}]");
        let Some(name) = scalar(value, &path, errors) else {
            continue;
        };
        if let Some(reason) = interface_name_error(&name) {
            errors.push(path, reason);
        } else if !seen.insert(name.clone()) {
            errors.push(path, format!("{name:?} is listed twice"));
        } else {
            interfaces.push(name);
        }
    }
    EbpfConfig { interfaces }
}

fn interface_name_error(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_INTERFACE_NAME {
        return Some(format!(
            "{name:?} is not an interface name (1 to {MAX_INTERFACE_NAME} bytes)"
        ));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Some(format!(
            "{name:?} is not an interface name (no '/', ':', spaces or control characters)"
        ));
    }
    None
}
