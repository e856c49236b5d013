//! Which metric names Sluice's code registers, read from its sources: how the tests of the
//! alerting rules and dashboards catch a misspelt or renamed metric even where a query would
//! still answer (`... or vector(0)`, a family with no samples yet).

use std::path::{Path, PathBuf};

use crate::workspace_root;

/// The text of every non-test Rust source of the crates that register metrics.
pub fn registering_sources() -> String {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in [
        "dataplane",
        "controlplane",
        "vm-datapath",
        "ebpf",
        "foundation",
        "sluice/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files
        .iter()
        .filter(|path| !path.components().any(|part| part.as_os_str() == "tests"))
        .map(|path| std::fs::read_to_string(path).unwrap_or_default())
        .collect()
}

/// Whether `sample_name` (as written in a query: `_total`, `_bucket`, `_sum`, `_count` allowed)
/// belongs to a family the sources register (a `"family"` string literal).
pub fn is_registered(sources: &str, sample_name: &str) -> bool {
    let family = ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| sample_name.strip_suffix(suffix))
        .unwrap_or(sample_name);
    sources.contains(&format!("\"{family}\"")) || sources.contains(&format!("\"{sample_name}\""))
}

/// Every `sluice_*` name in `text`.
pub fn sluice_names(text: &str) -> std::collections::BTreeSet<String> {
    text.match_indices("sluice_")
        .map(|(start, _)| {
            text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}
