//! A client request's turn for a stream to an upstream server: the I/O side of
//! `sluice_gateway::fair_share::StreamQueue` (which decides who goes next; here a waiting
//! request sleeps until its turn comes, its wait limit passes, or its client goes away).
//!
//! Uncontended, a turn is one `RefCell` borrow and two counter updates. Only a request that
//! queues allocates (its [`Turn`], a timer, its level's metrics on a core's first use).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use sluice_gateway::fair_share::{Admission, FairShareRefusal, StreamQueue, Ticket};

use crate::fair_metrics::LevelMetrics;

/// The streams of one core to one server, shared fairly (held by the pool's per-server state,
/// which sits above this module: a turn needs only the queue).
pub(crate) type SharedStreams = RefCell<StreamQueue<Rc<Turn>>>;

/// Who asks for a stream.
#[derive(Debug, Clone, Copy)]
pub struct ClientTurn<'a> {
    /// The user the apiserver will see: the fairness flow.
    pub user: &'a str,
    pub long_running: bool,
    /// The priority level (the admitting flow-control schema), for metrics.
    pub level: Option<&'a Arc<str>>,
}

/// A queued request's turn: set when the queue grants it a stream.
#[derive(Default)]
pub(crate) struct Turn {
    granted: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Turn")
            .field("granted", &self.granted.get())
            .finish_non_exhaustive()
    }
}

/// The queue's grant callback: the waiting request holds a stream now.
pub(crate) fn grant(_: Ticket, turn: Rc<Turn>) {
    turn.granted.set(true);
    if let Some(waker) = turn.waker.take() {
        waker.wake();
    }
}

/// A stream of a server's fair share, held until the request's response ends.
#[derive(Debug)]
pub struct ShareHeld {
    streams: Rc<SharedStreams>,
    long_running: bool,
}

impl Drop for ShareHeld {
    fn drop(&mut self) {
        self.streams.borrow_mut().release(self.long_running, grant);
    }
}

/// A request waiting in its user's queue; dropped before its turn (its wait limit passed, its
/// client went away), it leaves the queue, and a turn granted meanwhile is passed on.
struct Waiting<'a> {
    streams: &'a SharedStreams,
    request: ClientTurn<'a>,
    ticket: Ticket,
    turn: Rc<Turn>,
    metrics: &'a LevelMetrics,
    worker: usize,
    since: Instant,
    taken: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.metrics.waiting.dec(self.worker);
        self.metrics
            .wait
            .observe(self.worker, self.since.elapsed().as_secs_f64());
        if self.taken {
            return;
        }
        let mut queue = self.streams.borrow_mut();
        if !queue.cancel(self.request.user, self.ticket) && self.turn.granted.get() {
            queue.release(self.request.long_running, grant);
        }
    }
}

/// Where a request stands after asking for its turn.
pub(crate) enum Asked {
    /// A stream is the request's, held until this drops.
    Held(ShareHeld),
    /// The request waits: see [`wait_turn`].
    Queued(Ticket, Rc<Turn>),
}

/// Asks for `request`'s turn on a server's `streams`: refused over a bound, else held at once or
/// queued. Synchronous, so that only a request that must wait carries (boxed) a waiting future.
pub(crate) fn ask_turn(
    streams: &Rc<SharedStreams>,
    request: ClientTurn<'_>,
) -> Result<Asked, FairShareRefusal> {
    let mut queued_turn = None;
    let admission = streams
        .borrow_mut()
        .admit(request.user, request.long_running, || {
            let turn = Rc::new(Turn::default());
            queued_turn = Some(turn.clone());
            turn
        })?;
    Ok(match (admission, queued_turn) {
        (Admission::Queued(ticket), Some(turn)) => Asked::Queued(ticket, turn),
        _ => Asked::Held(ShareHeld {
            streams: streams.clone(),
            long_running: request.long_running,
        }),
    })
}

