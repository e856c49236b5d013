//! The Prometheus alerting rules of `deploy/prometheus/` (issue 18): `promtool check rules`
//! accepts them, `promtool test rules` shows each alert firing on the series that should raise
//! it and staying quiet otherwise, and every metric they use is one Sluice exports.
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
    assert!(checked.contains("SUCCESS: 9 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "sluice-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_metric_the_rules_use_is_exported() {
    let text = std::fs::read_to_string(prometheus_dir().join("sluice-alerts.yaml")).unwrap();
    let sources = metric_names::registering_sources();
    let used = metric_names::sluice_names(&text);
    assert!(used.len() >= 8, "{used:?}");
    for name in used {
        assert!(
            metric_names::is_registered(&sources, &name),
            "the rules use {name}, which no Sluice code registers"
        );
    }
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
