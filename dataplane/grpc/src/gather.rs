//! tokio's `AsyncRead`/`AsyncWrite` (what h2, hyper and tokio-rustls speak) over a monoio TCP
//! stream, gathering writes until a flush.
//!
//! Hand-written because monoio-compat's adapter starts one socket write per `poll_write` and
//! answers the next `poll_write` with `Pending` until that write completes: a response made of
//! several TLS records (or h2 frames written separately) then costs one io_uring round trip and
//! one TCP segment per piece, each waiting for the event loop's next turn. Here `poll_write`
//! only copies into a buffer and `poll_flush` sends everything gathered in one write, the same
//! batching HAProxy and nginx do. Every consumer used here flushes after each batch (h2's
//! codec, hyper's HTTP/1.1 dispatcher, tokio-rustls' `poll_flush`); a writer that never flushes
//! still gets its bytes out once [`SEND_AT`] is reached. A flush writes straight to the
//! socket when it has room and uses an io_uring write only for the rest (`send_gathered`).
//!
//! Reads wait for readiness and then `recv` straight into the consumer's buffer (h2's, or
//! rustls'): a quiet connection holds no read buffer of its own. A completion read would own a
//! buffer for as long as the peer stays quiet (16 KiB per idle agent connection before, issue
//! 36), and its bytes were then copied once more into the consumer's.
//!
//! The ops own their half of the stream (and a write its buffer) and hand them back on
//! completion, so no reference to this struct outlives a poll (no lifetime tricks), and the
//! boxed op futures are reused: nothing is allocated per read or write in steady state.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;
use reusable_box_future::ReusableLocalBoxFuture;
use tokio::io::ReadBuf;

/// Gathered bytes at which `poll_write` starts sending without waiting for a flush.
const SEND_AT: usize = 64 * 1024;

/// Most bytes gathered per connection; past it `poll_write` waits for the socket (backpressure).
const GATHER_LIMIT: usize = 256 * 1024;

/// A send buffer that grew past this is freed once sent instead of kept, so a connection does
/// not hold its largest burst for as long as it lives. It holds a batch of small answers but
/// not a full TLS record (16 KiB of payload): h2 flushes once per large DATA frame, and 512
/// HTTP/2 clients of 100 KB LISTs kept ~20 KiB each under a 32 KiB limit. Freed on either path
/// (the socket took it at once, or through the ring): 512 HTTP/1.1 clients of the same LISTs
/// kept ~64 KiB each when only the ring's path let go (docs/PERFORMANCE.md, "Issue 17: what a
/// connection keeps").
const KEEP_CAPACITY: usize = 16 * 1024;

type ReadOp = ReusableLocalBoxFuture<(io::Result<()>, OwnedReadHalf<TcpStream>)>;
type WriteOp = ReusableLocalBoxFuture<(BufResult<(), Vec<u8>>, OwnedWriteHalf<TcpStream>)>;

/// A monoio TCP stream with tokio's I/O traits; see the module comment.
pub struct GatherStream {
    read: ReadSide,
    write: WriteSide,
}

struct ReadSide {
    /// The socket, read with `recv` once it is readable.
    fd: RawFd,
    /// `None` while a readiness wait is in flight (the op owns it).
    half: Option<OwnedReadHalf<TcpStream>>,
    /// The readiness wait (io_uring: a POLL_ADD; legacy: epoll readiness confirmed by poll(2)).
    op: ReadOp,
    armed: bool,
    /// Socket reads, and of those the ones that found nothing yet (`Debug` and tests).
    reads: u64,
    waits: u64,
}

struct WriteSide {
    /// The socket, for writes that finish at once (see `send_gathered`).
    fd: RawFd,
    /// `None` while a write is in flight (the op owns it).
    half: Option<OwnedWriteHalf<TcpStream>>,
    /// Accepted from the writer, not yet handed to the socket.
    gathered: Vec<u8>,
    /// The last sent buffer, emptied, to gather into next (no allocation per write).
    spare: Vec<u8>,
    op: WriteOp,
    armed: bool,
    shut_down: bool,
    /// Socket writes (what the gathering saves is visible in `Debug` and tests).
    sends: u64,
    /// Of those, the ones that waited for room through an io_uring write.
    queued: u64,
}

