//! The one error type of the eBPF layer. Callers log it once, publish `sluice_ebpf_enabled 0`
//! and keep running: nothing here is fatal to the daemon.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The object did not load (no BPF syscall, no CAP_BPF, a map the kernel refused).
    #[error("loading the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    /// The verifier refused a program: its log says why.
    #[error("the kernel refused program {program}: {error}\nverifier log:\n{log}")]
    Verifier {
        program: &'static str,
        error: io::Error,
        log: String,
    },
    /// Any other step of preparing a program.
    #[error("program {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{count} listeners: the programs count at most {max}")]
    TooManyListeners { count: usize, max: usize },
    #[error("listeners {first} and {second} both claim port {port}")]
    DuplicateListenerPort {
        first: String,
        second: String,
        port: u16,
    },
    #[error("interface {interface}: {source}")]
    Interface {
        interface: String,
        #[source]
        source: io::Error,
    },
    /// Attaching to (or detaching from) one hook failed.
    #[error("{action} {program} on {interface}: {source}")]
    Hook {
        action: &'static str,
        program: &'static str,
        interface: String,
        #[source]
        source: io::Error,
    },
    /// Map keys carry ifindexes, unique only within one network namespace.
    #[error(
        "interface {interface} is in another network namespace than the interfaces already attached"
    )]
    OtherNamespace { interface: String },
    #[error("interface {0} is not attached")]
    NotAttached(String),
}

impl EbpfError {
    /// Turns a program load failure into `Verifier` (with the log) when the verifier spoke.
    pub(crate) fn program(program: &'static str, source: aya::programs::ProgramError) -> Self {
        match source {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => EbpfError::Verifier {
                program,
                error: io_error,
                log: verifier_log.to_string(),
            },
            source => EbpfError::Program { program, source },
        }
    }

    pub(crate) fn map(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |source| EbpfError::Map { map, source }
    }
}
