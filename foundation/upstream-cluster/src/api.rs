//! `UpstreamCluster` objects as the control plane's API serves them: the same model and
//! validation as files, reading only what a file would hold (server-set metadata such as uid
//! and resourceVersion, and the status gateways report, are not the gateway's input).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::load::{check_files, check_unique, resolve_paths, LoadedCluster};
use crate::spec::{UpstreamCluster, API_VERSION, KIND};
use crate::validate::validate;
use sluice_config_error::InvalidSources;

/// The part of an API object a cluster file would hold: apiVersion, kind, name, labels, spec.
pub fn as_written(object: &Value) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
            "labels": object.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
        },
        "spec": object.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// Parses one API object with the file model; errors carry its field paths.
pub fn parse_object(object: &Value) -> Result<UpstreamCluster, Vec<(String, String)>> {
    let cluster: UpstreamCluster =
        serde_path_to_error::deserialize(&as_written(object)).map_err(|failure| {
            let path = failure.path().to_string();
            let path = if path == "." { String::new() } else { path };
            vec![(path, failure.into_inner().to_string())]
        })?;
    match validate(&cluster) {
        problems if problems.is_empty() => Ok(cluster),
        problems => Err(problems),
    }
}

/// Every object of a control-plane list, all-or-nothing as a directory is: each error names
/// `<origin>/<name>`, the field and the reason. Relative file paths in the objects are
/// resolved against `files_dir`.
pub fn load_objects<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
    origin: &str,
    files_dir: &Path,
) -> Result<Vec<LoadedCluster>, InvalidSources> {
    let mut errors = InvalidSources::default();
    let mut clusters = Vec::new();
    for object in objects {
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let source = PathBuf::from(format!("{origin}/{name}"));
        match parse_object(object) {
            Ok(mut cluster) => {
                // resolve_paths anchors on a file's directory: name a file inside files_dir.
                resolve_paths(&mut cluster, &files_dir.join("object"));
                clusters.push(LoadedCluster { source, cluster });
            }
            Err(problems) => {
                for (path, reason) in problems {
                    errors.push(source.display().to_string(), path, reason);
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Value {
        let yaml: serde_norway::Value =
            serde_norway::from_str(test_support::examples::UPSTREAM_CLUSTER).unwrap();
        serde_json::to_value(yaml).unwrap()
    }

    #[test]
    fn server_metadata_and_status_are_ignored() {
        let mut object = example();
        object["metadata"]["uid"] = json!("u-1");
        object["metadata"]["resourceVersion"] = json!("9");
        object["status"] = json!({"servers": []});
        let cluster = parse_object(&object).unwrap();
        assert_eq!(cluster.metadata.name, "cluster-a.example.com");
    }

    #[test]
    fn object_errors_name_the_object_and_field() {
        let mut object = example();
        object["spec"]["servers"][0]["endpoint"] = json!("10.0.0.1:6443");
        let errors = load_objects([&object], "controlplane", Path::new("/etc/sluice"))
            .unwrap_err()
            .to_string();
        assert!(
            errors.contains("controlplane/cluster-a.example.com")
                && errors.contains("spec.servers[0].endpoint"),
            "{errors}"
        );
    }
}
