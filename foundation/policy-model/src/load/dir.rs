//! A policy source is one file or a directory of files merged into one [`PolicySet`].
//!
//! Files of a directory are read in name order; only `*.yaml`, `*.yml` and `*.json` count, and
//! names starting with `.` are skipped (editor swap files, and the `..data` links Kubernetes
//! ConfigMap volumes use). Groups and policies may refer to groups defined in another file. A
//! name defined in two files is an error naming both. Every error names its file and the path
//! inside that file, as if the file had been loaded alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::raw::RawDocument;
use super::validate::validate;
use super::{parse, Errors, Format, InvalidConfig, InvalidSources};
use crate::model::PolicySet;

/// Loads a policy file, or every policy file of a directory.
pub fn load_path(path: &Path) -> Result<PolicySet, InvalidSources> {
    if path.is_dir() {
        load_dir(path)
    } else {
        super::load_file(path).map_err(InvalidSources::from)
    }
}

/// Whether a directory entry with this name is a policy file.
pub fn is_policy_file_name(name: &str) -> bool {
    if name.starts_with('.') {
        return false;
    }
    let Some((_, extension)) = name.rsplit_once('.') else {
        return false;
    };
    ["yaml", "yml", "json"]
        .iter()
        .any(|wanted| extension.eq_ignore_ascii_case(wanted))
}

/// The policy files of `dir`, sorted by name (the order in which they are merged).
pub fn policy_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        // `metadata` follows symlinks: a ConfigMap's files are links into `..data`.
        if is_policy_file_name(&name) && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file())
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Where an entry of the merged document came from: file index and index inside that file.
#[derive(Debug, Default)]
struct Origins {
    address_groups: Vec<(usize, usize)>,
    applied_to_groups: Vec<(usize, usize)>,
    policies: Vec<(usize, usize)>,
}

/// The first file (index) defining each name, per kind.
#[derive(Debug, Default)]
struct Owners {
    address_groups: BTreeMap<String, usize>,
    applied_to_groups: BTreeMap<String, usize>,
    policies: BTreeMap<String, usize>,
}

/// Loads every policy file of `dir` (see the module documentation) as one set.
pub fn load_dir(dir: &Path) -> Result<PolicySet, InvalidSources> {
    let files = policy_files(dir).map_err(|error| {
        InvalidConfig::one(
            dir.display().to_string(),
            "",
            format!("cannot read directory: {error}"),
        )
    })?;
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut file_errors: Vec<Errors> = files.iter().map(|_| Errors::default()).collect();
    let mut merged = RawDocument::default();
    let mut origins = Origins::default();
    let mut owners = Owners::default();
    for (file_index, file) in files.iter().enumerate() {
        let errors = &mut file_errors[file_index];
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(error) => {
                errors.push("", format!("cannot read file: {error}"));
                continue;
            }
        };
        let Some(raw) = parse(&text, Format::from_path(file), errors) else {
            continue;
        };
        for (local, group) in raw.address_groups.into_iter().enumerate() {
            match claim(&mut owners.address_groups, &group.name, file_index) {
                Ok(()) => {
                    merged.address_groups.push(group);
                    origins.address_groups.push((file_index, local));
                }
                Err(other) => errors.push(
                    format!("addressGroups[{local}].name"),
                    already_defined("address group", &group.name, &names[other]),
                ),
            }
        }
        for (local, group) in raw.applied_to_groups.into_iter().enumerate() {
            match claim(&mut owners.applied_to_groups, &group.name, file_index) {
                Ok(()) => {
                    merged.applied_to_groups.push(group);
                    origins.applied_to_groups.push((file_index, local));
                }
                Err(other) => errors.push(
                    format!("appliedToGroups[{local}].name"),
                    already_defined("applied-to group", &group.name, &names[other]),
                ),
            }
        }
        for (local, policy) in raw.policies.into_iter().enumerate() {
            let key = match &policy.namespace {
                Some(namespace) => format!("{namespace}/{}", policy.name),
                None => policy.name.clone(),
            };
            match claim(&mut owners.policies, &key, file_index) {
                Ok(()) => {
                    merged.policies.push(policy);
                    origins.policies.push((file_index, local));
                }
                Err(other) => errors.push(
                    format!("policies[{local}].name"),
                    already_defined("policy", &key, &names[other]),
                ),
            }
        }
    }
    let mut merged_errors = Errors::default();
    let set = validate(&merged, &mut merged_errors);
    let mut directory_errors = Errors::default();
    for error in merged_errors.list {
        match locate(&error.path, &origins) {
            Some((file_index, path)) => file_errors[file_index].push(path, error.reason),
            None => directory_errors.push(error.path, error.reason),
        }
    }
    let mut failed: Vec<InvalidConfig> = file_errors
        .into_iter()
        .zip(&names)
        .filter(|(errors, _)| !errors.list.is_empty())
        .map(|(errors, name)| errors.into_invalid(name))
        .collect();
    if !directory_errors.list.is_empty() {
        failed.push(directory_errors.into_invalid(&dir.display().to_string()));
    }
    if failed.is_empty() {
        Ok(set)
    } else {
        Err(InvalidSources { sources: failed })
    }
}

/// Records `file` as the owner of `name`; a name owned by another file is returned as `Err`.
/// A repeat inside one file is left to validation, which reports it with its own path.
fn claim(owners: &mut BTreeMap<String, usize>, name: &str, file: usize) -> Result<(), usize> {
    match owners.get(name) {
        Some(&owner) if owner != file => Err(owner),
        Some(_) => Ok(()),
        None => {
            owners.insert(name.to_string(), file);
            Ok(())
        }
    }
}

fn already_defined(kind: &str, name: &str, other_file: &str) -> String {
    format!("{kind} {name:?} is already defined in {other_file}")
}

/// Turns a path of the merged document (`policies[7].rules[0]`) into its file and the path
/// inside that file (`policies[2].rules[0]`).
fn locate(path: &str, origins: &Origins) -> Option<(usize, String)> {
    let (list, rest) = path.split_once('[')?;
    let (index, rest) = rest.split_once(']')?;
    let index: usize = index.parse().ok()?;
    let table = match list {
        "addressGroups" => &origins.address_groups,
        "appliedToGroups" => &origins.applied_to_groups,
        "policies" => &origins.policies,
        _ => return None,
    };
    let &(file, local) = table.get(index)?;
    Some((file, format!("{list}[{local}]{rest}")))
}
