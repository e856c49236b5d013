//! The files an `UpstreamCluster` from the control plane may name. A cluster file in the
//! gateway's own `clusters_dir` is local and trusted: its paths go anywhere. An object from the
//! control plane is not: the gateway would read what it names and send it upstream (a bearer
//! token file becomes an `Authorization` header, a CA or certificate file goes into TLS), so a
//! control-plane admin could read any one-line file of every gateway host. Such an object may
//! only name files inside the directory the gateway's local config allows
//! (`gateway.credentials_dir`): relative to it, or absolute inside it, never through `..` or a
//! symbolic link leading out; anything else is refused with the field named, before the file is
//! opened.

use std::path::{Component, Path, PathBuf};

use crate::spec::UpstreamCluster;

/// Every field of a cluster that names a file, with its path in the object.
fn file_fields(cluster: &mut UpstreamCluster) -> [(&'static str, Option<&mut PathBuf>); 7] {
    let spec = &mut cluster.spec;
    let client = &mut spec.client_config;
    let serving = &mut spec.secure_serving;
    [
        ("spec.clientConfig.certFile", client.cert_file.as_mut()),
        ("spec.clientConfig.keyFile", client.key_file.as_mut()),
        (
            "spec.clientConfig.bearerTokenFile",
            client.bearer_token_file.as_mut(),
        ),
        ("spec.clientConfig.caFile", client.ca_file.as_mut()),
        ("spec.secureServing.certFile", Some(&mut serving.cert_file)),
        ("spec.secureServing.keyFile", Some(&mut serving.key_file)),
        (
            "spec.secureServing.clientCAFile",
            serving.client_ca_file.as_mut(),
        ),
    ]
}

/// What the control plane itself can tell without the gateway's config: a file path with a
/// `..` component can only be meant to leave the credentials directory. (field, reason) pairs.
pub fn parent_components(cluster: &UpstreamCluster) -> Vec<(String, String)> {
    let mut cluster = cluster.clone();
    file_fields(&mut cluster)
        .into_iter()
        .filter_map(|(field, path)| Some((field, path?)))
        .filter(|(_, path)| path.components().any(|part| part == Component::ParentDir))
        .map(|(field, path)| {
            (
                field.to_string(),
                format!(
                    "{:?} contains `..`: a file named by a control-plane object must lie inside the gateway's credentials directory (gateway.credentials_dir)",
                    path.display()
                ),
            )
        })
        .collect()
}

/// Resolves every file of `cluster` (an object from the control plane) inside `dir`, the
/// gateway's `gateway.credentials_dir`, or refuses it: (field, reason) pairs, empty when every
/// file lies inside. Paths outside are refused before anything touches them; paths inside are
/// then resolved through symbolic links and must still lie inside. Without a directory, the
/// object may name no file at all.
pub fn confine(cluster: &mut UpstreamCluster, dir: Option<&Path>) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let Some(dir) = dir else {
        for (field, path) in file_fields(cluster) {
            if let Some(path) = path {
                problems.push((
                    field.to_string(),
                    format!(
                        "{:?}: this gateway's config sets no gateway.credentials_dir, so objects from the control plane may name no files",
                        path.display()
                    ),
                ));
            }
        }
        return problems;
    };
    let real_dir = dir.canonicalize();
    for (field, path) in file_fields(cluster) {
        let Some(path) = path else { continue };
        match confined(path, dir, real_dir.as_deref()) {
            Ok(resolved) => *path = resolved,
            Err(reason) => problems.push((field.to_string(), reason)),
        }
    }
    problems
}

/// `path` resolved against `dir` if it stays inside it (lexically, then through links).
fn confined(
    path: &Path,
    dir: &Path,
    real_dir: Result<&Path, &std::io::Error>,
) -> Result<PathBuf, String> {
    let outside = || {
        format!(
            "{:?} is outside this gateway's credentials directory {} (gateway.credentials_dir): objects from the control plane may only name files inside it",
            path.display(),
            dir.display()
        )
    };
    let resolved = dir.join(path);
    let parent = resolved
        .components()
        .any(|part| part == Component::ParentDir);
    let inside = resolved.starts_with(dir) || real_dir.is_ok_and(|real| resolved.starts_with(real));
    if parent || !inside {
        return Err(outside());
    }
    let real_dir = real_dir.map_err(|error| {
        format!(
            "cannot resolve gateway.credentials_dir {}: {error}",
            dir.display()
        )
    })?;
    match resolved.canonicalize() {
        Ok(real) if real.starts_with(real_dir) => Ok(resolved),
        Ok(real) => Err(format!(
            "{} (through a symbolic link: {})",
            outside(),
            real.display()
        )),
        Err(error) => Err(format!("cannot read {}: {error}", resolved.display())),
    }
}

