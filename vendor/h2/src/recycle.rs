//! Sluice: the boxes that hold a HEADERS frame (`frame::Frame::Headers`) and a received head
//! (`proto::streams::recv::Event::Headers`), kept per thread and reused.
//!
//! Both are boxed so that a frame or a receive event is sized by DATA rather than by a header
//! block: every frame is moved through the stream queues several times, and a tunnel node spent
//! most of its `memcpy` moving 296-byte frames that carried 40 bytes of DATA. Reusing the boxes
//! keeps a request's HEADERS from costing allocations it did not cost before.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::thread::LocalKey;

use crate::frame::Headers;
use crate::proto::peer::PollMessage;

/// Empty boxes kept per thread and kind: enough for the HEADERS frames a burst of streams has
/// in flight between being made and being consumed.
const KEPT: usize = 32;

type Free<T> = RefCell<Vec<Box<MaybeUninit<T>>>>;

thread_local! {
    static HEADERS: Free<Headers> = const { RefCell::new(Vec::new()) };
    static HEADS: Free<PollMessage> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn boxed_headers(value: Headers) -> Box<Headers> {
    boxed(&HEADERS, value)
}

pub(crate) fn unboxed_headers(value: Box<Headers>) -> Headers {
    unboxed(&HEADERS, value)
}

pub(crate) fn boxed_head(value: PollMessage) -> Box<PollMessage> {
    boxed(&HEADS, value)
}

pub(crate) fn unboxed_head(value: Box<PollMessage>) -> PollMessage {
    unboxed(&HEADS, value)
}

fn boxed<T: 'static>(free: &'static LocalKey<Free<T>>, value: T) -> Box<T> {
    let empty = free
        .try_with(|free| free.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::new(MaybeUninit::uninit()));
    let raw = Box::into_raw(empty).cast::<T>();
    // SAFETY: `raw` is a live allocation with `T`'s layout (`MaybeUninit<T>` has it), written
    // once here, then owned again as an initialized `Box<T>`.
    unsafe {
        raw.write(value);
        Box::from_raw(raw)
    }
}

fn unboxed<T: 'static>(free: &'static LocalKey<Free<T>>, value: Box<T>) -> T {
    let raw = Box::into_raw(value);
    // SAFETY: `raw` came from a `Box<T>`, so it is valid, aligned and initialized. It is read
    // once, and the allocation is then owned as an uninitialized `MaybeUninit<T>` of the same
    // layout, whose drop frees it without dropping a `T` again.
    let (value, empty) = unsafe { (raw.read(), Box::from_raw(raw.cast::<MaybeUninit<T>>())) };
    let _ = free.try_with(move |free| {
        let mut free = free.borrow_mut();
        if free.len() < KEPT {
            free.push(empty);
        }
    });
    value
}

