//! The Prometheus alerting rules of `deploy/prometheus/` (issue 18): `promtool check rules`
//! accepts them, `promtool test rules` shows each alert firing on the series that should raise
//! it and staying quiet otherwise, and every metric they use is one Sluice exports.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prometheus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .expect("promtool is installed (Debian prometheus; scripts/test.sh installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{said}");
    said
}

#[test]
fn the_rules_check_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "sluice-alerts.yaml"]);
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "sluice-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every `sluice_*` name in the rules, without the `_total` a counter's samples carry.
fn metrics_in_rules() -> BTreeSet<String> {
    let text = std::fs::read_to_string(prometheus_dir().join("sluice-alerts.yaml")).unwrap();
    let mut names = BTreeSet::new();
    for (start, _) in text.match_indices("sluice_") {
        let name: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        names.insert(name.trim_end_matches("_total").to_string());
    }
    names
}

fn rust_sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_metric_the_rules_use_is_exported() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = Vec::new();
    for crate_dir in [
        "dataplane",
        "controlplane",
        "vm-datapath",
        "ebpf",
        "foundation",
    ] {
        rust_sources(&root.join(crate_dir), &mut sources);
    }
    let text: String = sources
        .iter()
        .filter(|path| !path.components().any(|part| part.as_os_str() == "tests"))
        .map(|path| std::fs::read_to_string(path).unwrap_or_default())
        .collect();
    let used = metrics_in_rules();
    assert!(used.len() >= 8, "{used:?}");
    for name in used {
        assert!(
            text.contains(&format!("\"{name}\"")),
            "the rules use {name}, which no Sluice code registers"
        );
    }
}
