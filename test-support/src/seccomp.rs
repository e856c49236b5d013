//! Makes io_uring unavailable the way container runtimes do (Docker's default seccomp profile
//! blocks it): `io_uring_setup` fails with ENOSYS. Used to prove the epoll fallback for real.

use std::os::unix::process::CommandExt;
use std::process::Command;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};

fn io_uring_blocking_program() -> std::io::Result<BpfProgram> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|error| std::io::Error::other(format!("seccomp: {error:?}")))?;
    let filter = SeccompFilter::new(
        [(libc::SYS_io_uring_setup, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|error| std::io::Error::other(format!("seccomp: {error}")))?;
    filter
        .try_into()
        .map_err(|error| std::io::Error::other(format!("seccomp: {error:?}")))
}

/// Blocks `io_uring_setup` for the calling thread and every thread it spawns afterwards.
pub fn block_io_uring_in_this_thread() -> std::io::Result<()> {
    let program = io_uring_blocking_program()?;
    seccompiler::apply_filter(&program)
        .map_err(|error| std::io::Error::other(format!("seccomp: {error}")))
}

/// Blocks `io_uring_setup` in the process `command` will start.
pub fn block_io_uring_for_command(command: &mut Command) -> std::io::Result<()> {
    let program = io_uring_blocking_program()?;
    // SAFETY: the closure runs between fork and exec; it only makes the prctl/seccomp system
    // calls on a program compiled before the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            seccompiler::apply_filter(&program).map_err(|error| match error {
                seccompiler::Error::Prctl(errno) | seccompiler::Error::Seccomp(errno) => errno,
                _ => std::io::Error::from_raw_os_error(libc::EINVAL),
            })
        });
    }
    Ok(())
}
