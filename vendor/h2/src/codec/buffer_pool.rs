//! Sluice patch: codec buffers taken from a per-thread pool while bytes move and handed back
//! once drained, so a quiet connection holds no read or write buffer.
//!
//! Upstream h2 gives every connection a 16 KiB write buffer and an 8 KiB read buffer for its
//! whole life. A server holding 100,000 mostly quiet connections (tunnel agents, watch
//! clients) pays 2.4 GB for buffers that are empty nearly all the time. Swapping whole buffers
//! through a small per-thread free list, as HAProxy does with its buffer pools, keeps the busy
//! path free of allocations: a connection that drains its buffer and asks for one again on the
//! same thread gets the same, cache-warm one back.

use bytes::BytesMut;
use std::cell::RefCell;

/// Capacity of a write buffer: a HEADERS frame of the minimum MAX_FRAME_SIZE always fits.
pub(crate) const WRITE_CAPACITY: usize = 16 * 1_024;

/// Capacity of a read buffer (tokio-util's `FramedRead` starts with the same).
pub(crate) const READ_CAPACITY: usize = 8 * 1_024;

/// Capacity of HPACK's decoding scratch, into which Huffman-coded strings are decoded
/// (upstream's `hpack::Decoder::new` allocates the same for a connection's whole life).
pub(crate) const HPACK_CAPACITY: usize = 4 * 1_024;

/// Buffers of each kind a thread keeps for reuse; beyond that a drained buffer is freed. With
/// `GROWN_LIMIT` this bounds what a thread keeps to 7 MiB (1.75 MiB at nominal sizes).
const KEPT_PER_THREAD: usize = 64;

/// A buffer grown past this many times its nominal capacity (a large frame passed through) is
/// freed rather than kept.
const GROWN_LIMIT: usize = 4;

struct Pool {
    write: Vec<BytesMut>,
    read: Vec<BytesMut>,
    hpack: Vec<BytesMut>,
}

thread_local! {
    static POOL: RefCell<Pool> = const {
        RefCell::new(Pool {
            write: Vec::new(),
            read: Vec::new(),
            hpack: Vec::new(),
        })
    };
}

/// A buffer of `WRITE_CAPACITY` or more, empty.
pub(crate) fn take_write() -> BytesMut {
    take(|pool| &mut pool.write, WRITE_CAPACITY)
}

/// A buffer of `READ_CAPACITY` or more, empty.
pub(crate) fn take_read() -> BytesMut {
    take(|pool| &mut pool.read, READ_CAPACITY)
}

/// Hands a drained write buffer back; `buffer` is left empty with no capacity.
pub(crate) fn release_write(buffer: &mut BytesMut) {
    release(|pool| &mut pool.write, buffer, WRITE_CAPACITY)
}

/// Hands a drained read buffer back, unless frames split from it still share its allocation:
/// then it stays where it is (as upstream keeps it) and is released at a later quiet moment.
pub(crate) fn release_read(buffer: &mut BytesMut) {
    release(|pool| &mut pool.read, buffer, READ_CAPACITY)
}

/// A decoding scratch of `HPACK_CAPACITY` or more, empty.
pub(crate) fn take_hpack() -> BytesMut {
    take(|pool| &mut pool.hpack, HPACK_CAPACITY)
}

/// Hands HPACK's decoding scratch back, unless a decoded string still shares its allocation.
pub(crate) fn release_hpack(buffer: &mut BytesMut) {
    release(|pool| &mut pool.hpack, buffer, HPACK_CAPACITY)
}

fn take(kind: fn(&mut Pool) -> &mut Vec<BytesMut>, capacity: usize) -> BytesMut {
    POOL.try_with(|pool| kind(&mut pool.borrow_mut()).pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| BytesMut::with_capacity(capacity))
}

fn release(kind: fn(&mut Pool) -> &mut Vec<BytesMut>, buffer: &mut BytesMut, capacity: usize) {
    if !buffer.is_empty() || buffer.capacity() == 0 {
        return;
    }
    // `try_reclaim` moves an unshared buffer's start back to its allocation's start without
    // allocating; it fails while a frame still holds part of the allocation.
    if !buffer.try_reclaim(capacity) {
        return;
    }
    let buffer = std::mem::take(buffer);
    if buffer.capacity() > capacity * GROWN_LIMIT {
        return;
    }
    // `try_with` fails only while the thread is exiting: the buffer is then freed.
    let _ = POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        let kept = kind(&mut pool);
        if kept.len() < KEPT_PER_THREAD {
            kept.push(buffer);
        }
    });
}
