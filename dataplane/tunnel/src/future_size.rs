//! The size of the future an `async fn` returns, read from its type without calling it. For the
//! tests that keep a task's future small: spawning copies all of it, and a task held for a
//! tunnel's life keeps all of it.

use std::future::Future;

pub(crate) fn of_four<A, B, C, D, F: Future>(_: fn(A, B, C, D) -> F) -> usize {
    std::mem::size_of::<F>()
}

pub(crate) fn of_five<A, B, C, D, E, F: Future>(_: fn(A, B, C, D, E) -> F) -> usize {
    std::mem::size_of::<F>()
}

pub(crate) fn of_six<A, B, C, D, E, G, F: Future>(_: fn(A, B, C, D, E, G) -> F) -> usize {
    std::mem::size_of::<F>()
}
