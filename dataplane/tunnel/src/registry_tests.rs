//! Unit tests of the connection registry.
use super::*;
use std::sync::Arc;
use std::time::Duration;

/// A request not held to a cap on waiting requests: the tests that are not about it.
async fn acquire_any<T>(registry: &ConnectionRegistry<T>, agent: AgentId) -> Result<T, QueueFull> {
    acquire_capped(registry, agent, usize::MAX).await
}

/// A new request (never admitted among the waiting ones), held to `cap`.
async fn acquire_capped<T>(
    registry: &ConnectionRegistry<T>,
    agent: AgentId,
    cap: usize,
) -> Result<T, QueueFull> {
    let admitted = Cell::new(false);
    registry.acquire(agent, cap, &admitted).await
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Plays the owner of an offered tunnel: answers one claim with `value`.
fn serve_claim<T: Send + 'static>(claims: Claims<T>, value: T) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        block_on(async move {
            match claims.await {
                Ok(claim) => claim.send(value).is_ok(),
                Err(_) => false,
            }
        })
    })
}

/// Thousands of calls waiting for one agent (it restarts, or holds fewer tunnels than its
/// callers), then giving up one by one: a scan of every waiter per wait begun or ended
/// made that W^2 under the stripe's lock.
#[test]
fn many_waits_on_one_agent_end_with_a_logarithmic_number_of_prunes() {
    use std::future::Future;
    const WAITS: usize = 4_096;
    let registry = ConnectionRegistry::<u64>::new();
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let mut waits: Vec<_> = (0..WAITS)
        .map(|_| Box::pin(acquire_any(&registry, 7)))
        .collect();
    for wait in &mut waits {
        assert!(wait.as_mut().poll(&mut context).is_pending());
    }
    let prunes = |registry: &ConnectionRegistry<u64>| {
        registry.stripe(7).get(&7).map_or(0, |slot| slot.prunes)
    };
    assert_eq!(prunes(&registry), 0, "no prune while waits begin");
    // The oldest gives up first, then the rest; half-way, what is queued stays bounded.
    for _ in 0..WAITS / 2 {
        drop(waits.remove(0));
    }
    let queued = registry
        .stripe(7)
        .get(&7)
        .map_or(0, |slot| slot.waiters.len());
    assert!(queued <= WAITS, "{queued} queued for {} waits", WAITS / 2);
    let after_half = prunes(&registry);
    assert!(
        after_half <= 2,
        "{after_half} prunes for {} ended waits",
        WAITS / 2
    );
    // The oldest live waiter, behind given-up ones, is still the one served.
    let mut claims = registry.offer(7, 1, 1);
    assert!(waits[0].as_mut().poll(&mut context).is_pending());
    assert!(
        matches!(claims.try_recv(), Ok(Some(_))),
        "the offer reached the oldest live waiter"
    );
    drop(waits);
    assert_eq!(
        registry.tracked_agents(),
        0,
        "the slot goes with its last wait"
    );
}

#[test]
fn waiting_for_agents_that_never_connect_leaves_no_slot_behind() {
    let registry = ConnectionRegistry::<u64>::new();
    block_on(async {
        for agent in 1..=2_000 {
            let waited =
                monoio::time::timeout(Duration::from_micros(10), acquire_any(&registry, agent))
                    .await;
            assert!(waited.is_err());
        }
    });
    assert_eq!(
        registry.tracked_agents(),
        0,
        "every expired wait reclaimed its slot"
    );
    // A tunnel taken at once leaves no empty slot either.
    let owner = serve_claim(registry_offer(&registry), 5);
    assert_eq!(block_on(acquire_any(&registry, 3)), Ok(5));
    assert!(owner.join().unwrap());
    assert_eq!(registry.tracked_agents(), 0);
}