/// A credentials directory holding every file the example UpstreamCluster names (`ca.pem` for
/// its CA), for the tests of confinement and of the API's checks.
#[cfg(test)]
pub(crate) fn example_credentials() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    for name in [
        "gateway.pem",
        "gateway-key.pem",
        "ca.pem",
        "serving.pem",
        "serving-key.pem",
        "client-ca.pem",
    ] {
        std::fs::write(dir.path().join(name), "pem").expect("credential file");
    }
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> UpstreamCluster {
        serde_norway::from_str(test_support::examples::UPSTREAM_CLUSTER).unwrap()
    }

    fn with_ca(path: &str) -> UpstreamCluster {
        let mut cluster = cluster();
        cluster.spec.client_config.ca_file = Some(PathBuf::from(path));
        cluster
    }

    #[test]
    fn files_inside_the_directory_resolve_against_it() {
        let dir = example_credentials();
        let absolute = dir.path().join("ca.pem");
        for ca in ["ca.pem", "./ca.pem", absolute.to_str().unwrap()] {
            let mut cluster = with_ca(ca);
            assert_eq!(confine(&mut cluster, Some(dir.path())), [], "{ca}");
            assert_eq!(
                cluster.spec.client_config.ca_file,
                Some(dir.path().join(ca))
            );
            assert_eq!(
                cluster.spec.secure_serving.key_file,
                dir.path().join("serving-key.pem")
            );
        }
    }

    #[test]
    fn a_file_outside_the_directory_is_refused_with_its_field() {
        let dir = example_credentials();
        for (ca, why) in [
            ("/etc/hostname", "outside"),
            ("../etc/hostname", "outside"),
            ("sub/../../ca.pem", "outside"),
            ("missing.pem", "cannot read"),
        ] {
            let mut cluster = with_ca(ca);
            let problems = confine(&mut cluster, Some(dir.path()));
            assert_eq!(problems.len(), 1, "{ca}: {problems:?}");
            assert_eq!(problems[0].0, "spec.clientConfig.caFile");
            assert!(problems[0].1.contains(why), "{ca}: {problems:?}");
            assert!(problems[0].1.contains("gateway.credentials_dir") || why != "outside");
        }
        let mut token = cluster();
        token.spec.client_config.bearer_token_file = Some("/proc/self/environ".into());
        let problems = confine(&mut token, Some(dir.path()));
        assert_eq!(problems[0].0, "spec.clientConfig.bearerTokenFile");
    }

    #[test]
    fn a_symbolic_link_leading_out_is_refused() {
        let dir = example_credentials();
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(secret.path(), dir.path().join("link.pem")).unwrap();
        let mut cluster = with_ca("link.pem");
        let problems = confine(&mut cluster, Some(dir.path()));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].1.contains("symbolic link"), "{problems:?}");
    }

    #[test]
    fn without_a_directory_no_file_may_be_named() {
        let mut cluster = cluster();
        let fields: Vec<String> = confine(&mut cluster, None)
            .into_iter()
            .map(|(field, _)| field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.clientConfig.certFile",
                "spec.clientConfig.keyFile",
                "spec.clientConfig.caFile",
                "spec.secureServing.certFile",
                "spec.secureServing.keyFile",
                "spec.secureServing.clientCAFile",
            ]
        );
    }

    #[test]
    fn the_control_plane_refuses_parent_components() {
        assert_eq!(parent_components(&with_ca("ca.pem")), []);
        assert_eq!(parent_components(&with_ca("/etc/ca.pem")), []);
        let problems = parent_components(&with_ca("../../etc/hostname"));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "spec.clientConfig.caFile");
        assert!(problems[0].1.contains("`..`"), "{problems:?}");
    }
}
