//! Policy documents (YAML or JSON) into a validated [`PolicySet`].
//!
//! Document shape (camelCase keys, unknown keys rejected):
//! ```yaml
//! addressGroups:
//!   - name: web-clients
//!     members: [10.0.0.2, 10.0.1.0/24]
//! appliedToGroups:
//!   - name: vm1
//!     members:              # vm: the VM (its vm-agent) the interface is on; optional in a file,
//!                           # which is one bridge's view, required in the control plane
//!       - {name: vm1-eth0, ofport: 1, ips: [10.0.0.1], mac: "02:00:0a:00:00:01", vm: vm1}
//!       - {name: eth0, ips: [10.0.0.9], vm: vm2}   # no ofport: looked up by name on the bridge
//! policies:
//!   - name: web
//!     namespace: default        # optional
//!     priority: 10              # lower number = higher precedence, 0..=999
//!     appliedTo: [vm1]
//!     policyTypes: [Ingress]    # optional, defaults to the directions of the rules
//!     rules:                    # ordered, at most 64
//!       - direction: Ingress    # Ingress | Egress
//!         action: Allow         # Allow | Drop | Reject
//!         peers:                # omitted = any peer
//!           addressGroups: [web-clients]
//!           ipBlocks: [{cidr: 10.2.0.0/16, except: [10.2.3.0/24]}]
//!         services:             # omitted = any service
//!           - {protocol: TCP, port: 80, endPort: 90}
//!           - {protocol: ICMP, icmpType: 8}
//! ```
//! Validation returns every problem with its path, e.g.
//! `policies.yaml: policies[2].rules[0].services[1].port: 70000 is not a valid port`.

mod dir;
pub(crate) mod raw;
pub(crate) mod validate;

use std::path::Path;

use crate::model::PolicySet;
use raw::RawDocument;
use validate::validate;

pub use dir::{is_policy_file_name, load_dir, load_path, policy_files};
pub(crate) use sluice_config_error::ErrorList as Errors;
pub use sluice_config_error::{FieldError, InvalidConfig, InvalidSources};

/// Input syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// `.json` files are JSON, everything else YAML.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|ext| ext.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

/// Reads and validates a policy file; the format follows the extension.
pub fn load_file(path: &Path) -> Result<PolicySet, InvalidConfig> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| {
        InvalidConfig::one(origin.clone(), "", format!("cannot read file: {error}"))
    })?;
    load_str(&text, &origin, Format::from_path(path))
}

/// Parses and validates a document; `origin` names it in errors.
pub fn load_str(text: &str, origin: &str, format: Format) -> Result<PolicySet, InvalidConfig> {
    let mut errors = Errors::default();
    let raw = match parse(text, format, &mut errors) {
        Some(raw) => raw,
        None => return Err(errors.into_invalid(origin)),
    };
    let set = validate(&raw, &mut errors);
    if errors.list.is_empty() {
        Ok(set)
    } else {
        Err(errors.into_invalid(origin))
    }
}

/// Deserializes, recording unknown fields as errors. A type error stops parsing (serde cannot go
/// on), so it is reported alone.
fn parse(text: &str, format: Format, errors: &mut Errors) -> Option<RawDocument> {
    if text.trim().is_empty() {
        return Some(RawDocument::default());
    }
    match format {
        Format::Yaml => deserialize_tracked(serde_norway::Deserializer::from_str(text), errors),
        Format::Json => {
            let mut deserializer = serde_json::Deserializer::from_str(text);
            let raw = deserialize_tracked(&mut deserializer, errors)?;
            // Trailing garbage after the document is an error too.
            match deserializer.end() {
                Ok(()) => Some(raw),
                Err(error) => {
                    errors.push("", error.to_string());
                    None
                }
            }
        }
    }
}

/// Deserializes a `T` from any serde source (a file's text, a stored object's JSON), recording
/// unknown fields as errors at their paths. A type error stops serde, so it is recorded alone.
pub(crate) fn deserialize_tracked<'de, D, T>(deserializer: D, errors: &mut Errors) -> Option<T>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    let mut unknown = Vec::new();
    let mut record_unknown = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let tracked = serde_ignored::Deserializer::new(deserializer, &mut record_unknown);
    let result = serde_path_to_error::deserialize(tracked);
    for path in unknown {
        errors.push(path, "unknown field");
    }
    match result {
        Ok(raw) => Some(raw),
        Err(error) => {
            let path = error.path().to_string();
            let path = if path == "." { String::new() } else { path };
            let message = error.into_inner().to_string();
            errors.push(path.clone(), clean_serde_message(&message, &path));
            None
        }
    }
}

/// Renders serde_ignored's path in the same `a.b[0].c` style as serde_path_to_error.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        P::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// serde_norway prefixes messages with the path (printed already) and names internal `Raw*`
/// structs, which mean nothing to the author of the file.
fn clean_serde_message(message: &str, path: &str) -> String {
    let message = message
        .strip_prefix(path)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    let mut cleaned = message.to_string();
    while let Some(start) = cleaned.find("struct Raw") {
        let name_end = cleaned[start + "struct ".len()..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(cleaned.len(), |offset| start + "struct ".len() + offset);
        cleaned.replace_range(start..name_end, "a mapping");
    }
    cleaned
}

#[cfg(test)]
mod tests;
