//! A global allocator that counts the allocations of the thread that asked for a count, so the
//! other tests of the same binary, on their threads, do not disturb it. A test binary installs
//! it with `#[global_allocator] static GLOBAL: HookedAllocator = THREAD_ALLOCATIONS;` and wraps
//! what it measures in [`counted`] (`dataplane/gateway-proxy/src/no_allocation.rs`,
//! `controlplane/watch-client/tests/publication_cost.rs`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, calling a hook on every allocation and reallocation: the counting
/// of [`THREAD_ALLOCATIONS`], or a test's own (`dataplane/gateway-proxy/tests/
/// request_allocations.rs` counts one worker thread and traces where its allocations come
/// from). The hook must not allocate, unless it stops its own calls from counting.
pub struct HookedAllocator {
    hook: fn(),
}

impl HookedAllocator {
    /// # Safety
    /// `hook` runs inside the global allocator: it must not panic (an allocator may not
    /// unwind), and any allocation it makes must not call it again without end.
    pub const unsafe fn new(hook: fn()) -> Self {
        Self { hook }
    }
}

// SAFETY: forwards to the system allocator unchanged; only calls the hook, which the caller of
// `new` promised neither panics nor recurses without end.
unsafe impl GlobalAlloc for HookedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        (self.hook)();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        (self.hook)();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

/// The allocator counting the calls of the threads inside [`counted`].
// SAFETY: `note_allocation` never panics (`try_with`) and never allocates.
pub const THREAD_ALLOCATIONS: HookedAllocator = unsafe { HookedAllocator::new(note_allocation) };

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Counts on the calling thread while it is inside [`counted`]; const thread-locals without
/// destructors, so counting itself never allocates.
fn note_allocation() {
    // `try_with`: an allocation during thread teardown must not panic in the allocator.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        }
    });
}

/// `work`'s result and how many allocations it made on this thread.
pub fn counted<T>(work: impl FnOnce() -> T) -> (T, usize) {
    ALLOCATIONS.with(|count| count.set(0));
    COUNTING.with(|counting| counting.set(true));
    let result = work();
    COUNTING.with(|counting| counting.set(false));
    (result, ALLOCATIONS.with(Cell::get))
}

/// `work`'s result, its allocations left out of the count.
pub fn uncounted<T>(work: impl FnOnce() -> T) -> T {
    let counting = COUNTING.with(|counting| counting.replace(false));
    let result = work();
    COUNTING.with(|flag| flag.set(counting));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: HookedAllocator = THREAD_ALLOCATIONS;

    #[test]
    fn only_this_threads_allocations_inside_counted_are_counted() {
        let (boxed, allocations) = counted(|| Box::new([7u8; 64]));
        assert_eq!((boxed[0], allocations), (7, 1));
        let (_, allocations) = counted(|| uncounted(|| vec![1u8; 16]));
        assert_eq!(allocations, 0);
        let ((), allocations) = counted(|| {
            std::thread::scope(|scope| {
                scope.spawn(|| (0..100u8).map(|i| vec![i; 16]).collect::<Vec<_>>());
            })
        });
        // The spawn itself allocates a few blocks here; the other thread's 101 are not counted.
        assert!(
            allocations < 50,
            "{allocations}: another thread's allocations counted"
        );
        let (_, outside) = counted(|| ());
        assert_eq!(outside, 0);
    }
}
