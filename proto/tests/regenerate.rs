//! The generated code in `src/gen/` must match the `.proto` files. protox compiles them in pure
//! Rust, so neither building nor this test needs `protoc`.
//!
//! After editing a `.proto`: `SLUICE_REGENERATE_PROTO=1 cargo test -p sluice-proto --test regenerate`.

use std::path::{Path, PathBuf};

const PROTOS: [&str; 3] = [
    "sluice/tunnel/v1/tunnel.proto",
    "sluice/agents/v1/agents.proto",
    "sluice/kubernetes/v1/kubernetes.proto",
];

fn generate(into: &Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = protox::compile(PROTOS, [&root]).expect("the .proto files compile");
    prost_build::Config::new()
        .out_dir(into)
        .bytes(["."])
        .compile_fds(files)
        .expect("prost-build generates code");
}

#[test]
fn checked_in_code_matches_the_proto_files() {
    let checked_in = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gen");
    if std::env::var_os("SLUICE_REGENERATE_PROTO").is_some() {
        generate(&checked_in);
        return;
    }
    let fresh = tempfile::tempdir().expect("temp dir");
    generate(fresh.path());
    for name in [
        "sluice.tunnel.v1.rs",
        "sluice.agents.v1.rs",
        "sluice.kubernetes.v1.rs",
    ] {
        let expected = std::fs::read_to_string(fresh.path().join(name)).expect("generated");
        let actual = std::fs::read_to_string(checked_in.join(name)).unwrap_or_default();
        assert!(
            expected == actual,
            "proto/src/gen/{name} is stale; run SLUICE_REGENERATE_PROTO=1 cargo test -p sluice-proto --test regenerate"
        );
    }
}