/// One agent's waiting requests are capped: the next is refused at once, without queueing,
/// and room comes back as waits end (served or given up), also after an eviction woke them.
#[test]
fn waits_beyond_the_cap_are_refused_at_once_and_room_comes_back() {
    use std::future::Future;
    let registry = ConnectionRegistry::<u64>::new();
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let mut waits: Vec<_> = (0..3)
        .map(|_| Box::pin(acquire_capped(&registry, 7, 3)))
        .collect();
    for wait in &mut waits {
        assert!(wait.as_mut().poll(&mut context).is_pending());
    }
    let mut over = Box::pin(acquire_capped(&registry, 7, 3));
    assert_eq!(
        over.as_mut().poll(&mut context),
        std::task::Poll::Ready(Err(QueueFull { waiting: 3 }))
    );
    // Another agent in the same stripe has its own room.
    let mut neighbour = Box::pin(acquire_capped(&registry, 7 + STRIPES as AgentId, 3));
    assert!(neighbour.as_mut().poll(&mut context).is_pending());
    // Woken by an eviction, the waits queue again, still counted once each.
    assert_eq!(registry.evict(7), 0);
    for wait in &mut waits {
        assert!(wait.as_mut().poll(&mut context).is_pending());
    }
    let mut still_over = Box::pin(acquire_capped(&registry, 7, 3));
    assert!(still_over.as_mut().poll(&mut context).is_ready());
    // Ones that had a place are held to twice the cap when they wait again.
    let admitted = Cell::new(true);
    let mut returning: Vec<_> = (0..4)
        .map(|_| Box::pin(registry.acquire(7, 3, &admitted)))
        .collect();
    let pending: Vec<bool> = returning
        .iter_mut()
        .map(|wait| wait.as_mut().poll(&mut context).is_pending())
        .collect();
    assert_eq!(
        pending,
        [true, true, true, false],
        "3 + 3 wait, the 7th is refused"
    );
    drop(returning);
    // One gives up: one more may wait.
    drop(waits.pop());
    let mut next = Box::pin(acquire_capped(&registry, 7, 3));
    assert!(next.as_mut().poll(&mut context).is_pending());
    assert_eq!(
        registry.waiting_count(),
        4,
        "three of agent 7's, one of its neighbour's"
    );
    drop((waits, next, neighbour));
    assert_eq!(
        registry.tracked_agents(),
        0,
        "the slots go with their waits"
    );
    assert_eq!(registry.waiting_count(), 0);
}

fn registry_offer(registry: &ConnectionRegistry<u64>) -> Claims<u64> {
    registry.offer(3, 1, 1)
}

#[test]
fn an_idle_tunnel_is_taken_at_once() {
    let registry = Arc::new(ConnectionRegistry::<&'static str>::new());
    let owner = serve_claim(registry.offer(7, 1, 100), "tunnel-1");
    assert_eq!(registry.idle_count(), 1);
    assert_eq!(registry.idle_by_connection(7).get(&100), Some(&1));
    assert!(registry.idle_by_connection(8).is_empty());
    assert_eq!(block_on(acquire_any(&registry, 7)), Ok("tunnel-1"));
    assert!(owner.join().unwrap());
    assert_eq!(registry.idle_count(), 0);
}

#[test]
fn a_waiting_request_gets_the_next_tunnel_from_another_thread() {
    let registry = Arc::new(ConnectionRegistry::<u64>::new());
    let remote = registry.clone();
    let offerer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let claims = remote.offer(9, 42, 1);
        block_on(async move {
            claims
                .await
                .expect("claimed")
                .send(42)
                .expect("requester waits")
        });
    });
    let got = block_on(async {
        monoio::time::timeout(Duration::from_secs(5), acquire_any(&registry, 9)).await
    });
    assert_eq!(got, Ok(Ok(42)));
    offerer.join().unwrap();
    assert_eq!(
        registry.idle_count(),
        0,
        "handed to the waiter, never queued"
    );
}

#[test]
fn a_tunnel_that_closed_while_idle_is_skipped() {
    let registry = Arc::new(ConnectionRegistry::<u64>::new());
    drop(registry.offer(3, 1, 1)); // owner gone without withdrawing
    let live = serve_claim(registry.offer(3, 2, 1), 2);
    assert_eq!(block_on(acquire_any(&registry, 3)), Ok(2));
    assert!(live.join().unwrap());
}

#[test]
fn withdraw_removes_only_idle_tunnels_and_waiters_that_gave_up_are_skipped() {
    let registry = ConnectionRegistry::<u64>::new();
    let _claims = registry.offer(5, 1, 1);
    assert!(registry.withdraw(5, 1));
    assert!(!registry.withdraw(5, 1));
    assert_eq!(registry.idle_count(), 0);

    // A request that timed out leaves a cancelled waiter; the next offer skips it and queues.
    let timed_out = block_on(async {
        monoio::time::timeout(Duration::from_millis(20), acquire_any(&registry, 5)).await
    });
    assert!(timed_out.is_err());
    let _claims = registry.offer(5, 2, 1);
    assert_eq!(registry.idle_count(), 1);
}

