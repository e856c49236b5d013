use super::*;

fn limits(capacity: u32) -> StreamLimits {
    StreamLimits {
        capacity,
        long_running_percent: 50,
        max_queued_per_user: 3,
        max_queued: 5,
    }
}

/// Releases one stream; the waiters granted by it, in order.
fn release(queue: &mut StreamQueue<&'static str>, long_running: bool) -> Vec<&'static str> {
    let mut granted = Vec::new();
    queue.release(long_running, |_, waiter| granted.push(waiter));
    granted
}

#[test]
fn a_free_stream_is_granted_at_once_and_a_full_server_queues() {
    let mut queue = StreamQueue::new(limits(2));
    assert_eq!(queue.admit("alice", false, || "a1"), Ok(Admission::Granted));
    assert_eq!(queue.admit("bob", false, || "b1"), Ok(Admission::Granted));
    assert!(matches!(
        queue.admit("alice", false, || "a2"),
        Ok(Admission::Queued(_))
    ));
    assert_eq!((queue.in_use(), queue.queued()), (2, 1));
    assert_eq!(release(&mut queue, false), ["a2"]);
    assert_eq!((queue.in_use(), queue.queued()), (2, 0));
}

#[test]
fn freed_streams_go_to_users_in_turn_not_in_arrival_order() {
    let mut queue = StreamQueue::new(StreamLimits {
        max_queued_per_user: 10,
        max_queued: 20,
        ..limits(1)
    });
    assert_eq!(
        queue.admit("greedy", false, || "g0"),
        Ok(Admission::Granted)
    );
    for waiter in ["g1", "g2", "g3", "g4"] {
        queue.admit("greedy", false, || waiter).unwrap();
    }
    queue.admit("alice", false, || "a1").unwrap();
    queue.admit("bob", false, || "b1").unwrap();
    let order: Vec<_> = (0..7).flat_map(|_| release(&mut queue, false)).collect();
    // alice and bob arrived behind four of greedy's, and each waited one turn only.
    assert_eq!(order, ["g1", "a1", "b1", "g2", "g3", "g4"]);
    assert_eq!((queue.in_use(), queue.queued()), (0, 0));
}

#[test]
fn queues_are_bounded_per_user_and_in_total() {
    let mut queue = StreamQueue::new(limits(1));
    queue.admit("greedy", false, || "g0").unwrap();
    for _ in 0..3 {
        queue.admit("greedy", false, || "g").unwrap();
    }
    assert_eq!(
        queue.admit("greedy", false, || "g"),
        Err(FairShareRefusal::UserQueueFull)
    );
    queue.admit("alice", false, || "a1").unwrap();
    queue.admit("bob", false, || "b1").unwrap();
    assert_eq!(queue.queued(), 5);
    assert_eq!(
        queue.admit("carol", false, || "c1"),
        Err(FairShareRefusal::QueueFull)
    );
}

#[test]
fn long_running_requests_never_hold_more_than_their_share() {
    let mut queue = StreamQueue::new(limits(10));
    assert_eq!(limits(10).long_running_cap(), 5);
    for _ in 0..5 {
        assert_eq!(queue.admit("w", true, || "w"), Ok(Admission::Granted));
    }
    // The sixth watch is refused at once (it would never leave a queue) ...
    assert_eq!(
        queue.admit("other", true, || "w"),
        Err(FairShareRefusal::ServerLongRunning)
    );
    // ... while the other half of the streams still serves short requests.
    for _ in 0..5 {
        assert_eq!(queue.admit("alice", false, || "a"), Ok(Admission::Granted));
    }
    assert_eq!(queue.in_use(), 10);
    assert!(release(&mut queue, true).is_empty());
    assert_eq!(queue.long_running(), 4);
    assert!(matches!(
        queue.admit("w", true, || "w6"),
        Ok(Admission::Granted)
    ));
}

#[test]
fn a_waiting_long_running_request_counts_against_the_share_until_cancelled() {
    let mut queue = StreamQueue::new(limits(2));
    queue.admit("alice", false, || "a1").unwrap();
    queue.admit("alice", false, || "a2").unwrap();
    let Ok(Admission::Queued(ticket)) = queue.admit("w", true, || "w1") else {
        panic!("queued");
    };
    assert_eq!(
        queue.admit("w", true, || "w2"),
        Err(FairShareRefusal::ServerLongRunning),
        "one of two streams is the long-running share"
    );
    assert!(queue.cancel("w", ticket));
    assert!(!queue.cancel("w", ticket), "cancelled once");
    assert_eq!((queue.long_running(), queue.queued()), (0, 0));
    assert!(matches!(
        queue.admit("w", true, || "w3"),
        Ok(Admission::Queued(_))
    ));
}

#[test]
fn a_cancelled_user_loses_its_turn_and_the_next_one_is_served() {
    let mut queue = StreamQueue::new(limits(1));
    queue.admit("alice", false, || "a0").unwrap();
    let Ok(Admission::Queued(bob)) = queue.admit("bob", false, || "b1") else {
        panic!("queued");
    };
    queue.admit("carol", false, || "c1").unwrap();
    assert!(queue.cancel("bob", bob));
    assert_eq!(release(&mut queue, false), ["c1"]);
    assert!(release(&mut queue, false).is_empty());
    assert_eq!((queue.in_use(), queue.queued()), (0, 0));
}

#[test]
fn more_capacity_grants_waiters_at_once_and_less_grants_nothing_new() {
    let mut queue = StreamQueue::new(limits(1));
    queue.admit("alice", false, || "a0").unwrap();
    queue.admit("alice", false, || "a1").unwrap();
    queue.admit("bob", false, || "b1").unwrap();
    let mut granted = Vec::new();
    queue.set_limits(limits(3), |_, waiter| granted.push(waiter));
    assert_eq!(granted, ["a1", "b1"]);
    queue.set_limits(limits(1), |_, _| panic!("nothing to grant"));
    assert!(release(&mut queue, false).is_empty());
    assert_eq!(queue.in_use(), 2, "over the new capacity until enough end");
}

#[test]
fn a_one_stream_server_takes_no_long_running_request_unless_all_may() {
    assert_eq!(limits(1).long_running_cap(), 0);
    let all = StreamLimits {
        long_running_percent: 100,
        ..limits(1)
    };
    assert_eq!(all.long_running_cap(), 1);
    let over = StreamLimits {
        long_running_percent: 400,
        ..limits(8)
    };
    assert_eq!(over.long_running_cap(), 8, "never more than the capacity");
}

#[test]
fn refusal_reasons_are_a_fixed_set_indexed_in_order() {
    for (index, refusal) in FairShareRefusal::ALL.iter().enumerate() {
        assert_eq!(refusal.index(), index);
        assert!(!refusal.as_str().is_empty());
    }
}

#[test]
fn a_user_holds_at_most_its_long_running_slots_and_they_free_on_drop() {
    let users = LongRunningUsers::new(2);
    let greedy = Rc::new(UserInfo::new("greedy", &[]));
    let alice = Rc::new(UserInfo::new("alice", &[]));
    let first = users.acquire(&greedy).unwrap();
    let _second = users.acquire(&greedy).unwrap();
    assert_eq!(
        users.acquire(&greedy).unwrap_err(),
        FairShareRefusal::UserLongRunning
    );
    let _alices = users.acquire(&alice).unwrap();
    assert_eq!((users.open("greedy"), users.open("alice")), (2, 1));
    drop(first);
    let _third = users.acquire(&greedy).unwrap();
    assert_eq!(users.open("greedy"), 2);
}

#[test]
fn idle_users_keep_a_bounded_number_of_entries() {
    let users = LongRunningUsers::new(5);
    for index in 0..10 * IDLE_USERS_KEPT {
        let user = Rc::new(UserInfo::new(format!("user-{index}"), &[]));
        drop(users.acquire(&user).unwrap());
    }
    assert!(users.users() <= IDLE_USERS_KEPT + 1, "{}", users.users());
    let held: Vec<_> = (0..3 * IDLE_USERS_KEPT)
        .map(|index| {
            let user = Rc::new(UserInfo::new(format!("open-{index}"), &[]));
            users.acquire(&user).unwrap()
        })
        .collect();
    assert!(
        users.users() >= 3 * IDLE_USERS_KEPT,
        "open ones always count"
    );
    drop(held);
    assert!(users.users() <= IDLE_USERS_KEPT + 1, "{}", users.users());
}

#[test]
fn a_reload_keeps_the_open_counts_under_the_new_limit() {
    let before = LongRunningUsers::new(3);
    let greedy = Rc::new(UserInfo::new("greedy", &[]));
    let held: Vec<_> = (0..3).map(|_| before.acquire(&greedy).unwrap()).collect();
    let after = LongRunningUsers::with_limit(&before, 3);
    assert!(after.acquire(&greedy).is_err(), "still counted");
    drop(held);
    assert_eq!(after.open("greedy"), 0, "freed in the new generation too");
    assert!(after.acquire(&greedy).is_ok());
}

proptest::proptest! {
    /// Whatever the mix of arrivals, releases and cancellations, the counts stay consistent
    /// and within their bounds.
    #[test]
    fn bounds_hold_under_any_sequence(steps in proptest::collection::vec((0u8..4, 0u8..4, proptest::bool::ANY), 1..200)) {
        let limits = StreamLimits { capacity: 4, long_running_percent: 50, max_queued_per_user: 2, max_queued: 5 };
        let mut queue: StreamQueue<(u8, bool)> = StreamQueue::new(limits);
        let mut held: Vec<bool> = Vec::new();
        let mut waiting: Vec<(u8, Ticket)> = Vec::new();
        for (action, user, long_running) in steps {
            let name = format!("u{user}");
            let mut granted = Vec::new();
            match action {
                0 | 1 => match queue.admit(&name, long_running, || (user, long_running)) {
                    Ok(Admission::Granted) => held.push(long_running),
                    Ok(Admission::Queued(ticket)) => waiting.push((user, ticket)),
                    Err(_) => {}
                },
                2 => if let Some(long_running) = held.pop() {
                    queue.release(long_running, |ticket, waiter| granted.push((ticket, waiter)));
                },
                _ => if let Some((user, ticket)) = waiting.pop() {
                    queue.cancel(&format!("u{user}"), ticket);
                },
            }
            for (ticket, (_, long_running)) in granted {
                waiting.retain(|(_, waiting)| *waiting != ticket);
                held.push(long_running);
            }
            proptest::prop_assert_eq!(queue.in_use() as usize, held.len());
            proptest::prop_assert!(queue.in_use() <= limits.capacity);
            proptest::prop_assert!(queue.queued() <= limits.max_queued);
            proptest::prop_assert!(queue.long_running() <= limits.long_running_cap());
            proptest::prop_assert_eq!(queue.queued() as usize, waiting.len());
        }
    }
}

#[test]
fn upgrades_of_all_users_together_are_bounded_and_counted_across_a_reload() {
    let slots = UpgradeSlots::new(2, None);
    let first = slots.acquire().unwrap();
    let _second = slots.acquire().unwrap();
    assert_eq!(
        slots.acquire().unwrap_err(),
        FairShareRefusal::ClusterUpgrades
    );
    let reloaded = UpgradeSlots::new(2, Some(&slots));
    assert!(reloaded.acquire().is_err(), "still counted after a reload");
    drop(first);
    assert_eq!(reloaded.open(), 1);
    let _third = reloaded.acquire().unwrap();
    assert_eq!(slots.open(), 2);
}
