//! The server side of an HTTP/2 connection, with the limits that keep a slow or silent peer from
//! holding it for free: the preface within the handshake deadline, a first request within
//! `header_timeout`, nothing in flight for no longer than `idle_timeout`, PINGs answered within
//! `keepalive_timeout`, and GOAWAY when the connection is asked to drain (process stop or
//! `max_connection_age`).

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use monoio::time::Instant;
use monoio_compat::{AsyncRead, AsyncWrite};
use sluice_runtime::{spawn_contained, CloseReason, ConnectionLimits};
use tokio::io::ReadBuf;

use crate::transport::{small_frame_budget, H2Settings};

/// A limit-closed connection gets this long after its GOAWAY to go quietly before the socket is
/// dropped (it had nothing in flight).
pub const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// The limits one served connection runs under, and where a close on a limit is counted.
pub struct ServeLimits<'a> {
    pub limits: ConnectionLimits,
    /// When the HTTP/2 preface (and the TLS handshake before it) must be done.
    pub handshake_deadline: Instant,
    pub on_limit: &'a dyn Fn(CloseReason),
    /// When the connection is asked to go away (`max_connection_age`, spread), and what to do
    /// then besides the GOAWAY.
    pub retire_at: Option<Instant>,
    pub on_retire: &'a dyn Fn(),
}

impl ServeLimits<'static> {
    /// The default limits, counted nowhere (tests, tools).
    pub fn defaults() -> Self {
        let limits = ConnectionLimits::default();
        Self {
            handshake_deadline: Instant::now() + limits.handshake_timeout,
            limits,
            on_limit: &|_| {},
            retire_at: None,
            on_retire: &|| {},
        }
    }
}

/// Serves HTTP/2 on an accepted connection with the default limits: see [`serve_limited`].
pub fn serve<'a, T, D, H, F>(
    io: T,
    settings: &'a H2Settings,
    drain: D,
    handler: H,
) -> impl Future<Output = Result<(), h2::Error>> + use<'a, T, D, H, F>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    D: Future<Output = ()>,
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + 'static,
{
    serve_limited(io, settings, ServeLimits::defaults(), drain, handler)
}

/// What ended one turn of the serve loop.
enum Next<S> {
    Stream(Option<Result<S, h2::Error>>),
    Drain,
    Alarm,
}

/// Serves HTTP/2 on an accepted connection until the peer closes it, a limit closes it, or
/// `drain` resolves (then a GOAWAY lets in-flight streams finish). Each request stream is
/// handled by its own panic-contained task.
///
/// Every time limit shares one timer ([`Alarms`]): the loop wakes for each batch of frames a
/// busy connection moves, and every future polled per wake is paid again on each call of a
/// one-call-at-a-time client.
///
/// Not an `async fn`: an `async fn`'s arguments stay in its future for as long as it runs,
/// which is the connection's whole life, and `io` may be a TLS session of over a kilobyte. It
/// is moved behind [`Shared`]'s `Rc` before the future is made, so only the pointer stays.
pub fn serve_limited<'a, T, D, H, F>(
    io: T,
    settings: &'a H2Settings,
    limits: ServeLimits<'a>,
    drain: D,
    handler: H,
) -> impl Future<Output = Result<(), h2::Error>> + use<'a, T, D, H, F>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    D: Future<Output = ()>,
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + 'static,
{
    let io = Shared::new(io);
    async move {
        let kept = io.clone();
        let (result, went_away) = serve_h2(io, settings, limits, drain, handler).await;
        if went_away {
            // Boxed: its 4 KiB read scratch inline would be reserved in every connection's
            // task for its whole life, though only a connection closing after a GOAWAY lingers.
            Box::pin(linger(kept)).await;
        }
        result
    }
}

