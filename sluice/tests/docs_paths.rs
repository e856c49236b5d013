//! The map a newcomer reads first stays true: every back-ticked repository path in the
//! repository's Markdown (README, CONTRIBUTING, docs/, folder READMEs) exists, and every crate
//! of the workspace is named in its folder's README. A moved file or crate fails this test in
//! the commit that moved it, not weeks later in a reader's hands.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Paths the docs name that are made by running something, not checked in.
const GENERATED: [&str; 1] = ["perf/results/"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the binary crate sits in the workspace")
        .to_path_buf()
}

/// Markdown files git tracks (so a scratch note in a working tree is not judged).
fn tracked_markdown(root: &Path) -> Vec<PathBuf> {
    let output = Command::new("git")
        .args(["ls-files", "-z", "--", "*.md"])
        .current_dir(root)
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git ls-files failed");
    output
        .stdout
        .split(|byte| *byte == 0)
        .filter(|name| !name.is_empty())
        .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
        .collect()
}

/// The back-ticked spans of `text` that read as a path inside the repository: no spaces, a
/// slash, relative, no URL or pattern characters. A `:line`, `:a-b` or `::test_name` suffix is
/// cut off.
fn path_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| !span.contains('\n') && !span.contains(' '))
        .filter(|span| span.contains('/') && !span.starts_with('/') && !span.starts_with('.'))
        .filter(|span| !span.contains("://"))
        .filter(|span| !span.chars().any(|c| "*<>{}$|=~?,;()[]@'\"".contains(c)))
        .map(|span| {
            let span = span.split("::").next().unwrap_or(span);
            match span.split_once(':') {
                Some((path, line))
                    if line.chars().all(|c| c.is_ascii_digit() || "-/".contains(c)) =>
                {
                    path.to_string()
                }
                _ => span.to_string(),
            }
        })
        .collect()
}

/// Where `span` (found in `doc`) would be if it names a repository path: from the root when
/// its first component is a top-level folder, or beside the doc when its first component is
/// there. `None`: not a repository path (a URL path, a Kubernetes group, ...).
fn candidates(root: &Path, doc: &Path, span: &str) -> Vec<PathBuf> {
    let first = span.split('/').next().unwrap_or_default();
    let mut found = Vec::new();
    if !first.is_empty() && root.join(first).is_dir() {
        found.push(root.join(span));
    }
    let beside = root.join(doc).parent().map(Path::to_path_buf);
    if let Some(dir) = beside.filter(|dir| dir != root) {
        if !first.is_empty() && dir.join(first).exists() {
            found.push(dir.join(span));
        }
    }
    found
}

/// The spans of one doc that look like repository paths but name nothing.
fn missing_paths(root: &Path, doc: &Path, text: &str) -> Vec<String> {
    path_spans(text)
        .into_iter()
        .filter(|span| !GENERATED.iter().any(|prefix| span.starts_with(prefix)))
        .filter(|span| {
            let places = candidates(root, doc, span);
            !places.is_empty() && !places.iter().any(|place| place.exists())
        })
        .collect()
}

#[test]
fn every_back_ticked_repository_path_in_the_docs_exists() {
    let root = workspace_root();
    let docs = tracked_markdown(&root);
    assert!(docs.len() >= 15, "found only {docs:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).expect("a tracked doc reads");
        checked += path_spans(&text).len();
        for span in missing_paths(&root, doc, &text) {
            missing.push(format!("{}: `{span}`", doc.display()));
        }
    }
    assert!(
        checked >= 200,
        "only {checked} path spans read: is the extraction broken?"
    );
    assert!(
        missing.is_empty(),
        "these docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_planted_bad_path_is_caught_and_good_ones_pass() {
    let root = workspace_root();
    let doc = Path::new("docs/ARCHITECTURE.md");
    let text =
        "See `dataplane/gateway-proxy/src/pool.rs:78-99`, `sluice/tests/gateway.rs::a_test`, \
                `src/lib.rs` (no such folder beside this doc, so not judged), `/readyz`, \
                `proxy.sluice.dev/v1alpha1`, `perf/results/gateway/` and the planted \
                `dataplane/gateway-proxy/src/no_such_module.rs:12` and `foundation/gone/`.";
    assert_eq!(
        missing_paths(&root, doc, text),
        [
            "dataplane/gateway-proxy/src/no_such_module.rs",
            "foundation/gone/"
        ]
    );
    // Beside a folder README, a path relative to that folder is judged there.
    let folder_doc = Path::new("dataplane/gateway-proxy/README.md");
    assert_eq!(
        missing_paths(&root, folder_doc, "`src/pool.rs` and `src/not_here.rs`"),
        ["src/not_here.rs"]
    );
}

#[test]
fn every_crate_is_named_in_its_folders_readme() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let members: Vec<&str> = manifest
        .lines()
        .skip_while(|line| !line.starts_with("members"))
        .skip(1)
        .take_while(|line| !line.starts_with(']'))
        .filter_map(|line| line.trim().trim_end_matches(',').strip_prefix('"'))
        .filter_map(|line| line.strip_suffix('"'))
        .collect();
    assert!(members.len() >= 25, "{members:?}");
    let mut unnamed = Vec::new();
    for member in members {
        let Some((folder, sub)) = member.split_once('/') else {
            continue;
        };
        let readme = root.join(folder).join("README.md");
        let text = std::fs::read_to_string(&readme)
            .unwrap_or_else(|_| panic!("{folder}/ holds crates but has no README.md"));
        if !text.contains(&format!("`{sub}")) && !text.contains(member) {
            unnamed.push(format!("{member} is not named in {folder}/README.md"));
        }
    }
    assert!(unnamed.is_empty(), "{}", unnamed.join("\n"));
}
