//! The `sluice` binary: one executable, one subcommand per role.

mod cli;
mod daemon;
mod logging;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::CheckConfig { file } => match sluice_config::load_file(&file) {
            Ok(_) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error}");
                eprintln!("{} error(s) in {}", error.errors.len(), error.origin);
                ExitCode::from(2)
            }
        },
        cli::Command::Run { config, runtime } => {
            let loaded = sluice_config::load_file(&config);
            daemon::run_with(
                loaded,
                &runtime,
                cli.addresses_file.as_deref(),
                daemon::Mode::Run,
            )
        }
        cli::Command::Up {
            runtime,
            ephemeral_ports,
        } => {
            let loaded = sluice_config::Config::embedded_defaults().map(|mut config| {
                if ephemeral_ports {
                    config.listeners.admin.address.set_port(0);
                }
                config
            });
            daemon::run_with(
                loaded,
                &runtime,
                cli.addresses_file.as_deref(),
                daemon::Mode::Up,
            )
        }
    }
}
