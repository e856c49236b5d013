//! The policy scenario: runs the criterion benches of `sluice-benches` and lifts criterion's
//! estimates (`<target>/criterion/**/new/estimates.json`) into a summary.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde::Serialize;

use super::{write_output, Harness};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    pub id: String,
    pub mean_ns: f64,
    pub median_ns: f64,
    pub std_dev_ns: f64,
}

/// Reads one benchmark's `benchmark.json` (its id) and `estimates.json`; `None` if either is
/// missing or malformed.
pub fn parse_estimate(benchmark_json: &str, estimates_json: &str) -> Option<Estimate> {
    let benchmark: serde_json::Value = serde_json::from_str(benchmark_json).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(estimates_json).ok()?;
    let point = |name: &str| estimates.get(name)?.get("point_estimate")?.as_f64();
    Some(Estimate {
        id: benchmark.get("full_id")?.as_str()?.to_string(),
        mean_ns: point("mean")?,
        median_ns: point("median")?,
        std_dev_ns: point("std_dev")?,
    })
}

fn new_estimate_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name == "new")
                && path.join("estimates.json").exists()
            {
                found.push(path);
            } else {
                new_estimate_dirs(&path, found);
            }
        }
    }
}

fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

pub fn run(harness: &Harness) -> anyhow::Result<()> {
    let benches = harness.workspace.join("benches/benches");
    let has_benches = std::fs::read_dir(&benches)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "rs"))
        })
        .unwrap_or(false);
    if !has_benches {
        let message = format!(
            "policy: no criterion benches in {} yet; skipped.\n",
            benches.display()
        );
        write_output(&harness.out, "summary.md", &message)?;
        println!("{message}");
        return Ok(());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| harness.workspace.join("target"));
    let criterion = target.join("criterion");
    let _ = std::fs::remove_dir_all(&criterion);
    let mut command = Command::new("cargo");
    command.current_dir(&harness.workspace).args([
        "bench",
        "--locked",
        "-p",
        "sluice-benches",
        "--",
    ]);
    if harness.smoke {
        command.arg("--quick");
    }
    let status = command.status().context("cannot run cargo bench")?;
    if !status.success() {
        bail!("cargo bench -p sluice-benches failed ({status})");
    }
    let mut dirs = Vec::new();
    new_estimate_dirs(&criterion, &mut dirs);
    let mut estimates: Vec<Estimate> = dirs
        .iter()
        .filter_map(|dir| {
            let benchmark = std::fs::read_to_string(dir.join("benchmark.json")).ok()?;
            let estimates = std::fs::read_to_string(dir.join("estimates.json")).ok()?;
            parse_estimate(&benchmark, &estimates)
        })
        .collect();
    estimates.sort_by(|a, b| a.id.cmp(&b.id));
    write_output(
        &harness.out,
        "raw/criterion.json",
        &serde_json::to_string_pretty(&estimates)?,
    )?;
    let mut markdown = format!(
        "# Policy scenario{}\n\n{}Criterion estimates of `cargo bench -p sluice-benches`.\n\n\
         | benchmark | mean | median | std dev |\n|---|--:|--:|--:|\n",
        if harness.smoke {
            " (smoke: --quick)"
        } else {
            ""
        },
        crate::machine::describe().markdown(None),
    );
    for estimate in &estimates {
        markdown.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            estimate.id,
            human(estimate.mean_ns),
            human(estimate.median_ns),
            human(estimate.std_dev_ns)
        ));
    }
    write_output(&harness.out, "summary.md", &markdown)?;
    println!("{markdown}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lifts_criterion_estimates() {
        let benchmark = r#"{"group_id":"compile","function_id":null,"value_str":"100 rules","full_id":"compile/100 rules","directory_name":"compile/100 rules"}"#;
        let estimates = r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},"point_estimate":2000.5,"standard_error":0.1},
            "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},"point_estimate":1990.0,"standard_error":0.1},
            "median_abs_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},"point_estimate":5.0,"standard_error":0.1},
            "slope":null,
            "std_dev":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1.0,"upper_bound":3.0},"point_estimate":12.0,"standard_error":0.1}}"#;
        let estimate = parse_estimate(benchmark, estimates).unwrap();
        assert_eq!(estimate.id, "compile/100 rules");
        assert_eq!(estimate.mean_ns, 2000.5);
        assert_eq!(estimate.median_ns, 1990.0);
        assert_eq!(human(estimate.mean_ns), "2.00 us");
        assert_eq!(parse_estimate("{}", estimates), None);
    }

    proptest! {
        #[test]
        fn estimate_parsing_never_panics(a in ".{0,100}", b in ".{0,100}") {
            let _ = parse_estimate(&a, &b);
        }
    }
}
