//! `UpstreamCluster` objects as the control plane's API serves them: the same model and
//! validation as files, reading only what a file would hold (server-set metadata such as uid
//! and resourceVersion, and the status gateways report, are not the gateway's input). Unlike a
//! file, an object may only name files inside the gateway's `gateway.credentials_dir` (see
//! [`crate::confine`]).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::confine::{confine, parent_components};
use crate::load::{check_files, check_unique, LoadedCluster};
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

/// Parses one API object with the file model; errors carry its field paths. A file path with a
/// `..` component is refused here already: the control plane validates with this too.
pub fn parse_object(object: &Value) -> Result<UpstreamCluster, Vec<(String, String)>> {
    let cluster: UpstreamCluster =
        serde_path_to_error::deserialize(&as_written(object)).map_err(|failure| {
            let path = failure.path().to_string();
            let path = if path == "." { String::new() } else { path };
            vec![(path, failure.into_inner().to_string())]
        })?;
    let mut problems = validate(&cluster);
    problems.extend(parent_components(&cluster));
    match problems {
        problems if problems.is_empty() => Ok(cluster),
        problems => Err(problems),
    }
}

/// Every object of a control-plane list, all-or-nothing as a directory is: each error names
/// `<origin>/<name>`, the field and the reason. The files an object names must lie inside
/// `credentials_dir` (the gateway's `gateway.credentials_dir`; relative paths are relative to
/// it); without one, an object may name no file. A file outside is refused before it is opened.
pub fn load_objects<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
    origin: &str,
    credentials_dir: Option<&Path>,
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
                let problems = confine(&mut cluster, credentials_dir);
                for (path, reason) in &problems {
                    errors.push(source.display().to_string(), path, reason);
                }
                if problems.is_empty() {
                    clusters.push(LoadedCluster { source, cluster });
                }
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

    /// A credentials directory with every file the example names, its CA as `ca.pem`.
    fn credentials(object: &mut Value) -> tempfile::TempDir {
        object["spec"]["clientConfig"]["caFile"] = json!("ca.pem");
        crate::confine::example_credentials()
    }

    #[test]
    fn object_files_resolve_inside_the_credentials_directory() {
        let mut object = example();
        let dir = credentials(&mut object);
        let loaded = load_objects([&object], "controlplane", Some(dir.path())).unwrap();
        let client = &loaded[0].cluster.spec.client_config;
        assert_eq!(client.ca_file, Some(dir.path().join("ca.pem")));
    }

    #[test]
    fn an_object_naming_a_file_outside_is_refused_with_the_field() {
        let mut object = example();
        let dir = credentials(&mut object);
        object["spec"]["clientConfig"]["bearerTokenFile"] = json!("/etc/hostname");
        let errors = load_objects([&object], "cp", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            errors.contains("cp/cluster-a.example.com")
                && errors.contains("spec.clientConfig.bearerTokenFile")
                && errors.contains("outside")
                && errors.contains("gateway.credentials_dir"),
            "{errors}"
        );
        // The control plane refuses a `..` already.
        object["spec"]["clientConfig"]["bearerTokenFile"] = json!("../../etc/hostname");
        let problems = parse_object(&object).unwrap_err();
        assert_eq!(problems[0].0, "spec.clientConfig.bearerTokenFile");
        // Without a credentials directory, no file at all.
        let errors = load_objects([&example()], "cp", None)
            .unwrap_err()
            .to_string();
        assert!(errors.contains("spec.secureServing.certFile"), "{errors}");
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
        let errors = load_objects([&object], "controlplane", Some(Path::new("/etc/sluice")))
            .unwrap_err()
            .to_string();
        assert!(
            errors.contains("controlplane/cluster-a.example.com")
                && errors.contains("spec.servers[0].endpoint"),
            "{errors}"
        );
    }
}
