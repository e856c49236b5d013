//! What an idle served HTTP/2 connection holds on the heap (issue 36: a node holds one such
//! connection per tunnel agent, 100,000 of them is the goal). A counting allocator tallies the
//! server thread's live allocations by size class while 200 clients each keep one stream open
//! and quiet, on both drivers; `--nocapture` prints the classes.
//!
//! The bound asserted holds two claims: `gather.rs`'s, a quiet connection's pending read holds
//! no buffer of its own (it waited on a 16 KiB completion read before), and the h2 patch's
//! (vendor/README.md), a quiet connection holds neither its 16 KiB frame writer buffer nor its
//! 8 KiB frame reader buffer, nor its 4 KiB HPACK decoding scratch. What is left is h2's
//! connection state (HPACK tables, the stream store) and the connection's task.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use sluice_grpc::transport::{compat, connect, send_data, serve, H2Settings};

/// Counts the live bytes and blocks, by power-of-two size class, of threads that opted in.
struct Counting;

const CLASSES: usize = 40;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_BLOCKS: [AtomicIsize; CLASSES] = [const { AtomicIsize::new(0) }; CLASSES];

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn class(size: usize) -> usize {
    (usize::BITS - size.max(1).saturating_sub(1).leading_zeros()) as usize % CLASSES
}

fn tally(size: usize, sign: isize) {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        LIVE_BYTES.fetch_add(sign * size as isize, Ordering::Relaxed);
        LIVE_BLOCKS[class(size)].fetch_add(sign, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed to `System` unchanged; the tally touches only atomics and a
// const-initialised thread-local (no allocation inside the allocator).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tally(layout.size(), 1);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        tally(layout.size(), -1);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        tally(layout.size(), -1);
        tally(new_size, 1);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARM: usize = 20;
const IDLE: usize = 200;

/// The server thread's live bytes and blocks per class.
fn snapshot() -> (isize, Vec<isize>) {
    let blocks = LIVE_BLOCKS
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    (LIVE_BYTES.load(Ordering::Relaxed), blocks)
}

/// Serves every connection; each stream is answered (headers) and then held open, quiet.
fn start_server(legacy: bool) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        COUNTED.with(|c| c.set(true));
        block_on(legacy, async move {
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                monoio::spawn(async move {
                    let io = compat(stream).unwrap();
                    let settings = H2Settings::default();
                    let _ = serve(
                        io,
                        &settings,
                        std::future::pending(),
                        |request, mut respond| async move {
                            let mut body = request.into_body();
                            let _sender = respond.send_response(Response::new(()), false);
                            while body.data().await.is_some() {}
                        },
                    )
                    .await;
                });
            }
        });
    });
    address
}

/// Opens `count` connections with one quiet stream each and keeps them until `done`.
fn start_clients(legacy: bool, address: SocketAddr, count: usize) -> mpsc::Sender<()> {
    let (opened_tx, opened_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        block_on(legacy, async move {
            let mut kept = Vec::new();
            for _ in 0..count {
                let connection = connect(address, None, &H2Settings::default())
                    .await
                    .unwrap();
                let request = Request::post("http://idle/hold").body(()).unwrap();
                let (response, mut stream) = connection
                    .ready()
                    .await
                    .unwrap()
                    .send_request(request, false)
                    .unwrap();
                send_data(&mut stream, Bytes::from_static(b"hello"), false)
                    .await
                    .unwrap();
                let response = response.await.unwrap();
                kept.push((connection, stream, response));
            }
            opened_tx.send(()).unwrap();
            // Held until the test has measured; the blocking wait is fine, nothing else runs.
            let _ = done_rx.recv();
            drop(kept);
        });
    });
    opened_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    done_tx
}

/// The size class of h2's read buffer (8 KiB): blocks of 4,097 to 8,192 bytes.
const READ_BUFFER_CLASS: usize = 13;

/// Live heap per idle connection, and how many blocks of the read buffer's size class each
/// holds on average.
fn idle_heap_per_connection(legacy: bool) -> (f64, f64) {
    let address = start_server(legacy);
    // The first connections grow the runtime's and h2's shared tables once.
    let _warm = start_clients(legacy, address, WARM);
    std::thread::sleep(Duration::from_millis(200));
    let (bytes_before, blocks_before) = snapshot();
    let _idle = start_clients(legacy, address, IDLE);
    std::thread::sleep(Duration::from_millis(200));
    let (bytes_after, blocks_after) = snapshot();
    let per_connection = (bytes_after - bytes_before) as f64 / IDLE as f64;
    let driver = if legacy { "legacy" } else { "io_uring" };
    println!("{driver}: {per_connection:.0} bytes of live heap per idle connection");
    for (index, (after, before)) in blocks_after.iter().zip(&blocks_before).enumerate() {
        let added = after - before;
        if added.abs() >= IDLE as isize / 2 {
            let per = added as f64 / IDLE as f64;
            println!(
                "  blocks up to {:>7} bytes: {per:.2} per connection",
                1usize << index
            );
        }
    }
    let read_buffers =
        (blocks_after[READ_BUFFER_CLASS] - blocks_before[READ_BUFFER_CLASS]) as f64 / IDLE as f64;
    (per_connection, read_buffers)
}

#[test]
fn an_idle_connection_holds_no_codec_buffer_on_either_driver() {
    for legacy in [false, true] {
        let (per_connection, read_buffers) = idle_heap_per_connection(legacy);
        // A read buffer that a frame still shared when the connection went quiet stays until a
        // later quiet moment (vendor/README.md), which an idle connection may never have. How
        // many keep one varies from run to run on the legacy driver (none, up to 0.57 per
        // connection in a CI run on 2026-11-30, which made the total 13.8 KB), so those are
        // counted apart: the buffer must not stay on every connection, and the rest is bound.
        assert!(
            read_buffers < 0.9,
            "{read_buffers:.2} read buffers per idle connection: released on hardly any"
        );
        let per_connection = per_connection - read_buffers * 8192.0;
        // 10.1-12.8 KB (io_uring) and 10.4-12.9 KB (legacy, without the read buffers counted
        // apart above) here on 2026-11-30, varying from
        // run to run (not analysed: the thread's buffer pools are counted too); 15.9 and
        // 15.1 KB while h2 kept its HPACK decoding scratch, 16.6 and 19.0 KB while the serve loop's future
        // kept the handshake's state inline, 41.1 KB while h2 kept its codec buffers, 57.7 KB
        // while a pending read also held a 16 KiB buffer. The write buffer or the HPACK scratch
        // held again (16 or 4 KiB) crosses the bound; the read buffer kept everywhere fails
        // the count above.
        assert!(
            per_connection < 13_500.0,
            "{per_connection:.0} bytes of heap per idle connection: a codec, HPACK or read buffer held again?"
        );
    }
}
