//! Putting our two programs on an interface's hooks and taking them off, TCX or netlink, so
//! that a hook never carries two of ours: before attaching, whatever an earlier instance left on
//! the hook under our program's name is removed (a TCX link of a process still alive or pinned;
//! a netlink filter, which outlives its process).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;

use aya::programs::tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcHandle};
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::util::KernelVersion;

use crate::layout::Direction;
use crate::tcx;
use crate::EbpfError;

/// How programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// TCX on Linux >= 6.6, netlink (clsact qdisc + filter) before.
    Auto,
    /// fd-owned TCX links: they go when the process dies, however it dies.
    Tcx,
    /// A clsact qdisc and a direct-action `bpf` filter per hook, found again by name.
    Netlink,
}

impl AttachMode {
    /// `Auto` decided for this kernel.
    pub(crate) fn resolve(self) -> AttachMode {
        match self {
            AttachMode::Auto => {
                let tcx = KernelVersion::current()
                    .map(|version| version >= KernelVersion::new(6, 6, 0))
                    .unwrap_or(false);
                if tcx {
                    AttachMode::Tcx
                } else {
                    AttachMode::Netlink
                }
            }
            mode => mode,
        }
    }
}

pub(crate) fn attach_type(direction: Direction) -> TcAttachType {
    match direction {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    }
}

fn tcx_attach_type(direction: Direction) -> u32 {
    match direction {
        Direction::Ingress => tcx::BPF_TCX_INGRESS,
        Direction::Egress => tcx::BPF_TCX_EGRESS,
    }
}

fn hook_error<'a>(
    action: &'static str,
    direction: Direction,
    interface: &'a str,
) -> impl FnOnce(io::Error) -> EbpfError + 'a {
    move |source| EbpfError::Hook {
        action,
        program: direction.program(),
        interface: interface.to_string(),
        source,
    }
}

/// Removes what an earlier instance left of `direction`'s program on the hook.
pub(crate) fn clear_previous(
    mode: AttachMode,
    interface: &str,
    ifindex: u32,
    direction: Direction,
    own_program_id: u32,
) -> Result<(), EbpfError> {
    let error = hook_error("clearing an earlier", direction, interface);
    if mode == AttachMode::Netlink {
        match tc::qdisc_add_clsact(interface) {
            Ok(()) => {}
            Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(error(io::Error::other(e))),
        }
        return match tc::qdisc_detach_program(
            interface,
            attach_type(direction),
            direction.program(),
        ) {
            Ok(()) => Ok(()),
            Err(tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(error(io::Error::other(e))),
        };
    }
    let ours = programs_named(direction.program());
    for (program_id, link_id) in tcx::query(ifindex, tcx_attach_type(direction))
        .map_err(hook_error("listing", direction, interface))?
    {
        if program_id != own_program_id && ours.contains(&program_id) && link_id != 0 {
            tcx::detach_link(link_id).map_err(hook_error(
                "detaching an earlier",
                direction,
                interface,
            ))?;
        }
    }
    Ok(())
}

/// Ids of every loaded program called `name` (ours, from this or an earlier instance).
fn programs_named(name: &str) -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|info| info.name_as_str() == Some(name))
        .map(|info| info.id())
        .collect()
}

pub(crate) fn attach(
    program: &mut SchedClassifier,
    mode: AttachMode,
    interface: &str,
    direction: Direction,
    own_program_id: u32,
) -> Result<SchedClassifierLinkId, EbpfError> {
    let options = match mode {
        // The filter's handle is the program's id: an earlier instance that detaches its own
        // filter later (by priority and handle) cannot hit ours, which took its place.
        AttachMode::Netlink => TcAttachOptions::Netlink(NlOptions {
            handle: TcHandle::from(own_program_id),
            ..NlOptions::default()
        }),
        _ => TcAttachOptions::TcxOrder(LinkOrder::default()),
    };
    program
        .attach_with_options(interface, attach_type(direction), options)
        .map_err(|e| hook_error("attaching", direction, interface)(io::Error::other(e)))
}

/// The network namespace the interfaces live in: map keys carry ifindexes, which are unique
/// only within one namespace, and netlink filters must be removed from the namespace they are
/// in, whichever thread drops the counters.
#[derive(Debug)]
pub(crate) struct Namespace {
    inode: u64,
    file: File,
}

const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

impl Namespace {
    pub(crate) fn current() -> io::Result<Self> {
        let file = File::open(THREAD_NETNS)?;
        let inode = file.metadata()?.ino();
        Ok(Self { inode, file })
    }

    pub(crate) fn is_current(&self) -> io::Result<bool> {
        Ok(std::fs::metadata(THREAD_NETNS)?.ino() == self.inode)
    }

    /// Runs `body` in this namespace: here when the calling thread is in it, else on a scoped
    /// thread that enters it first (setns(2) moves only the calling thread).
    pub(crate) fn run<T: Send>(&self, body: impl FnOnce() -> T + Send) -> io::Result<T> {
        if self.is_current()? {
            return Ok(body());
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    use std::os::fd::AsRawFd;
                    // SAFETY: setns(2) on an open namespace file; it moves only this thread,
                    // which ends with the scope.
                    if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(body())
                })
                .join()
                .map_err(|_| io::Error::other("the thread entering the namespace panicked"))?
        })
    }
}

/// The calling thread's index of `interface`.
pub(crate) fn ifindex(interface: &str) -> Result<u32, EbpfError> {
    let name = std::ffi::CString::new(interface).map_err(|e| EbpfError::Interface {
        interface: interface.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e),
    })?;
    // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(EbpfError::Interface {
            interface: interface.to_string(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(index)
}

/// The names of the programs on `interface`'s TCX ingress and egress hooks (in the calling
/// thread's network namespace), in run order, whoever attached them: how a test or an operator
/// tells that exactly one of ours sits on each hook. TCX hooks only (kernels >= 6.6); programs
/// attached through the clsact qdisc show in `tc filter show` instead.
pub fn tcx_programs(interface: &str) -> Result<(Vec<String>, Vec<String>), EbpfError> {
    let names = |hook: TcAttachType| -> Result<Vec<String>, EbpfError> {
        let (_, programs) =
            SchedClassifier::query_tcx(interface, hook).map_err(|error| EbpfError::Program {
                program: "query_tcx",
                source: error,
            })?;
        Ok(programs
            .iter()
            .map(|info| info.name_as_str().unwrap_or("?").to_string())
            .collect())
    };
    Ok((names(TcAttachType::Ingress)?, names(TcAttachType::Egress)?))
}
