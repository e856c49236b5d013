//! Rebuilds the checked-in BPF object from its C source:
//! `cargo run -p sluice-ebpf --example regenerate`, then commit `ebpf/bpf/counters.bpf.o`.

#[path = "../bpf/compile.rs"]
mod compile;

use std::path::Path;

fn main() -> Result<(), String> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let object = crate_dir.join(compile::OBJECT);
    compile::compile(crate_dir, &object)?;
    println!(
        "wrote {} with {}",
        object.display(),
        compile::clang_version()
    );
    Ok(())
}
