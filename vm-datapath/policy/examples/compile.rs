//! `cargo run -p sluice-policy --example compile -- FILE`: prints the flows of a policy file
//! (the same text `sluice policy compile` prints).

use std::process::ExitCode;

use sluice_policy::compile::{compile_to_text, CompileOptions};
use sluice_policy::load::load_file;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: compile FILE");
        return ExitCode::from(2);
    };
    let set = match load_file(path.as_ref()) {
        Ok(set) => set,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    match compile_to_text(&set, &CompileOptions::default()) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}