#[test]
fn agents_do_not_see_each_others_tunnels() {
    let registry = ConnectionRegistry::<u64>::new();
    let _claims = registry.offer(1, 1, 1);
    let other = block_on(async {
        monoio::time::timeout(Duration::from_millis(50), acquire_any(&registry, 2)).await
    });
    assert!(other.is_err(), "agent 2 has no tunnel");
    // Agent 257 shares agent 1's stripe but not its tunnels.
    let same_stripe = block_on(async {
        monoio::time::timeout(Duration::from_millis(50), acquire_any(&registry, 257)).await
    });
    assert!(same_stripe.is_err());
    assert_eq!(registry.idle_count(), 1);
}

#[test]
fn a_parked_tunnel_is_taken_without_an_owner_newest_first() {
    let registry = ConnectionRegistry::<u64>::new();
    let _offered = registry.offer(4, 1, 10);
    assert_eq!(registry.park(4, 10, 2), Ok(()));
    assert_eq!(registry.park(4, 11, 3), Ok(()));
    assert_eq!(registry.idle_count(), 3);
    assert!(registry.has_idle(4));
    let by_connection = registry.idle_by_connection(4);
    assert_eq!(by_connection.get(&10), Some(&2));
    assert_eq!(by_connection.get(&11), Some(&1));
    // Parked tunnels come first, the newest first; nothing answers a claim here.
    assert_eq!(block_on(acquire_any(&registry, 4)), Ok(3));
    assert_eq!(block_on(acquire_any(&registry, 4)), Ok(2));
    assert_eq!(registry.idle_count(), 1, "the offered one is left");
}

#[test]
fn parking_is_refused_while_requests_wait_for_an_offer() {
    let registry = Arc::new(ConnectionRegistry::<u64>::new());
    let waiting = registry.clone();
    let waiter = std::thread::spawn(move || {
        block_on(async {
            monoio::time::timeout(Duration::from_secs(5), acquire_any(&waiting, 6)).await
        })
    });
    // The waiter's slot appears when it starts waiting.
    for _ in 0..500 {
        if registry.tracked_agents() == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let refused = registry.park(6, 1, 9).err();
    assert_eq!(refused, Some(9), "the waiter needs an offer");
    let owner = serve_claim(registry.offer(6, 2, 1), 9);
    assert_eq!(waiter.join().unwrap(), Ok(Ok(9)));
    assert!(owner.join().unwrap());
    assert_eq!(registry.idle_count(), 0);
}

#[test]
fn unpark_takes_what_the_caller_picks_and_evict_drops_parked_tunnels() {
    let registry = ConnectionRegistry::<u64>::new();
    for tunnel in 1..=4 {
        registry.park(8, 1, tunnel).unwrap();
    }
    registry.park(9, 1, 50).unwrap();
    let mut odd = registry.unpark(8, |tunnel, _| tunnel % 2 == 1);
    odd.sort_unstable();
    assert_eq!(odd, vec![1, 3]);
    assert_eq!(registry.idle_count(), 3);
    let recent = registry.unpark(8, |_, since| since.elapsed() > Duration::from_secs(60));
    assert!(recent.is_empty(), "nothing was parked for a minute");
    assert!(
        registry.unpark(10, |_, _| true).is_empty(),
        "agent 10 parked nothing"
    );
    assert_eq!(registry.evict(8), 2);
    assert_eq!(registry.idle_count(), 1);
    assert_eq!(registry.unpark(9, |_, _| true), vec![50]);
    assert_eq!(registry.idle_count(), 0);
    assert_eq!(registry.tracked_agents(), 0, "emptied slots are reclaimed");
}

#[test]
fn many_threads_offering_and_acquiring_match_one_to_one() {
    let registry = Arc::new(ConnectionRegistry::<u64>::new());
    let per_side = 200;
    let offerers: Vec<_> = (0..4u64)
        .map(|thread| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                block_on(async move {
                    for index in 0..per_side / 4 {
                        let value = thread * 1000 + index as u64;
                        let claims = registry.offer(11, value, 1);
                        let claim = claims.await.expect("claimed");
                        claim.send(value).expect("requester waits");
                    }
                })
            })
        })
        .collect();
    let acquirers: Vec<_> = (0..4)
        .map(|_| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                block_on(async move {
                    let mut got = Vec::new();
                    for _ in 0..per_side / 4 {
                        got.push(acquire_any(&registry, 11).await.unwrap());
                    }
                    got
                })
            })
        })
        .collect();
    let mut all: Vec<u64> = acquirers
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    for offerer in offerers {
        offerer.join().unwrap();
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        per_side,
        "every tunnel went to exactly one request"
    );
    assert_eq!(registry.idle_count(), 0);
}
