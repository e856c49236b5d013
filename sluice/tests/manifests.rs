//! The Kubernetes manifests of `deploy/kubernetes/` (issue 18) checked offline against the
//! API's types: `test-support/python/validate_manifests.py` validates every object with the
//! official Python client's models (generated from the apiserver's OpenAPI: unknown fields,
//! missing required fields and wrong types are errors), since there is no apiserver here for
//! `kubectl apply --dry-run`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn validate(files: &[PathBuf]) -> Output {
    Command::new(test_support::python())
        .arg(test_support::python_script("validate_manifests.py"))
        .args(files)
        .output()
        .expect("the test venv's python (scripts/test.sh creates it)")
}

fn manifests() -> Vec<PathBuf> {
    let dir = test_support::workspace_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_manifest_matches_the_api_types() {
    let output = validate(&manifests());
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.contains("12 objects checked, 0 problems"), "{said}");
}

#[test]
fn a_mistake_is_caught_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: two\n  template: {spec: {containers: [{name: a, image: b, prot: 1}]}}\n",
    )
    .unwrap();
    let output = validate(&[bad]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{said}");
    for problem in [
        "Deployment/x: spec.selector: Field required",
        "Deployment/x: spec.replicas:",
        "Deployment/x: spec.template.spec.containers.0.prot: Extra inputs are not permitted",
    ] {
        assert!(said.contains(problem), "missing {problem:?} in:\n{said}");
    }
}
