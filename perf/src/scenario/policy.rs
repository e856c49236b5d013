//! The policy scenario: runs the criterion benches of `sluice-benches` and lifts criterion's
//! estimates (`<target>/criterion/**/new/estimates.json`) into a summary; then the install
//! comparison of `sluice-ovs` (10,000 flows in one bundle through the native OpenFlow client
//! against `ovs-ofctl --bundle add-flows`, both on a private userspace OVS started by the test,
//! alternating, in one run) and lifts its printed rounds.

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

/// One round of the install comparison: wall time of each side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstallRound {
    pub round: u32,
    pub native_ns: f64,
    pub ofctl_ns: f64,
}

/// A Rust `Duration` as `{:?}` prints it: "1.5s", "12.345ms", "850.2µs", "900ns".
fn parse_debug_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, scale) = if let Some(number) = text.strip_suffix("ms") {
        (number, 1e6)
    } else if let Some(number) = text.strip_suffix("µs") {
        (number, 1e3)
    } else if let Some(number) = text.strip_suffix("ns") {
        (number, 1.0)
    } else {
        (text.strip_suffix('s')?, 1e9)
    };
    let value: f64 = number.parse().ok()?;
    value.is_finite().then_some(value * scale)
}

/// The rounds `ten_thousand_flows_in_one_bundle_beat_ovs_ofctl` prints
/// ("round N: native <duration> (...), ovs-ofctl <duration> (...)"); other lines are ignored.
pub fn parse_install_rounds(output: &str) -> Vec<InstallRound> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("round ")?;
            let (round, rest) = rest.split_once(": native ")?;
            let (native, rest) = rest.split_once(' ')?;
            let (_, rest) = rest.split_once("ovs-ofctl ")?;
            let ofctl = rest.split(' ').next()?;
            Some(InstallRound {
                round: round.parse().ok()?,
                native_ns: parse_debug_duration(native.trim_end_matches(','))?,
                ofctl_ns: parse_debug_duration(ofctl.trim_end_matches(','))?,
            })
        })
        .collect()
}

/// Runs the install comparison test in release mode and returns its rounds.
fn install_comparison(harness: &Harness) -> anyhow::Result<Vec<InstallRound>> {
    let output = Command::new("cargo")
        .current_dir(&harness.workspace)
        .args([
            "test",
            "--release",
            "--locked",
            "-p",
            "sluice-ovs",
            "--test",
            "ovs_switch",
            "ten_thousand_flows_in_one_bundle_beat_ovs_ofctl",
            "--",
            "--exact",
            "--nocapture",
        ])
        .output()
        .context("cannot run cargo test -p sluice-ovs")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    write_output(&harness.out, "raw/install-comparison.txt", &stdout)?;
    if !output.status.success() {
        bail!(
            "the install comparison failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let rounds = parse_install_rounds(&stdout);
    if rounds.len() < 2 {
        bail!("the install comparison printed no rounds; see raw/install-comparison.txt");
    }
    Ok(rounds)
}

/// Markdown for the install comparison: every round, then the best of the measured rounds
/// (round 0 is a warm-up) and their ratio.
fn install_markdown(rounds: &[InstallRound]) -> String {
    let mut markdown = String::from(
        "\n## Install: 10,000 flows in one bundle\n\n\
         `cargo test --release -p sluice-ovs --test ovs_switch \
         ten_thousand_flows_in_one_bundle_beat_ovs_ofctl -- --nocapture`: the native OpenFlow \
         client (one bundle: open, 10,000 adds, barrier, commit) against `ovs-ofctl --bundle \
         add-flows` fed the same flows as text, on a private userspace OVS, alternating who goes \
         first; round 0 is a warm-up.\n\n| round | native | ovs-ofctl | ratio |\n|--:|--:|--:|--:|\n",
    );
    for round in rounds {
        markdown.push_str(&format!(
            "| {} | {} | {} | {:.2}x |\n",
            round.round,
            human(round.native_ns),
            human(round.ofctl_ns),
            round.ofctl_ns / round.native_ns
        ));
    }
    let measured = rounds.iter().filter(|round| round.round > 0);
    let best =
        |pick: fn(&InstallRound) -> f64| measured.clone().map(pick).fold(f64::INFINITY, f64::min);
    let (native, ofctl) = (best(|r| r.native_ns), best(|r| r.ofctl_ns));
    markdown.push_str(&format!(
        "\nBest of the measured rounds: native {}, ovs-ofctl {}, **{:.2}x**.\n",
        human(native),
        human(ofctl),
        ofctl / native
    ));
    markdown
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
    if harness.smoke {
        markdown.push_str("\nInstall comparison: skipped in smoke mode.\n");
    } else {
        let rounds = install_comparison(harness)?;
        write_output(
            &harness.out,
            "raw/install-comparison.json",
            &serde_json::to_string_pretty(&rounds)?,
        )?;
        markdown.push_str(&install_markdown(&rounds));
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

    /// Lines as the install comparison test prints them.
    const INSTALL_OUTPUT: &str = "encoding 10000 bundle-add flow mods (1040000 bytes): 3.1ms
round 0: native 61.2ms (ovs-vswitchd main thread on CPU 58ms), ovs-ofctl 150.3ms (ovs-vswitchd 60ms, ovs-ofctl itself 70ms)
round 1: native 48.5ms (ovs-vswitchd main thread on CPU 45ms), ovs-ofctl 1.2s (ovs-vswitchd 50ms, ovs-ofctl itself 60ms)
round 2: native 950.5µs (ovs-vswitchd main thread on CPU 40ms), ovs-ofctl 112.0ms (ovs-vswitchd 50ms, ovs-ofctl itself 60ms)
10000 flows in one bundle (best of 5): native client 48.5ms, ovs-ofctl --bundle add-flows 112.0ms, ratio 2.31x
";

    #[test]
    fn lifts_the_install_rounds() {
        let rounds = parse_install_rounds(INSTALL_OUTPUT);
        assert_eq!(rounds.len(), 3);
        assert_eq!(rounds[0].round, 0);
        assert_eq!(rounds[1].native_ns, 48.5e6);
        assert_eq!(rounds[1].ofctl_ns, 1.2e9);
        assert_eq!(rounds[2].native_ns, 950.5e3);
        let markdown = install_markdown(&rounds);
        assert!(
            markdown.contains("native 950.50 us, ovs-ofctl 112.00 ms, **117.83x**"),
            "{markdown}"
        );
        assert_eq!(parse_debug_duration("900ns"), Some(900.0));
        assert_eq!(parse_debug_duration("ms"), None);
        assert_eq!(parse_debug_duration("NaNs"), None);
    }

    proptest! {
        #[test]
        fn estimate_parsing_never_panics(a in ".{0,100}", b in ".{0,100}") {
            let _ = parse_estimate(&a, &b);
        }

        #[test]
        fn install_output_parsing_never_panics(text in "(round [0-9]{1,3}: native [0-9.]{1,6}(ms|s|µs)? .{0,20}\n){0,4}") {
            let _ = parse_install_rounds(&text);
        }
    }
}
