//! Compiles the BPF C source when clang is there, as a check: the crate embeds the checked-in
//! object (`bpf/counters.bpf.o`), so a machine without clang builds Sluice all the same. A fresh
//! object that differs from the checked-in one is reported here as a warning and fails the
//! regeneration test (`tests/regenerate.rs`).

#[path = "bpf/compile.rs"]
mod compile;

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed={}", compile::SOURCE);
    println!("cargo:rerun-if-changed={}", compile::HEADER);
    println!("cargo:rerun-if-changed={}", compile::OBJECT);
    println!("cargo:rerun-if-env-changed=SLUICE_EBPF_SKIP_BUILD");
    if std::env::var_os("SLUICE_EBPF_SKIP_BUILD").is_some() || !compile::clang_available() {
        return;
    }
    let (Some(crate_dir), Some(out_dir)) = (
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::var_os("OUT_DIR").map(PathBuf::from),
    ) else {
        return;
    };
    let fresh = out_dir.join("counters.bpf.o");
    if let Err(message) = compile::compile(&crate_dir, &fresh) {
        // A C source that does not compile is a broken tree: fail the build with clang's words.
        eprintln!("{message}");
        std::process::exit(1);
    }
    let same = std::fs::read(&fresh).ok() == std::fs::read(crate_dir.join(compile::OBJECT)).ok();
    if !same {
        println!(
            "cargo:warning=ebpf/{} differs from a fresh build of {}: run `cargo run -p sluice-ebpf --example regenerate`",
            compile::OBJECT,
            compile::SOURCE
        );
    }
}
