//! Reading `UpstreamCluster` objects from YAML files (one or many `---`-separated objects per
//! file) and from a directory of such files, all-or-nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::spec::UpstreamCluster;
use crate::validate::validate;
use sluice_config_error::{document_origin, InvalidConfig, InvalidSources};

/// A valid cluster object and where it came from; its file paths are absolute (relative ones
/// resolved against the YAML file's directory).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedCluster {
    pub source: PathBuf,
    pub cluster: UpstreamCluster,
}

/// Parses and validates the objects of one YAML text; `file` names it in errors and anchors
/// relative paths. Does not touch the file system.
pub fn parse_clusters(text: &str, file: &Path) -> Result<Vec<LoadedCluster>, InvalidSources> {
    let origin = file.display().to_string();
    let mut errors = InvalidSources::default();
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        match serde_norway::Value::deserialize(document) {
            // A trailing `---` or a comment-only document holds no object.
            Ok(serde_norway::Value::Null) => {}
            Ok(value) => documents.push(value),
            Err(error) => {
                errors.push(&*origin, "", format!("invalid YAML: {error}"));
                break;
            }
        }
    }
    let numbered = documents.len() > 1;
    let mut clusters = Vec::new();
    for (index, value) in documents.into_iter().enumerate() {
        let document = document_origin(&origin, numbered.then_some(index + 1));
        match serde_path_to_error::deserialize::<_, UpstreamCluster>(value) {
            Ok(mut cluster) => {
                let problems = validate(&cluster);
                if problems.is_empty() {
                    resolve_paths(&mut cluster, file);
                    clusters.push(LoadedCluster {
                        source: file.to_path_buf(),
                        cluster,
                    });
                } else {
                    for (path, reason) in problems {
                        errors.push(&*document, path, reason);
                    }
                }
            }
            Err(failure) => {
                let path = failure.path().to_string();
                let path = if path == "." { String::new() } else { path };
                errors.push(&*document, path, failure.into_inner().to_string());
            }
        }
    }
    if errors.is_empty() {
        Ok(clusters)
    } else {
        Err(errors)
    }
}

pub(crate) fn resolve_paths(cluster: &mut UpstreamCluster, file: &Path) {
    let base = file.parent().unwrap_or(Path::new("."));
    let resolve = |path: &mut PathBuf| {
        if path.is_relative() {
            *path = base.join(&*path);
        }
    };
    let client = &mut cluster.spec.client_config;
    for path in [
        &mut client.cert_file,
        &mut client.key_file,
        &mut client.bearer_token_file,
        &mut client.ca_file,
    ]
    .into_iter()
    .flatten()
    {
        resolve(path);
    }
    let serving = &mut cluster.spec.secure_serving;
    resolve(&mut serving.cert_file);
    resolve(&mut serving.key_file);
    if let Some(path) = &mut serving.client_ca_file {
        resolve(path);
    }
}

/// Every referenced certificate, key and token file must be readable.
pub(crate) fn check_files(loaded: &LoadedCluster, errors: &mut InvalidSources) {
    let spec = &loaded.cluster.spec;
    let client = &spec.client_config;
    let serving = &spec.secure_serving;
    let files = [
        ("spec.clientConfig.certFile", client.cert_file.as_ref()),
        ("spec.clientConfig.keyFile", client.key_file.as_ref()),
        (
            "spec.clientConfig.bearerTokenFile",
            client.bearer_token_file.as_ref(),
        ),
        ("spec.clientConfig.caFile", client.ca_file.as_ref()),
        ("spec.secureServing.certFile", Some(&serving.cert_file)),
        ("spec.secureServing.keyFile", Some(&serving.key_file)),
        (
            "spec.secureServing.clientCAFile",
            serving.client_ca_file.as_ref(),
        ),
    ];
    for (field, path) in files {
        if let Some(path) = path {
            if let Err(error) = std::fs::File::open(path) {
                errors.push(
                    loaded.source.display().to_string(),
                    format!("metadata.name={:?} {field}", loaded.cluster.metadata.name),
                    format!("cannot read {}: {error}", path.display()),
                );
            }
        }
    }
}

/// Loads every `*.yaml` / `*.yml` file of `dir` (sorted by name, not recursive). Cluster names
/// and hostnames must be unique across all files, and referenced files must be readable.
pub fn load_dir(dir: &Path) -> Result<Vec<LoadedCluster>, InvalidSources> {
    let entries = std::fs::read_dir(dir).map_err(|error| {
        InvalidSources::from(InvalidConfig::one(
            dir.display().to_string(),
            "",
            format!("cannot read directory: {error}"),
        ))
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.is_file()
                && path
                    .extension()
                    .is_some_and(|extension| extension == "yaml" || extension == "yml")
        })
        .collect();
    files.sort();

    let mut errors = InvalidSources::default();
    let mut clusters = Vec::new();
    for file in &files {
        match std::fs::read_to_string(file) {
            Ok(text) => match parse_clusters(&text, file) {
                Ok(parsed) => clusters.extend(parsed),
                Err(found) => errors.sources.extend(found.sources),
            },
            Err(error) => errors.push(
                file.display().to_string(),
                "",
                format!("cannot read: {error}"),
            ),
        }
    }
    check_unique(&clusters, &mut errors);
    for cluster in &clusters {
        check_files(cluster, &mut errors);
    }
    if errors.is_empty() {
        Ok(clusters)
    } else {
        Err(errors)
    }
}

/// Cluster names and hostnames (name plus extra hostnames) must be unique across objects.
pub fn check_unique(clusters: &[LoadedCluster], errors: &mut InvalidSources) {
    let mut names: HashMap<&str, &Path> = HashMap::new();
    let mut hosts: HashMap<&str, (&str, &Path)> = HashMap::new();
    for loaded in clusters {
        let name = loaded.cluster.metadata.name.as_str();
        if let Some(first) = names.insert(name, &loaded.source) {
            errors.push(
                loaded.source.display().to_string(),
                "metadata.name",
                format!("cluster {name:?} is also defined in {}", first.display()),
            );
            continue;
        }
        let extra = &loaded.cluster.spec.secure_serving.extra_hostnames;
        for (index, host) in std::iter::once(name)
            .chain(extra.iter().map(String::as_str))
            .enumerate()
        {
            if let Some((other, file)) = hosts.insert(host, (name, &loaded.source)) {
                let path = if index == 0 {
                    "metadata.name".into()
                } else {
                    format!("spec.secureServing.extraHostnames[{}]", index - 1)
                };
                errors.push(
                    loaded.source.display().to_string(),
                    path,
                    format!(
                        "hostname {host:?} already belongs to cluster {other:?} ({})",
                        file.display()
                    ),
                );
            }
        }
    }
}
