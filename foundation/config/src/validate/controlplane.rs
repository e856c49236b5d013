//! `{controlplane: {url, ca_file, token_file, cert_file, key_file}}`: how a role reaches the
//! control plane's API.

use super::{readable_file, scalar, Errors};
use crate::raw::RawSource;
use crate::ControlPlaneSource;

/// The connection a `source`-like block names; `path` is where the block sits
/// (`gateway.source`).
pub(super) fn source(
    raw: &RawSource,
    path: &str,
    errors: &mut Errors,
) -> Option<ControlPlaneSource> {
    let Some(raw) = &raw.controlplane else {
        errors.push(path, "expected {controlplane: {url, ca_file, token_file}}");
        return None;
    };
    let at = |field: &str| format!("{path}.controlplane.{field}");
    let url = match raw
        .url
        .as_ref()
        .and_then(|value| scalar(value, &at("url"), errors))
    {
        Some(url) if url.starts_with("https://") && !url.trim_end_matches('/').contains("/api") => {
            url.trim_end_matches('/').to_string()
        }
        Some(url) => {
            errors.push(
                at("url"),
                format!("{url:?}: expected https://host:port (the token never travels in clear)"),
            );
            String::new()
        }
        None => {
            errors.push(
                at("url"),
                "is required: the control plane's https://host:port",
            );
            String::new()
        }
    };
    let name = raw
        .name
        .as_ref()
        .and_then(|value| scalar(value, &at("name"), errors));
    let ca_file = readable_file(&raw.ca_file, &at("ca_file"), true, errors);
    let token_file = readable_file(&raw.token_file, &at("token_file"), false, errors);
    let cert_file = readable_file(&raw.cert_file, &at("cert_file"), false, errors);
    let key_file = readable_file(&raw.key_file, &at("key_file"), false, errors);
    if cert_file.is_some() != key_file.is_some() {
        errors.push(at("cert_file"), "cert_file and key_file go together");
    }
    if token_file.is_none() && cert_file.is_none() {
        errors.push(at("token_file"), "is required unless cert_file and key_file are set: the control plane admits no anonymous callers");
    }
    Some(ControlPlaneSource {
        url,
        name,
        ca_file: ca_file?,
        token_file,
        cert_file,
        key_file,
    })
}
