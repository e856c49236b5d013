//! Exports `SLUICE_REVISION`, the git commit the binary was built from
//! (`sluice_role_metrics::REVISION`, re-exported by `sluice-admin`): the `revision` label of
//! `sluice_build_info` on every role, and what `sluice --version` can print. One build script
//! for the workspace, here because every role links this crate. "unknown" when built outside a
//! git checkout (a source tarball) or without git.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn main() {
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SLUICE_REVISION={revision}");
    // Rebuilt when HEAD moves: HEAD itself (checkout), the branch it points to (commit) and
    // packed refs (gc), not on every source change.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!(
            "cargo:rerun-if-changed={}",
            dir.join("packed-refs").display()
        );
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(branch).display());
        }
    }
    println!("cargo:rerun-if-env-changed=SLUICE_REVISION");
}