/// Serves until the connection ends; also says whether it ended after this side's GOAWAY.
async fn serve_h2<T, H, F>(
    io: T,
    settings: &H2Settings,
    limits: ServeLimits<'_>,
    drain: impl Future<Output = ()>,
    mut handler: H,
) -> (Result<(), h2::Error>, bool)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + 'static,
{
    // Boxed with its timer, and taken apart in the statement that awaits it: this future lives
    // as long as its connection, and a handshake's state kept inline (or the result it left
    // behind) would make every quiet connection hold it (docs/PERFORMANCE.md, "Issue 36: what
    // a connection's task holds").
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_window_size(settings.initial_stream_window)
        .initial_connection_window_size(settings.initial_connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.max_header_list_size)
        .data_frame_budget(small_frame_budget(settings))
        .handshake::<_, Bytes>(crate::frames::FrameIo(io));
    let handshake = Box::pin(monoio::time::timeout_at(
        limits.handshake_deadline,
        handshake,
    ));
    let mut connection = match handshake.await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => return (Err(error), false),
        Err(_) => {
            (limits.on_limit)(CloseReason::HandshakeTimeout);
            return (Ok(()), false);
        }
    };
    let now = Instant::now();
    let mut alarms = Alarms {
        clock: IdleClock::new(&limits.limits, now),
        keepalive: Keepalive::new(&mut connection, &limits.limits, now),
        retire_at: limits.retire_at,
        grace_until: None,
    };
    let mut alarm = std::pin::pin!(monoio::time::sleep_until(alarms.next()));
    let mut drain = std::pin::pin!(drain);
    let mut draining = false;
    loop {
        let next = monoio::select! {
            // Streams first: a busy connection is served before any limit bookkeeping.
            biased;
            next = connection.accept() => Next::Stream(next),
            () = &mut drain, if !draining => Next::Drain,
            () = &mut alarm => Next::Alarm,
        };
        match next {
            Next::Stream(Some(Ok((request, respond)))) => {
                let due = alarms.next();
                alarms.clock.request_arrived(Instant::now());
                if alarms.next() != due {
                    alarm.as_mut().reset(alarms.next());
                }
                // Each stream's task is contained: a bug (or a peer that finds one) ends that
                // stream, counted in sluice_task_panics_total{task="grpc-stream"}, not the worker.
                spawn_contained("grpc-stream", handler(request, respond));
            }
            Next::Stream(Some(Err(error))) if is_peer_gone(&error) => return (Ok(()), false),
            Next::Stream(Some(Err(error))) => return (Err(error), draining),
            Next::Stream(None) => return (Ok(()), draining),
            Next::Drain => {
                draining = true;
                alarms.stop_limits();
                connection.graceful_shutdown();
                alarm.as_mut().reset(alarms.next());
            }
            Next::Alarm => {
                match alarms.ring(Instant::now(), &mut connection, &limits) {
                    Ring::Nothing => {}
                    Ring::GoAway => {
                        draining = true;
                        connection.graceful_shutdown();
                    }
                    Ring::Close => return (Ok(()), false),
                }
                alarm.as_mut().reset(alarms.next());
            }
        }
    }
}

/// The connection's I/O, shared between the HTTP/2 server and [`linger`], which needs it back
/// after the server is done with it.
struct Shared<T>(Rc<RefCell<T>>);

impl<T> Shared<T> {
    fn new(io: T) -> Self {
        Self(Rc::new(RefCell::new(io)))
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

// Each poll borrows for its own duration only; the server and `linger` never poll at once.
impl<T: AsyncRead + Unpin> AsyncRead for Shared<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Shared<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_shutdown(cx)
    }
}

/// After this side's GOAWAY the server closes once its streams are done, but the peer may have
/// sent a request (or data) the GOAWAY crossed. Closing a socket with unread bytes sends a
/// RST, and a RST makes the peer's kernel drop what it had not read yet, the GOAWAY included:
/// the peer would see a reset instead of "not processed, retry elsewhere". So the write side is
/// shut (FIN after the GOAWAY) and what arrives is read and dropped until the peer closes, for
/// at most [`GOAWAY_GRACE`].
async fn linger<T: AsyncRead + AsyncWrite + Unpin>(mut io: Shared<T>) {
    let drained = async {
        let _ = poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx)).await;
        let mut scratch = [0u8; 4096];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match poll_fn(|cx| Pin::new(&mut io).poll_read(cx, &mut buf)).await {
                Ok(()) if !buf.filled().is_empty() => {}
                _ => return,
            }
        }
    };
    let _ = monoio::time::timeout(GOAWAY_GRACE, drained).await;
}

/// What a ring of the alarm asks of the serve loop.
enum Ring {
    Nothing,
    /// Send GOAWAY and let in-flight streams finish.
    GoAway,
    /// Drop the connection now.
    Close,
}

