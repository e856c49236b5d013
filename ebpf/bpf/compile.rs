//! How the checked-in BPF object is built: shared by `build.rs`, the regeneration test and
//! `cargo run -p sluice-ebpf --example regenerate`, so the three can never disagree on flags.

// Each of the three uses a part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C source and the checked-in object, relative to the crate's folder.
pub const SOURCE: &str = "bpf/counters.bpf.c";
pub const HEADER: &str = "bpf/counters.h";
pub const OBJECT: &str = "bpf/counters.bpf.o";

/// Whether a `clang` is on PATH.
pub fn clang_available() -> bool {
    Command::new("clang")
        .arg("--version")
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false)
}

/// The clang version line, for messages about a differing object.
pub fn clang_version() -> String {
    Command::new("clang")
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_string))
        .unwrap_or_else(|| "clang (version unknown)".to_string())
}

/// Compiles the C source of the crate at `crate_dir` into `out`.
///
/// Run from the crate's folder with a relative source path, and with the folder mapped to `.`
/// in debug info: the object (DWARF and BTF line info) then does not depend on where the
/// checkout is. `asm/types.h` lives in Debian's multiarch folder, which `-target bpf` does not
/// search by itself.
pub fn compile(crate_dir: &Path, out: &Path) -> Result<(), String> {
    let dir = crate_dir.display().to_string();
    let multiarch: PathBuf = [
        "/usr/include",
        &format!("{}-linux-gnu", std::env::consts::ARCH),
    ]
    .iter()
    .collect();
    let output = Command::new("clang")
        .current_dir(crate_dir)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{}", multiarch.display()))
        .arg(format!("-fdebug-prefix-map={dir}=."))
        .arg(format!("-ffile-prefix-map={dir}=."))
        .args(["-c", SOURCE, "-o"])
        .arg(out)
        .output()
        .map_err(|e| format!("running clang: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "clang failed on {SOURCE}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
