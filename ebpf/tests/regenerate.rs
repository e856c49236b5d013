//! The checked-in object is exactly what the C source compiles to (same flags as build.rs).

#[path = "../bpf/compile.rs"]
mod compile;

use std::path::Path;

#[test]
fn checked_in_object_matches_a_fresh_build() {
    if !test_support::prerequisite(
        "clang",
        compile::clang_available(),
        "scripts/test.sh installs it: apt-get install clang llvm",
    ) {
        return;
    }
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("sluice-ebpf-regen-{}.o", std::process::id()));
    let built = compile::compile(crate_dir, &out);
    let fresh = std::fs::read(&out);
    let _ = std::fs::remove_file(&out);
    if let Err(message) = built {
        panic!("{message}");
    }
    let fresh = fresh.expect("clang wrote the object");
    let checked_in = std::fs::read(crate_dir.join(compile::OBJECT)).expect("the checked-in object");
    assert!(
        fresh == checked_in,
        "ebpf/{} ({} bytes) differs from a fresh build of ebpf/{} with {} ({} bytes): run \
         `cargo run -p sluice-ebpf --example regenerate` and commit the object",
        compile::OBJECT,
        checked_in.len(),
        compile::SOURCE,
        compile::clang_version(),
        fresh.len()
    );
}