/// Every time limit of one connection, behind the one timer the serve loop keeps.
struct Alarms {
    clock: IdleClock,
    keepalive: Option<Keepalive>,
    retire_at: Option<Instant>,
    /// A connection closed on a limit gets this long to go quietly after its GOAWAY.
    grace_until: Option<Instant>,
}

impl Alarms {
    /// When the timer must ring next.
    fn next(&self) -> Instant {
        [
            Some(self.clock.next_check()),
            self.keepalive.as_ref().map(Keepalive::next),
            self.retire_at,
            self.grace_until,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(far_future)
    }

    /// The connection is draining: only the grace period (if one was set) still matters.
    fn stop_limits(&mut self) {
        self.keepalive = None;
        self.retire_at = None;
        self.clock.suspend();
    }

    fn ring<T>(
        &mut self,
        now: Instant,
        connection: &mut h2::server::Connection<T, Bytes>,
        limits: &ServeLimits<'_>,
    ) -> Ring
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        if self.grace_until.is_some_and(|at| now >= at) {
            return Ring::Close;
        }
        if self.retire_at.is_some_and(|at| now >= at) {
            (limits.on_retire)();
            self.stop_limits();
            return Ring::GoAway;
        }
        if let Some(keepalive) = self.keepalive.as_mut() {
            if !keepalive.ring(now) {
                (limits.on_limit)(CloseReason::KeepaliveTimeout);
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                self.stop_limits();
                self.grace_until = Some(now + GOAWAY_GRACE);
                return Ring::Nothing;
            }
        }
        if now >= self.clock.next_check() {
            if let Some(reason) = self.clock.check(now, connection.has_streams()) {
                (limits.on_limit)(reason);
                self.stop_limits();
                self.grace_until = Some(now + GOAWAY_GRACE);
                return Ring::GoAway;
            }
        }
        Ring::Nothing
    }
}

/// HTTP/2 PINGs every `keepalive_interval`; the pong is looked for when its time is up, not on
/// every wake of the connection.
struct Keepalive {
    ping: h2::PingPong,
    interval: Duration,
    timeout: Duration,
    /// `Ok(at)`: the next PING goes out at `at`; `Err(deadline)`: one is out, due by `deadline`.
    state: Result<Instant, Instant>,
}

impl Keepalive {
    fn new<T>(
        connection: &mut h2::server::Connection<T, Bytes>,
        limits: &ConnectionLimits,
        now: Instant,
    ) -> Option<Self>
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let interval = limits.keepalive_interval?;
        Some(Self {
            ping: connection.ping_pong()?,
            interval,
            timeout: limits.keepalive_timeout,
            state: Ok(now + interval),
        })
    }

    fn next(&self) -> Instant {
        match self.state {
            Ok(at) | Err(at) => at,
        }
    }

    /// Sends a PING, or checks the one out; `false` when it went unanswered.
    fn ring(&mut self, now: Instant) -> bool {
        match self.state {
            Ok(at) if now >= at => {
                // A connection that cannot send a PING is closing anyway.
                self.state = match self.ping.send_ping(h2::Ping::opaque()) {
                    Ok(()) => Err(now + self.timeout),
                    Err(_) => Ok(now + self.interval),
                };
            }
            Err(deadline) if now >= deadline => {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                match self.ping.poll_pong(&mut cx) {
                    std::task::Poll::Ready(_) => self.state = Ok(now + self.interval),
                    std::task::Poll::Pending => return false,
                }
            }
            _ => {}
        }
        true
    }
}

/// When a connection with nothing in flight is closed: `header_timeout` after the handshake
/// until its first request, `idle_timeout` after the last one. Checked on a coarse tick (a
/// quarter of the limit) rather than with a timer per request, so a connection is closed
/// between one and one and a quarter limits after it went quiet.
#[derive(Debug)]
pub struct IdleClock {
    header_timeout: Duration,
    idle_timeout: Duration,
    /// No request yet: the header timeout applies.
    first: bool,
    /// Since when nothing was in flight, as of the last check.
    quiet_since: Instant,
    next_check: Instant,
}

impl IdleClock {
    pub fn new(limits: &ConnectionLimits, now: Instant) -> Self {
        Self {
            header_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            first: true,
            quiet_since: now,
            next_check: now + tick(limits.header_timeout),
        }
    }

