//! The `sluice` binary: one executable, one subcommand per role.

mod call_cmd;
mod cli;
mod controlplane;
mod daemon;
#[cfg(feature = "demo")]
mod demo;
mod logging;
#[cfg(test)]
mod mutation;
mod notify;
mod policy_cmd;
mod status_cmd;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (and what it starts).
///
/// Why: mimalloc asks the kernel for huge pages (`MADV_HUGEPAGE`) on the arenas it commits
/// up front, so every thread that allocates at all makes a whole 2 MiB page resident, and a
/// connection's few KiB land on huge pages that are then only partly used. Measured on the
/// gateway (docs/PERFORMANCE.md, "Issue 17: memory"): 25 MiB resident idle and 72-77 MiB with
/// 512 HTTP/2 clients connected, against 18-19 and 47-51 MiB with the flag set in `main`, at the
/// same CPU per request. A proxy's heap is many small, short-lived blocks spread over worker
/// threads, where huge pages buy little TLB reach and cost resident memory.
///
/// It runs from `.init_array`, before the Rust runtime's start-up: set in `main`, the flag came
/// after the runtime's own first allocations had already made mimalloc's first arena two huge
/// pages (4 MiB of `AnonHugePages` kept for the process's life; "Issue 17: the first arena in
/// small pages"). The errno of a refusal is kept for `main` to report, since nothing should print
/// before the runtime is up.
extern "C" fn keep_memory_in_small_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and reads or writes none of our memory.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
        THP_REFUSED.store(errno, std::sync::atomic::Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static RUN_BEFORE_THE_RUNTIME: extern "C" fn() = keep_memory_in_small_pages;

/// The errno with which the kernel refused PR_SET_THP_DISABLE (0: it did not).
static THP_REFUSED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn report_huge_pages_refused() {
    let errno = THP_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    if errno != 0 {
        // Kernels before 3.15 lack the flag: memory use is then as before, nothing breaks.
        eprintln!(
            "note: transparent huge pages stay on ({})",
            std::io::Error::from_raw_os_error(errno)
        );
    }
}

/// `sluice man --out-dir DIR`: the pages a package installs, from the same definition as
/// `--help`, so they cannot drift from the flags.
fn man_pages(out_dir: &std::path::Path) -> ExitCode {
    let command = <cli::Cli as clap::CommandFactory>::command();
    let written =
        std::fs::create_dir_all(out_dir).and_then(|()| clap_mangen::generate_to(command, out_dir));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice man: cannot write to {}: {error}", out_dir.display());
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    report_huge_pages_refused();
    // Header strings leave as raw literals, as HAProxy writes them: Huffman coding cost a
    // table walk per byte of every value not in the dynamic table, here and in the peer's
    // decoder (issue 37; docs/PERFORMANCE.md, "HPACK without Huffman").
    h2::set_huffman_encoding(false);
    let cli = cli::Cli::parse();
    // Given after the subcommand, or (as earlier versions took it) before.
    let before = cli.addresses_file;
    let addresses = |arg: cli::AddressesArg| arg.addresses_file.or(before.clone());
    match cli.command {
        cli::Command::Status { admin, ca, timeout } => {
            let transport = ca.unwrap_or(status_cmd::Transport::Http);
            not_ready_apart(status_cmd::run(admin, &transport, timeout))
        }
        cli::Command::Call(args) => call_cmd::run(*args),
        cli::Command::CheckConfig { file } => check_config(&file),
        cli::Command::Completions { shell } => {
            let mut command = <cli::Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "sluice", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        cli::Command::Man { out_dir } => man_pages(&out_dir),
        cli::Command::Policy {
            command: cli::PolicyCommand::Compile { file },
        } => policy_cmd::compile(&file),
        cli::Command::VmAgent(args) => vm_agent(args),
        cli::Command::Controlplane {
            command: Some(cli::ControlplaneCommand::Token { command }),
            ..
        } => token(command),
        cli::Command::Controlplane {
            command: None,
            mut serve,
        } => {
            let file = addresses(std::mem::replace(
                &mut serve.addresses,
                cli::AddressesArg {
                    addresses_file: None,
                },
            ));
            controlplane(serve, file.as_deref())
        }
        cli::Command::Run {
            config,
            runtime,
            advertise_address,
            addresses: file,
        } => daemon::run_with(
            daemon::load(&config),
            &daemon::CommandLine {
                runtime,
                advertise_address,
            },
            addresses(file).as_deref(),
            daemon::Mode::Run { config },
        ),
        cli::Command::Agent {
            config,
            runtime,
            addresses: file,
        } => daemon::run_with(
            load_agent_config(&config),
            &runtime.into(),
            addresses(file).as_deref(),
            daemon::Mode::Run { config },
        ),
        cli::Command::Up {
            runtime,
            ephemeral_ports,
            nodes,
            log_format,
            addresses: file,
        } => up(
            &runtime,
            (ephemeral_ports, nodes),
            log_format.format(),
            addresses(file).as_deref(),
        ),
    }
}

/// Exit code of `sluice status` when the role answered but is not ready: apart from 2, which
/// the command line's usage errors (and invalid configurations) exit with, so a script can
/// tell "not ready yet" from "called wrongly" (docs/OPERATIONS.md, "Exit codes").
const EXIT_NOT_READY: u8 = 3;

/// `status_cmd` ends a not-ready role with 2; that becomes [`EXIT_NOT_READY`].
fn not_ready_apart(code: ExitCode) -> ExitCode {
    if code == ExitCode::from(2) {
        ExitCode::from(EXIT_NOT_READY)
    } else {
        code
    }
}

/// `sluice check-config FILE`: "ok", or every error and exit 2. It loads what a start loads
/// (`daemon::load`), so a file it passes is not refused by `run`.
fn check_config(file: &std::path::Path) -> ExitCode {
    match daemon::load(file) {
        Ok(_) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            eprintln!("{} error(s) in {}", error.errors.len(), error.origin);
            ExitCode::from(2)
        }
    }
}

fn vm_agent(args: cli::VmAgentArgs) -> ExitCode {
    logging::init(&sluice_config::LoggingConfig {
        format: args.log_format.format(),
        level: "info".to_string(),
    });
    match sluice_vm_agent::run(args.options()) {
        Ok(()) => ExitCode::SUCCESS,
        // Through the log, so a JSON log stays one JSON object per line to its end.
        Err(error) => {
            tracing::error!("sluice vm-agent: {error}");
            ExitCode::FAILURE
        }
    }
}

fn token(command: cli::TokenCommand) -> ExitCode {
    let cli::TokenCommand::Create {
        role,
        subject,
        kubeconfig,
        data_dir,
    } = command;
    let kubeconfig = kubeconfig.unwrap_or_else(|| data_dir.join("admin.kubeconfig"));
    match controlplane::create_token(&kubeconfig, &role, &subject) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sluice controlplane token create: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn controlplane(
    serve: cli::ControlplaneArgs,
    addresses_file: Option<&std::path::Path>,
) -> ExitCode {
    logging::init(&serve.logging());
    match serve.options() {
        Ok(options) => controlplane::run(options, addresses_file),
        Err(error) => {
            eprintln!("sluice controlplane: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(not(feature = "demo"))]
fn up(
    _runtime: &cli::RuntimeArgs,
    _ports_and_nodes: (bool, u8),
    _log_format: sluice_config::LogFormat,
    _addresses_file: Option<&std::path::Path>,
) -> ExitCode {
    eprintln!("sluice up: this binary was built without the `demo` feature");
    ExitCode::FAILURE
}

#[cfg(feature = "demo")]
fn up(
    runtime: &cli::RuntimeArgs,
    (ephemeral_ports, nodes): (bool, u8),
    log_format: sluice_config::LogFormat,
    addresses_file: Option<&std::path::Path>,
) -> ExitCode {
    let prepared = if nodes > 1 {
        demo::UpDemo::prepare_cluster(usize::from(nodes), ephemeral_ports)
    } else {
        demo::UpDemo::prepare(ephemeral_ports)
    };
    match prepared {
        Ok((mut config, demo)) => daemon::run_with(
            {
                config.logging.format = log_format;
                Ok(config)
            },
            &runtime.clone().into(),
            addresses_file,
            daemon::Mode::Up(Box::new(demo)),
        ),
        Err(error) => {
            eprintln!("sluice up: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `sluice agent` refuses a config without an `agent` section.
fn load_agent_config(
    path: &std::path::Path,
) -> Result<sluice_config::Config, sluice_config::InvalidConfig> {
    let loaded = daemon::load(path)?;
    if loaded.agent.is_some() {
        Ok(loaded)
    } else {
        Err(sluice_config::InvalidConfig::one(
            path.display().to_string(),
            "agent",
            "`sluice agent` needs an agent section",
        ))
    }
}