impl GatherStream {
    pub fn new(stream: TcpStream) -> Self {
        let fd = stream.as_raw_fd();
        let (read_half, write_half) = stream.into_split();
        Self {
            read: ReadSide {
                fd,
                half: Some(read_half),
                op: ReusableLocalBoxFuture::new(async { unreachable_read() }),
                armed: false,
                reads: 0,
                waits: 0,
            },
            write: WriteSide {
                fd,
                half: Some(write_half),
                gathered: Vec::new(),
                spare: Vec::new(),
                op: ReusableLocalBoxFuture::new(async { unreachable_write() }),
                armed: false,
                shut_down: false,
                sends: 0,
                queued: 0,
            },
        }
    }
}

// The placeholder futures the op slots are created with are replaced before their first poll.
fn unreachable_read() -> (io::Result<()>, OwnedReadHalf<TcpStream>) {
    unreachable!("an unarmed read op is never polled")
}

fn unreachable_write() -> (BufResult<(), Vec<u8>>, OwnedWriteHalf<TcpStream>) {
    unreachable!("an unarmed write op is never polled")
}

impl ReadSide {
    fn poll_read(&mut self, cx: &mut Context<'_>, into: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if into.remaining() == 0 {
            return Poll::Ready(Ok(())); // a recv of 0 bytes would read as the end of stream
        }
        loop {
            if self.armed {
                let (result, half) = ready!(self.op.poll(cx));
                self.armed = false;
                self.half = Some(half);
                result?;
            }
            self.reads += 1;
            // SAFETY: `recv_now` only writes into the slice (the kernel copies into it), never
            // reads it or de-initialises any of it.
            let unfilled = unsafe { into.unfilled_mut() };
            match recv_now(self.fd, unfilled) {
                // 0 is the end of stream: nothing put into `into`.
                Ok(received) => {
                    // SAFETY: the kernel wrote the first `received` bytes.
                    unsafe { into.assume_init(received) };
                    into.advance(received);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
            let Some(half) = self.half.take() else {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            };
            self.waits += 1;
            self.op.set(async move {
                // SAFETY: the cell holds the stream for as long as `half` (moved in here) lives;
                // the wait only reads its descriptor, as monoio's own halves share the stream.
                let stream = unsafe { &*half.0.get() };
                // Not relaxed: on the legacy driver a stale readiness is confirmed by poll(2).
                let ready = stream.readable(false).await;
                (ready, half)
            });
            self.armed = true;
        }
    }
}

/// Reads what the socket holds now into `into` without waiting: the bytes read (0 at the end
/// of stream), `WouldBlock` when nothing has arrived.
fn recv_now(fd: RawFd, into: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
    loop {
        // SAFETY: `into` is valid for writes of `into.len()` bytes for the duration of the
        // call, and `fd` is the connection's socket, open for as long as this stream lives.
        let received =
            unsafe { libc::recv(fd, into.as_mut_ptr().cast(), into.len(), libc::MSG_DONTWAIT) };
        if received >= 0 {
            return Ok(received as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Writes what the socket takes now without waiting: the bytes sent (0 when its buffer is
/// full).
fn send_now(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    let mut sent = 0;
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        // SAFETY: `rest` is valid for `rest.len()` bytes for the duration of the call, and `fd`
        // is the connection's socket, open for as long as this stream (which owns it) lives.
        let written = unsafe {
            libc::send(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if written > 0 {
            sent += written as usize;
            continue;
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted if written < 0 => continue,
            io::ErrorKind::WouldBlock if written < 0 => break,
            _ if written < 0 => return Err(error),
            _ => break,
        }
    }
    Ok(sent)
}

impl WriteSide {
    /// Collects a finished write, if one was in flight. `Ready(Ok)` when none is in flight.
    fn poll_sent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.armed {
            return Poll::Ready(Ok(()));
        }
        let ((result, mut sent), half) = ready!(self.op.poll(cx));
        self.armed = false;
        self.half = Some(half);
        sent.clear();
        if sent.capacity() <= KEEP_CAPACITY {
            self.spare = sent;
        }
        Poll::Ready(result)
    }

    /// Hands everything gathered to the socket (none may be in flight): first straight to the
    /// kernel, and only what does not fit in the socket buffer through an io_uring write.
    ///
    /// Why not io_uring alone: monoio submits its queue only when no task is ready to run, so
    /// under load a queued write waits for the rest of the event-loop turn, and its completion
    /// costs another wake-up before the next one may start. A non-blocking `send` of a few
    /// KiB into a socket buffer with room finishes at once (what HAProxy and nginx do); the
    /// ring remains the path for a full buffer, where waiting is the point. It shows when the
    /// peers run on another CPU: a burst of requests is answered as each answer is ready rather
    /// than all at the end of the turn (docs/PERFORMANCE.md, "Issue 17: the proxy alone on
    /// its CPU").
    fn send_gathered(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match send_now(self.fd, &self.gathered) {
            Ok(sent) if sent == self.gathered.len() => {
                self.gathered.clear();
                if self.gathered.capacity() > KEEP_CAPACITY {
                    self.gathered = std::mem::take(&mut self.spare);
                }
                self.sends += 1;
                return Poll::Ready(Ok(()));
            }
            Ok(sent) => {
                self.gathered.drain(..sent);
            }
            Err(error) => return Poll::Ready(Err(error)),
        }
        let Some(mut half) = self.half.take() else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        let buffer = std::mem::replace(&mut self.gathered, std::mem::take(&mut self.spare));
        self.op.set(async move {
            let (result, buffer) = half.write_all(buffer).await;
            ((result.map(|_| ()), buffer), half)
        });
        self.armed = true;
        self.sends += 1;
        self.queued += 1;
        self.poll_sent(cx)
    }

    /// Accepts as much of `pieces` as the gather limit allows.
    fn poll_gather(&mut self, cx: &mut Context<'_>, pieces: &[&[u8]]) -> Poll<io::Result<usize>> {
        if self.shut_down {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let _ = self.poll_sent(cx)?;
        if self.gathered.len() >= SEND_AT && !self.armed {
            let _ = self.send_gathered(cx)?;
        }
        let room = GATHER_LIMIT.saturating_sub(self.gathered.len());
        if room == 0 {
            // Only reachable with a write in flight: its completion wakes this task.
            return Poll::Pending;
        }
        let mut taken = 0;
        for piece in pieces {
            let part = &piece[..piece.len().min(room - taken)];
            self.gathered.extend_from_slice(part);
            taken += part.len();
            if taken == room {
                break;
            }
        }
        Poll::Ready(Ok(taken))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_sent(cx))?;
            if self.gathered.is_empty() {
                return Poll::Ready(Ok(()));
            }
            ready!(self.send_gathered(cx))?;
        }
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_flush(cx))?;
        if !self.shut_down {
            self.shut_down = true;
            if let Some(half) = self.half.as_mut() {
                // TcpStream's shutdown is a synchronous shutdown(2); its future is already done.
                let mut shutdown = std::pin::pin!(half.shutdown());
                return shutdown.as_mut().poll(cx);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncRead for GatherStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        into: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().read.poll_read(cx, into)
    }
}

impl tokio::io::AsyncWrite for GatherStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write.poll_gather(cx, &[buf])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // At most a few slices (h2's frame head and payload, rustls' records): no allocation.
        let mut pieces: [&[u8]; 16] = [&[]; 16];
        let count = bufs.len().min(pieces.len());
        for (piece, slice) in pieces.iter_mut().zip(bufs) {
            *piece = slice;
        }
        self.get_mut().write.poll_gather(cx, &pieces[..count])
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write.poll_shutdown(cx)
    }
}

impl std::fmt::Debug for GatherStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherStream")
            .field("reads", &self.read.reads)
            .field("read_waits", &self.read.waits)
            .field("gathered", &self.write.gathered.len())
            .field("sending", &self.write.armed)
            .field("sends", &self.write.sends)
            .field("queued", &self.write.queued)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use monoio::io::{AsyncReadRent, AsyncReadRentExt, AsyncWriteRentExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A connected pair on loopback: (gathering side, plain monoio peer).
    async fn pair() -> (GatherStream, TcpStream) {
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (accepted, connected) = monoio::join!(listener.accept(), TcpStream::connect(address));
        (GatherStream::new(connected.unwrap()), accepted.unwrap().0)
    }

    async fn read_exactly(peer: &mut TcpStream, length: usize) -> Vec<u8> {
        let (result, buffer) = peer.read_exact(Vec::with_capacity(length)).await;
        result.unwrap();
        buffer
    }

    fn pattern(length: usize) -> Vec<u8> {
        (0..length).map(|index| (index * 7 % 251) as u8).collect()
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn small_writes_before_a_flush_leave_in_one_socket_write() {
        let (mut stream, mut peer) = pair().await;
        for piece in [&b"HEADERS"[..], b"DATA", b"TRAILERS"] {
            stream.write_all(piece).await.unwrap();
        }
        assert_eq!(stream.write.sends, 0, "nothing is sent before the flush");
        stream.flush().await.unwrap();
        assert_eq!(stream.write.sends, 1);
        assert_eq!(read_exactly(&mut peer, 19).await, b"HEADERSDATATRAILERS");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_flush_into_a_socket_with_room_is_done_before_the_event_loop_turns() {
        let (mut stream, mut peer) = pair().await;
        stream.write_all(b"HEADERS").await.unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let flushed = tokio::io::AsyncWrite::poll_flush(Pin::new(&mut stream), &mut cx);
        assert!(matches!(flushed, Poll::Ready(Ok(()))), "{flushed:?}");
        assert_eq!((stream.write.sends, stream.write.queued), (1, 0));
        assert_eq!(read_exactly(&mut peer, 7).await, b"HEADERS");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn vectored_writes_are_gathered_in_order() {
        let (mut stream, mut peer) = pair().await;
        let slices = [
            io::IoSlice::new(b"ab"),
            io::IoSlice::new(b""),
            io::IoSlice::new(b"cd"),
        ];
        let written = stream.write_vectored(&slices).await.unwrap();
        assert_eq!(written, 4);
        stream.flush().await.unwrap();
        assert_eq!(read_exactly(&mut peer, 4).await, b"abcd");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_writer_past_the_limit_waits_for_the_socket_and_nothing_is_lost() {
        let (mut stream, mut peer) = pair().await;
        let total = GATHER_LIMIT * 8;
        let data = pattern(total);
        let expected = data.clone();
        // Written without a flush: bytes must still leave once SEND_AT is reached, and the
        // writer must wait (not grow the buffer) while the peer is slow.
        let writer = async move {
            for chunk in data.chunks(10_000) {
                stream.write_all(chunk).await.unwrap();
                assert!(stream.write.gathered.len() <= GATHER_LIMIT);
            }
            stream.flush().await.unwrap();
            stream
        };
        let reader = read_exactly(&mut peer, total);
        let (stream, received) = monoio::join!(writer, reader);
        assert!(received == expected, "bytes arrived reordered or corrupted");
        assert!(stream.write.sends >= (total / GATHER_LIMIT) as u64);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_full_socket_buffer_queues_the_rest_and_delivers_it_in_order() {
        let (mut stream, mut peer) = pair().await;
        let total = 32 * 1024 * 1024;
        let data = pattern(total);
        let expected = data.clone();
        let writer = async move {
            for chunk in data.chunks(GATHER_LIMIT) {
                stream.write_all(chunk).await.unwrap();
                stream.flush().await.unwrap();
            }
            stream
        };
        // The peer reads only after a pause, so the socket buffers fill first.
        let reader = async {
            monoio::time::sleep(std::time::Duration::from_millis(100)).await;
            read_exactly(&mut peer, total).await
        };
        let (stream, received) = monoio::join!(writer, reader);
        assert!(received == expected, "bytes arrived reordered or corrupted");
        assert!(stream.write.queued > 0, "{stream:?}");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_large_answer_sent_at_once_leaves_no_large_buffer_behind() {
        let (mut stream, mut peer) = pair().await;
        let data = pattern(KEEP_CAPACITY + 1);
        stream.write_all(&data).await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(
            stream.write.queued, 0,
            "the socket took it at once: {stream:?}"
        );
        assert!(
            stream.write.gathered.capacity() <= KEEP_CAPACITY,
            "{stream:?}"
        );
        assert!(read_exactly(&mut peer, data.len()).await == data);
        stream.write_all(b"next").await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(read_exactly(&mut peer, 4).await, b"next");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn reads_hand_out_what_arrived_and_end_of_stream_reads_zero() {
        let (mut stream, mut peer) = pair().await;
        let data = pattern(100 * 1024 + 5);
        let (result, _) = peer.write_all(data.clone()).await;
        result.unwrap();
        drop(peer);
        let mut received = Vec::new();
        stream.read_to_end(&mut received).await.unwrap();
        assert!(received == data);
        let mut more = [0u8; 8];
        assert_eq!(stream.read(&mut more).await.unwrap(), 0);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_read_of_a_quiet_peer_waits_for_readiness_and_lands_in_the_callers_buffer() {
        let (mut stream, mut peer) = pair().await;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut storage = [0u8; 64];
        let mut into = ReadBuf::new(&mut storage);
        let polled = tokio::io::AsyncRead::poll_read(Pin::new(&mut stream), &mut cx, &mut into);
        assert!(polled.is_pending(), "{polled:?}");
        assert_eq!((stream.read.reads, stream.read.waits), (1, 1));
        assert!(
            stream.read.armed && stream.read.half.is_none(),
            "{stream:?}"
        );
        let (result, _) = peer.write_all(b"late".to_vec()).await;
        result.unwrap();
        let mut received = [0u8; 64];
        let read = stream.read(&mut received).await.unwrap();
        assert_eq!(&received[..read], b"late");
        assert_eq!(
            stream.read.waits, 1,
            "the data was there once readable: {stream:?}"
        );
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_read_with_data_waiting_takes_it_without_a_wait() {
        let (mut stream, mut peer) = pair().await;
        let (result, _) = peer.write_all(b"ready".to_vec()).await;
        result.unwrap();
        // Let the bytes cross loopback before the read.
        monoio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut received = [0u8; 16];
        let read = stream.read(&mut received).await.unwrap();
        assert_eq!(&received[..read], b"ready");
        assert_eq!((stream.read.reads, stream.read.waits), (1, 0));
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_read_into_a_full_buffer_reads_nothing_and_is_not_the_end_of_stream() {
        let (mut stream, mut peer) = pair().await;
        let (result, _) = peer.write_all(b"kept".to_vec()).await;
        result.unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut into = ReadBuf::new(&mut []);
        let polled = tokio::io::AsyncRead::poll_read(Pin::new(&mut stream), &mut cx, &mut into);
        assert!(matches!(polled, Poll::Ready(Ok(()))), "{polled:?}");
        assert_eq!(stream.read.reads, 0, "no socket read for no room");
        let mut received = [0u8; 4];
        stream.read_exact(&mut received).await.unwrap();
        assert_eq!(&received, b"kept");
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_waiting_read_sees_the_peers_close_as_the_end_of_stream() {
        let (mut stream, peer) = pair().await;
        let reader = async {
            let mut received = [0u8; 8];
            stream.read(&mut received).await.unwrap()
        };
        let closer = async move {
            monoio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(peer);
        };
        let (read, ()) = monoio::join!(reader, closer);
        assert_eq!(read, 0);
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn shutdown_flushes_then_ends_the_peers_stream() {
        let (mut stream, mut peer) = pair().await;
        stream.write_all(b"last words").await.unwrap();
        stream.shutdown().await.unwrap();
        assert_eq!(read_exactly(&mut peer, 10).await, b"last words");
        let (read, _) = peer.read(vec![0u8; 8]).await;
        assert_eq!(read.unwrap(), 0, "the peer sees the end of the stream");
        assert!(stream.write_all(b"more").await.is_err());
    }
}
