//! `sluice policy compile FILE`: the flows a policy file compiles to, one `ovs-ofctl` line each.

use std::path::Path;
use std::process::ExitCode;

use sluice_policy::compile::{compile_to_text, CompileOptions};

pub fn compile(file: &Path) -> ExitCode {
    let set = match sluice_policy::load::load_file(file) {
        Ok(set) => set,
        Err(error) => {
            eprintln!("{error}");
            eprintln!("{} error(s) in {}", error.errors.len(), error.origin);
            return ExitCode::from(2);
        }
    };
    match compile_to_text(&set, &CompileOptions::default()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", file.display());
            ExitCode::from(2)
        }
    }
}