/// Waits (at most `max_wait`) for the turn of a request [`ask_turn`] queued; the stream it gets
/// is held until the returned share drops. Dropped early, the request leaves its queue.
pub(crate) async fn wait_turn(
    streams: &Rc<SharedStreams>,
    request: ClientTurn<'_>,
    (ticket, turn): (Ticket, Rc<Turn>),
    max_wait: Duration,
    (metrics, worker): (Rc<LevelMetrics>, usize),
) -> Result<ShareHeld, FairShareRefusal> {
    metrics.waiting.inc(worker);
    let mut waiting = Waiting {
        streams,
        request,
        ticket,
        turn,
        metrics: &metrics,
        worker,
        since: Instant::now(),
        taken: false,
    };
    let turn_comes = poll_fn(|cx| {
        if waiting.turn.granted.get() {
            return Poll::Ready(());
        }
        waiting.turn.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    });
    match monoio::time::timeout(max_wait, turn_comes).await {
        Ok(()) => {
            waiting.taken = true;
            drop(waiting);
            Ok(ShareHeld {
                streams: streams.clone(),
                long_running: request.long_running,
            })
        }
        Err(_) => Err(FairShareRefusal::QueueWait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fair_metrics::FairShareMetrics;
    use sluice_gateway::fair_share::StreamLimits;

    fn server(capacity: u32) -> Rc<SharedStreams> {
        let limits = StreamLimits {
            capacity,
            long_running_percent: 50,
            max_queued_per_user: 4,
            max_queued: 4,
        };
        Rc::new(RefCell::new(StreamQueue::new(limits)))
    }

    fn turn(user: &'static str) -> ClientTurn<'static> {
        ClientTurn {
            user,
            long_running: false,
            level: None,
        }
    }

    #[test]
    fn a_waiting_request_gets_the_freed_stream_and_a_late_one_leaves_its_queue() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(async {
            let server = server(1);
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Rc::new(FairShareMetrics::register(&mut registry, 1).level("c", None));
            let Ok(Asked::Held(alices)) = ask_turn(&server, turn("alice")) else {
                panic!("the free stream is alice's at once");
            };
            // Alice holds the only stream: bob waits, and past his limit leaves the queue.
            let Ok(Asked::Queued(ticket, queued)) = ask_turn(&server, turn("bob")) else {
                panic!("bob queues");
            };
            let late = wait_turn(
                &server,
                turn("bob"),
                (ticket, queued),
                Duration::from_millis(20),
                (metrics.clone(), 0),
            )
            .await;
            assert_eq!(late.unwrap_err(), FairShareRefusal::QueueWait);
            assert_eq!(server.borrow().queued(), 0);
            assert_eq!(metrics.waiting.get(0), 0);

            // Bob queues again; alice's stream, freed while he waits, is his.
            let Ok(Asked::Queued(ticket, queued)) = ask_turn(&server, turn("bob")) else {
                panic!("bob queues");
            };
            let waiting = {
                let (server, metrics) = (server.clone(), metrics.clone());
                monoio::spawn(async move {
                    let long = Duration::from_secs(3600);
                    let held =
                        wait_turn(&server, turn("bob"), (ticket, queued), long, (metrics, 0));
                    held.await.map(|held| held.long_running)
                })
            };
            monoio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(metrics.waiting.get(0), 1);
            drop(alices);
            assert_eq!(waiting.await, Ok(false));
            assert_eq!(server.borrow().in_use(), 0, "bob's share is dropped");
        });
    }

    #[test]
    fn a_turn_granted_to_a_request_that_went_away_is_passed_on() {
        let server = server(1);
        let Ok(Asked::Held(first)) = ask_turn(&server, turn("alice")) else {
            panic!("held");
        };
        let Ok(Asked::Queued(ticket, queued)) = ask_turn(&server, turn("bob")) else {
            panic!("queued");
        };
        let Ok(Asked::Queued(..)) = ask_turn(&server, turn("carol")) else {
            panic!("queued");
        };
        drop(first);
        assert!(queued.granted.get(), "bob's turn came");
        // ... but bob's request was dropped before it saw it (its client went away).
        let metrics = FairShareMetrics::register(&mut Default::default(), 1).level("c", None);
        metrics.waiting.inc(0);
        drop(Waiting {
            streams: &server,
            request: turn("bob"),
            ticket,
            turn: queued,
            metrics: &metrics,
            worker: 0,
            since: Instant::now(),
            taken: false,
        });
        let queue = server.borrow();
        assert_eq!((queue.in_use(), queue.queued()), (1, 0), "carol has it");
    }
}
