//! The three bpf(2) commands aya does not expose, used to take a hook over from a previous
//! instance: list the TCX links on one hook (BPF_PROG_QUERY with `link_ids`, Linux >= 6.6),
//! open a link by id and detach it (BPF_LINK_DETACH). Only links to programs with our own name
//! are ever touched (see `hooks.rs`).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;
pub(crate) const BPF_TCX_INGRESS: u32 = 46;
pub(crate) const BPF_TCX_EGRESS: u32 = 47;

/// Enough for the hooks we look at: the kernel reports ENOSPC past it and we then touch nothing.
const MAX_QUERY: usize = 64;

/// The `query` member of `union bpf_attr` (include/uapi/linux/bpf.h), 64 bytes.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    count: u32,
    pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// `{ program id, link id }` of every program attached to one TCX hook, in run order.
pub(crate) fn query(ifindex: u32, attach_type: u32) -> io::Result<Vec<(u32, u32)>> {
    let mut prog_ids = [0u32; MAX_QUERY];
    let mut link_ids = [0u32; MAX_QUERY];
    let mut attr = QueryAttr {
        target_ifindex: ifindex,
        attach_type,
        prog_ids: prog_ids.as_mut_ptr() as u64,
        count: MAX_QUERY as u32,
        link_ids: link_ids.as_mut_ptr() as u64,
        ..QueryAttr::default()
    };
    // SAFETY: `attr` is a correctly laid out bpf_attr prefix whose size we pass; the kernel
    // writes at most `count` u32s into each of the two arrays, which outlive the call.
    let result = unsafe { bpf(BPF_PROG_QUERY, &mut attr) };
    result?;
    let count = (attr.count as usize).min(MAX_QUERY);
    Ok(prog_ids[..count]
        .iter()
        .copied()
        .zip(link_ids[..count].iter().copied())
        .collect())
}

/// Detaches the TCX link `link_id` from its hook, whoever holds it (needs CAP_SYS_ADMIN).
pub(crate) fn detach_link(link_id: u32) -> io::Result<()> {
    let mut by_id = [link_id, 0, 0, 0];
    // SAFETY: the `link_id` member is a u32 at offset 0 of bpf_attr, followed by next_id and
    // open_flags, which stay zero.
    let fd = unsafe { bpf(BPF_LINK_GET_FD_BY_ID, &mut by_id) }?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    let link = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut detach = [fd as u32, 0];
    // SAFETY: the `link_detach` member is the link's fd (u32) at offset 0 of bpf_attr; `link`
    // keeps the fd open until after the call.
    let result = unsafe { bpf(BPF_LINK_DETACH, &mut detach) };
    drop(link);
    result.map(|_| ())
}

/// bpf(2) with one `union bpf_attr` member as `attr`.
///
/// # Safety
/// `T` must be laid out as the member of `union bpf_attr` that `command` reads, and every
/// pointer inside it must be valid for what the kernel writes there.
unsafe fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<i32> {
    // SAFETY: forwarded from the caller's contract; the size passed is the member's own.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn query_attr_matches_the_kernel_layout() {
        assert_eq!(size_of::<QueryAttr>(), 64);
        assert_eq!(offset_of!(QueryAttr, prog_ids), 16);
        assert_eq!(offset_of!(QueryAttr, count), 24);
        assert_eq!(offset_of!(QueryAttr, link_ids), 40);
        assert_eq!(offset_of!(QueryAttr, revision), 56);
    }
}
