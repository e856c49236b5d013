//! The Prometheus alerting rules of `deploy/prometheus/` (issues 18, 35): `promtool check rules`
//! accepts them, `promtool test rules` passes and holds, for every alert, a case where it fires
//! and one where it stays quiet, every metric they use is one Sluice registers, and every alert
//! links a runbook section of docs/OPERATIONS.md. (`alerts_live.rs` checks the names and labels
//! against the live `/metrics` of each role.)
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::metric_names;

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
    assert!(checked.contains("SUCCESS: 25 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "sluice-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_metric_the_rules_use_is_exported() {
    let text = std::fs::read_to_string(prometheus_dir().join("sluice-alerts.yaml")).unwrap();
    let sources = metric_names::registering_sources();
    let used = metric_names::sluice_names(&text);
    assert!(used.len() >= 20, "{used:?}");
    for name in used {
        assert!(
            is_registered(&sources, &name),
            "the rules use {name}, which no Sluice code registers"
        );
    }
}

/// Registered as a `"family"` literal, or as `"rest"` in a sub-registry whose
/// `sub_registry_with_prefix("prefix")` makes it `prefix_rest` (the control plane's).
fn is_registered(sources: &str, name: &str) -> bool {
    metric_names::is_registered(sources, name)
        || name.match_indices('_').any(|(at, _)| {
            let (prefix, rest) = (&name[..at], &name[at + 1..]);
            sources.contains(&format!("sub_registry_with_prefix(\"{prefix}\")"))
                && metric_names::is_registered(sources, rest)
        })
}

/// The panic alerts select on the label the runtime really exports (they once grouped by
/// `kind`, which no series carries, so `SluiceWorkerDied` could never fire), and the promtool
/// tests feed them series labelled the same way.
#[test]
fn the_panic_alerts_select_on_the_label_the_runtime_exports() {
    let label = sluice_runtime::TASK_PANICS_LABEL;
    let rules = std::fs::read_to_string(prometheus_dir().join("sluice-alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(prometheus_dir().join("sluice-alerts.test.yaml")).unwrap();
    assert!(
        rules.contains(&format!(
            "sum by (instance, {label}) (increase(sluice_task_panics_total"
        )) && rules.contains(&format!("sluice_task_panics_total{{{label}=\"worker\"}}")),
        "the panic alerts must group and select by `{label}`"
    );
    let panic_series: Vec<&str> = tests
        .lines()
        .filter(|line| line.contains("series: 'sluice_task_panics_total{"))
        .collect();
    assert!(panic_series.len() >= 2, "{panic_series:?}");
    for series in panic_series {
        assert!(series.contains(&format!(" {label}=\"")), "{series}");
    }
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/sluice-runtime.json"),
    )
    .unwrap();
    assert!(dashboard.contains(&format!(
        "sum by (instance, {label}) (increase(sluice_task_panics_total"
    )));
}

fn yaml(file: &str) -> serde_norway::Value {
    let text = std::fs::read_to_string(prometheus_dir().join(file)).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every alert's name with its `runbook_url` annotation and its expression.
fn alerts() -> Vec<(String, String, String)> {
    let rules = yaml("sluice-alerts.yaml");
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap().to_string();
            let runbook = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no runbook_url"))
                .to_string();
            let expr = rule["expr"].as_str().unwrap().to_string();
            alerts.push((name, runbook, expr));
        }
    }
    alerts
}

/// `promtool test rules` passes when an alert is never tested, or tested only where it stays
/// quiet: each alert needs a case where it fires and one where it does not.
#[test]
fn every_alert_is_tested_firing_and_quiet() {
    let tests = yaml("sluice-alerts.test.yaml");
    let mut firing = std::collections::BTreeSet::new();
    let mut quiet = std::collections::BTreeSet::new();
    for test in tests["tests"].as_sequence().unwrap() {
        for case in test["alert_rule_test"].as_sequence().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_string();
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name);
            } else {
                firing.insert(name);
            }
        }
    }
    let alerts = alerts();
    assert!(alerts.len() >= 23, "{alerts:?}");
    for (name, _, _) in alerts {
        assert!(firing.contains(&name), "{name} is never shown firing");
        assert!(quiet.contains(&name), "{name} is never shown quiet");
    }
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Each alert's `runbook_url` is `docs/OPERATIONS.md#<anchor>` of a `###` section of its own,
/// which says what the alert means, how to confirm it and what to do.
#[test]
fn every_alert_links_its_runbook_section() {
    let operations = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/OPERATIONS.md"),
    )
    .unwrap();
    let mut sections = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    for line in operations.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            current = Some(anchor(heading));
            sections.insert(anchor(heading), String::new());
        } else if line.starts_with("## ") {
            current = None;
        } else if let Some(section) = current.as_ref() {
            let text = sections.get_mut(section).unwrap();
            text.push_str(line);
            text.push('\n');
        }
    }
    for (name, runbook, expr) in alerts() {
        let expected = format!("docs/OPERATIONS.md#runbook-{}", name.to_lowercase());
        assert_eq!(runbook, expected, "{name}");
        let section = sections.get(&format!("runbook-{}", name.to_lowercase()));
        let text = section.unwrap_or_else(|| panic!("OPERATIONS.md has no section for {runbook}"));
        for part in ["**Means**", "**Confirm**", "**Do**"] {
            assert!(text.contains(part), "{runbook}: no {part} part");
        }
        // How to confirm names the series the alert reads.
        let mut series = metric_names::sluice_names(&expr);
        if expr.starts_with("up{") {
            series.insert("up{".to_string());
        }
        assert!(
            series.iter().any(|name| text.contains(name.as_str())),
            "{runbook}: names none of {series:?}"
        );
    }
}
