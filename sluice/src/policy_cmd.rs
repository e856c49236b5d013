//! `sluice policy compile FILE|DIR`: the flows a policy file (or a directory of them) compiles
//! to, one `ovs-ofctl` line each.

use std::path::Path;
use std::process::ExitCode;

use sluice_policy::compile::{compile_to_text, CompileOptions};

pub fn compile(file: &Path) -> ExitCode {
    let set = match sluice_policy::load::load_path(file) {
        Ok(set) => set,
        Err(error) => {
            eprintln!("{error}");
            eprintln!("{} error(s) in {}", error.error_count(), file.display());
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