    /// Stops checking (the connection is draining anyway).
    fn suspend(&mut self) {
        self.next_check = far_future();
    }

    /// When [`Self::check`] is due next.
    pub fn next_check(&self) -> Instant {
        self.next_check
    }

    fn limit(&self) -> Duration {
        if self.first {
            self.header_timeout
        } else {
            self.idle_timeout
        }
    }

    /// A request is activity: quiet time counts from here at least.
    pub fn request_arrived(&mut self, now: Instant) {
        self.quiet_since = now;
        if self.first {
            self.first = false;
            self.next_check = self.next_check.min(now + tick(self.idle_timeout));
        }
    }

    /// At a tick: the reason to close the connection, if it has been quiet too long.
    pub fn check(&mut self, now: Instant, busy: bool) -> Option<CloseReason> {
        if busy {
            self.quiet_since = now;
        } else if now.saturating_duration_since(self.quiet_since) >= self.limit() {
            return Some(if self.first {
                CloseReason::HeaderTimeout
            } else {
                CloseReason::Idle
            });
        }
        let until_limit = (self.quiet_since + self.limit()).saturating_duration_since(now);
        self.next_check = now + tick(self.limit()).min(until_limit.max(Duration::from_millis(10)));
        None
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

fn tick(limit: Duration) -> Duration {
    (limit / 4).max(Duration::from_millis(10))
}

/// A peer that closes its socket (with or without GOAWAY) ends the connection normally; the
/// shutdown of an already-closed socket reports `NotConnected`, which is not worth an error.
fn is_peer_gone(error: &h2::Error) -> bool {
    use std::io::ErrorKind;
    error.get_io().is_some_and(|io| {
        matches!(
            io.kind(),
            ErrorKind::NotConnected
                | ErrorKind::BrokenPipe
                | ErrorKind::ConnectionReset
                | ErrorKind::UnexpectedEof
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(header: u64, idle: u64) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(header),
            idle_timeout: Duration::from_secs(idle),
            ..ConnectionLimits::default()
        }
    }

    #[test]
    fn a_connection_without_a_first_request_closes_at_the_header_timeout() {
        let start = Instant::now();
        let mut clock = IdleClock::new(&limits(8, 60), start);
        assert_eq!(clock.next_check, start + Duration::from_secs(2));
        assert_eq!(clock.check(start + Duration::from_secs(2), false), None);
        assert_eq!(clock.check(start + Duration::from_secs(6), false), None);
        assert_eq!(
            clock.next_check,
            start + Duration::from_secs(8),
            "the last tick lands on the limit"
        );
        assert_eq!(
            clock.check(start + Duration::from_secs(8), false),
            Some(CloseReason::HeaderTimeout)
        );
    }

    #[test]
    fn a_busy_connection_stays_and_a_quiet_one_closes_after_the_idle_timeout() {
        let start = Instant::now();
        let mut clock = IdleClock::new(&limits(8, 40), start);
        let at = |secs| start + Duration::from_secs(secs);
        clock.request_arrived(at(1));
        assert_eq!(clock.check(at(10), true), None);
        assert_eq!(clock.check(at(45), true), None, "busy: never idle");
        assert_eq!(clock.check(at(60), false), None, "quiet for 15 s");
        assert_eq!(clock.check(at(84), false), None, "quiet for 39 s");
        assert_eq!(clock.check(at(85), false), Some(CloseReason::Idle));
    }

    #[test]
    fn a_request_between_ticks_restarts_the_quiet_time() {
        let start = Instant::now();
        let mut clock = IdleClock::new(&limits(8, 40), start);
        let at = |secs| start + Duration::from_secs(secs);
        clock.request_arrived(at(1));
        assert_eq!(clock.check(at(30), false), None);
        clock.request_arrived(at(35));
        assert_eq!(clock.check(at(41), false), None, "quiet for 6 s only");
        assert_eq!(clock.check(at(75), false), Some(CloseReason::Idle));
    }

    #[test]
    fn ticks_are_a_quarter_of_the_limit_but_never_below_10ms() {
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(15));
        assert_eq!(tick(Duration::from_millis(8)), Duration::from_millis(10));
    }
}
