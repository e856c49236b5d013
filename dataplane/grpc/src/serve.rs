//! The server side of an HTTP/2 connection, with the limits that keep a slow or silent peer from
//! holding it for free: the preface within the handshake deadline, a first request within
//! `header_timeout`, nothing in flight for no longer than `idle_timeout`, PINGs answered within
//! `keepalive_timeout`, and GOAWAY when the connection is asked to drain (process stop or
//! `max_connection_age`).

use std::future::{poll_fn, Future};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use monoio::time::Instant;
use monoio_compat::{AsyncRead, AsyncWrite};
use sluice_runtime::{spawn_contained, CloseReason, ConnectionLimits};

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
}

impl ServeLimits<'static> {
    /// The default limits, counted nowhere (tests, tools).
    pub fn defaults() -> Self {
        let limits = ConnectionLimits::default();
        Self {
            handshake_deadline: Instant::now() + limits.handshake_timeout,
            limits,
            on_limit: &|_| {},
        }
    }
}

/// Serves HTTP/2 on an accepted connection with the default limits: see [`serve_limited`].
pub async fn serve<T, H, F>(
    io: T,
    settings: &H2Settings,
    drain: impl Future<Output = ()>,
    handler: H,
) -> Result<(), h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + 'static,
{
    serve_limited(io, settings, ServeLimits::defaults(), drain, handler).await
}

/// What ended one turn of the serve loop.
enum Next<S> {
    Stream(Option<Result<S, h2::Error>>),
    Drain,
    Tick,
    PingUnanswered,
    GraceOver,
}

/// Serves HTTP/2 on an accepted connection until the peer closes it, a limit closes it, or
/// `drain` resolves (then a GOAWAY lets in-flight streams finish). Each request stream is
/// handled by its own panic-contained task.
pub async fn serve_limited<T, H, F>(
    io: T,
    settings: &H2Settings,
    limits: ServeLimits<'_>,
    drain: impl Future<Output = ()>,
    mut handler: H,
) -> Result<(), h2::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    H: FnMut(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + 'static,
{
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_window_size(settings.initial_stream_window)
        .initial_connection_window_size(settings.initial_connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(settings.max_header_list_size)
        .data_frame_budget(small_frame_budget(settings))
        .handshake::<T, Bytes>(io);
    let Ok(connection) = monoio::time::timeout_at(limits.handshake_deadline, handshake).await
    else {
        (limits.on_limit)(CloseReason::HandshakeTimeout);
        return Ok(());
    };
    let mut connection = connection?;
    let ping = limits
        .limits
        .keepalive_interval
        .and_then(|_| connection.ping_pong());
    let mut unanswered = std::pin::pin!(unanswered_ping(ping, &limits.limits));
    let mut clock = IdleClock::new(&limits.limits, Instant::now());
    let mut drain = std::pin::pin!(drain);
    let mut draining = false;
    let mut grace_until: Option<Instant> = None;
    loop {
        let grace = async {
            match grace_until {
                Some(at) => monoio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let next = monoio::select! {
            // Streams first: a busy connection is served before any limit bookkeeping.
            biased;
            next = connection.accept() => Next::Stream(next),
            () = &mut drain, if !draining => Next::Drain,
            () = monoio::time::sleep_until(clock.next_check()), if !draining => Next::Tick,
            () = &mut unanswered, if !draining => Next::PingUnanswered,
            () = grace => Next::GraceOver,
        };
        match next {
            Next::Stream(Some(Ok((request, respond)))) => {
                clock.request_arrived(Instant::now());
                // Each stream's task is contained: a bug (or a peer that finds one) ends that
                // stream, counted in sluice_task_panics_total{task="grpc-stream"}, not the worker.
                spawn_contained("grpc-stream", handler(request, respond));
            }
            Next::Stream(Some(Err(error))) if is_peer_gone(&error) => return Ok(()),
            Next::Stream(Some(Err(error))) => return Err(error),
            Next::Stream(None) | Next::GraceOver => return Ok(()),
            Next::Drain => {
                draining = true;
                connection.graceful_shutdown();
            }
            Next::Tick => {
                if let Some(reason) = clock.check(Instant::now(), connection.has_streams()) {
                    (limits.on_limit)(reason);
                    draining = true;
                    connection.graceful_shutdown();
                    grace_until = Some(Instant::now() + GOAWAY_GRACE);
                }
            }
            Next::PingUnanswered => {
                (limits.on_limit)(CloseReason::KeepaliveTimeout);
                connection.abrupt_shutdown(h2::Reason::NO_ERROR);
                draining = true;
                grace_until = Some(Instant::now() + GOAWAY_GRACE);
            }
        }
    }
}

/// Resolves when a keepalive PING goes unanswered for `keepalive_timeout`; never without
/// keepalive (or once the connection refuses PINGs, being closed anyway).
async fn unanswered_ping(ping: Option<h2::PingPong>, limits: &ConnectionLimits) {
    let (Some(mut ping), Some(interval)) = (ping, limits.keepalive_interval) else {
        return std::future::pending().await;
    };
    loop {
        monoio::time::sleep(interval).await;
        if ping.send_ping(h2::Ping::opaque()).is_err() {
            return std::future::pending().await;
        }
        let pong = poll_fn(|cx| ping.poll_pong(cx));
        match monoio::time::timeout(limits.keepalive_timeout, pong).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
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
