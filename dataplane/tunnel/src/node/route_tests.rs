#![allow(clippy::unwrap_used)]

use sluice_grpc::Code;
use sluice_locator::NodeEntry;

use super::*;

const AGENT: AgentId = 7;
const MAX_WAIT: Duration = Duration::from_secs(5);

fn peer(name: &str, port: u16) -> Peer {
    (name.to_string(), SocketAddr::from(([10, 0, 0, 1], port)))
}

fn cluster_call(now: Instant) -> RouteState {
    RouteState::new(AGENT, None, MAX_WAIT, true, now)
}

fn give_up(step: RouteStep) -> TunnelError {
    match step {
        RouteStep::GiveUp(error) => error,
        other => panic!("expected to give up, got {other:?}"),
    }
}

#[test]
fn local_hit_claims_the_idle_tunnel_and_counts_as_local() {
    let now = Instant::now();
    let mut state = RouteState::new(AGENT, None, MAX_WAIT, false, now);
    assert_eq!(state.start(), RouteStep::Look { retried: false });
    let step = state.next_step(RouteEvent::Looked { idle_here: true }, now);
    assert_eq!(
        step,
        RouteStep::ClaimLocal {
            until: now + ROUTE_POLL.min(MAX_WAIT)
        }
    );
    assert_eq!(state.local_label(), "local");
}

#[test]
fn a_claim_that_does_not_come_looks_again_before_the_wait_ends() {
    // The idle tunnel seen was closed (a drain) or taken: after at most a poll the call asks
    // the locator, instead of waiting its whole max_wait for this node.
    let now = Instant::now();
    let mut state = RouteState::new(AGENT, None, Duration::from_secs(60), true, now);
    let step = state.next_step(RouteEvent::Looked { idle_here: true }, now);
    assert_eq!(
        step,
        RouteStep::ClaimLocal {
            until: now + ROUTE_POLL
        }
    );
    let later = now + ROUTE_POLL;
    let step = state.next_step(RouteEvent::ClaimTimedOut, later);
    assert!(matches!(step, RouteStep::Locate { .. }), "{step:?}");
}

#[test]
fn without_a_local_tunnel_a_cluster_node_asks_the_locator_from_its_cache_first() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let step = state.next_step(RouteEvent::Looked { idle_here: false }, now);
    assert_eq!(
        step,
        RouteStep::Locate {
            fresh: false,
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn remote_hit_races_every_listed_node() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::Looked { idle_here: false }, now);
    let peers = [peer("b", 1), peer("c", 2)];
    let step = state.next_step(RouteEvent::Located(peers.to_vec()), now);
    assert_eq!(
        step,
        RouteStep::Race {
            candidates: peers.to_vec(),
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn all_candidates_failing_routes_again_afresh_without_them() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let peers = [peer("b", 1), peer("c", 2)];
    state.next_step(RouteEvent::Located(peers.to_vec()), now);
    let step = state.next_step(RouteEvent::RaceLost(&peers), now);
    assert_eq!(step, RouteStep::Look { retried: true });
    let step = state.next_step(RouteEvent::Looked { idle_here: false }, now);
    assert_eq!(
        step,
        RouteStep::Locate {
            fresh: true,
            until: now + MAX_WAIT
        },
        "a lost race bypasses the cached listing"
    );
    // The same nodes listed again are not raced again. They answered (refused: going away,
    // as in a rolling restart), so the call waits for the agent to arrive elsewhere.
    let later = now + Duration::from_millis(10);
    let step = state.next_step(RouteEvent::Located(peers.to_vec()), later);
    assert_eq!(
        step,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: Some(ROUTE_POLL)
        }
    );
    // A node not tried yet is called (directly: it is the only one left).
    let more = [peer("b", 1), peer("d", 3)];
    let step = state.next_step(RouteEvent::Located(more.to_vec()), later);
    assert_eq!(
        step,
        RouteStep::Direct {
            candidate: peer("d", 3),
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn one_candidate_is_called_directly_and_several_are_raced() {
    let until = Instant::now() + MAX_WAIT;
    assert_eq!(
        RouteStep::remote(vec![peer("b", 1)], until),
        RouteStep::Direct {
            candidate: peer("b", 1),
            until
        }
    );
    for count in 2..5u16 {
        let candidates: Vec<Peer> = (0..count).map(|port| peer("n", port)).collect();
        assert_eq!(
            RouteStep::remote(candidates.clone(), until),
            RouteStep::Race { candidates, until },
            "{count} candidates"
        );
    }
}

#[test]
fn a_located_single_node_is_called_directly() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::Looked { idle_here: false }, now);
    let step = state.next_step(RouteEvent::Located(vec![peer("b", 1)]), now);
    assert_eq!(
        step,
        RouteStep::Direct {
            candidate: peer("b", 1),
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn a_direct_call_unconfirmed_before_any_body_byte_left_is_routed_again_without_that_node() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let b = peer("b", 1);
    state.next_step(RouteEvent::Located(vec![b.clone()]), now);
    let refused = TunnelError::new(
        ErrorKind::PeerUnavailable,
        "node b: answered without a tunnel",
    );
    let step = state.next_step(
        RouteEvent::Unconfirmed {
            peer: &b,
            error: refused,
            forwarded: false,
        },
        now,
    );
    assert_eq!(step, RouteStep::Look { retried: true }, "as a lost race");
    let step = state.next_step(RouteEvent::Looked { idle_here: false }, now);
    assert_eq!(
        step,
        RouteStep::Locate {
            fresh: true,
            until: now + MAX_WAIT
        }
    );
    let step = state.next_step(RouteEvent::Located(vec![b]), now);
    assert_eq!(
        step,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: Some(ROUTE_POLL)
        },
        "the node that answered without a tunnel is not called again; the agent may move"
    );
    let error = give_up(state.next_step(RouteEvent::Expired, now + MAX_WAIT));
    assert_eq!(error.code(), Code::DeadlineExceeded);
}

/// The holding node refused the call for a share it is over (its calls waiting for the agent,
/// tunnel.max_waiting_calls_per_agent): the client hears it at once, whether or not body bytes
/// went out, instead of waiting here for a tunnel only that node holds.
#[test]
fn a_node_over_its_share_ends_the_call_at_once() {
    let now = Instant::now();
    let b = peer("b", 1);
    for forwarded in [false, true] {
        let mut state = cluster_call(now);
        state.next_step(RouteEvent::Located(vec![b.clone()]), now);
        let refused = TunnelError::new(ErrorKind::PeerUnavailable, "node b: 1 calls already wait")
            .with_code(Code::ResourceExhausted);
        let error = give_up(state.next_step(
            RouteEvent::Unconfirmed {
                peer: &b,
                error: refused.clone(),
                forwarded,
            },
            now,
        ));
        assert_eq!(error, refused, "forwarded: {forwarded}");
    }
    // A race every node refused so (the router's `RaceEnd::Refused`).
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::Located(vec![b.clone(), peer("c", 2)]), now);
    let over = TunnelError::new(ErrorKind::OverShare, "node b: ...; node c: ...");
    let error = give_up(state.next_step(
        RouteEvent::Failed {
            error: over.clone(),
            replied: false,
        },
        now,
    ));
    assert_eq!(error.code(), Code::ResourceExhausted);
}

#[test]
fn a_direct_call_unconfirmed_after_its_body_went_out_is_not_routed_again() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let b = peer("b", 1);
    state.next_step(RouteEvent::Located(vec![b.clone()]), now);
    let refused = TunnelError::new(
        ErrorKind::PeerUnavailable,
        "node b: answered without a tunnel",
    );
    let error = give_up(state.next_step(
        RouteEvent::Unconfirmed {
            peer: &b,
            error: refused.clone(),
            forwarded: true,
        },
        now,
    ));
    assert_eq!(error, refused);
    assert_eq!(error.code(), Code::Unavailable);
}

#[test]
fn a_direct_call_that_outlives_its_wait_ends_as_a_race_does() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::Located(vec![peer("b", 1)]), now);
    let error = give_up(state.next_step(RouteEvent::Expired, now + MAX_WAIT));
    assert_eq!(error.code(), Code::DeadlineExceeded);
    assert_eq!(
        error.message(),
        format!("agent {AGENT} has no free tunnel in the cluster after waiting {MAX_WAIT:?}")
    );
}

#[test]
fn a_failure_before_any_reply_is_retried_only_when_its_kind_allows() {
    let now = Instant::now();
    let mut state = RouteState::new(AGENT, None, MAX_WAIT, false, now);
    let stale = TunnelError::new(ErrorKind::StaleTunnel, "tunnel broke while idle");
    let step = state.next_step(
        RouteEvent::Failed {
            error: stale.clone(),
            replied: false,
        },
        now,
    );
    assert_eq!(step, RouteStep::Look { retried: true });
    // After part of the answer went out, the same failure is final.
    let error = give_up(state.next_step(
        RouteEvent::Failed {
            error: stale,
            replied: true,
        },
        now,
    ));
    assert_eq!(error.kind(), ErrorKind::StaleTunnel);
    // A kind that does not allow a retry is final even before any reply.
    let gone = TunnelError::new(ErrorKind::AgentGone, "agent went away");
    let error = give_up(state.next_step(
        RouteEvent::Failed {
            error: gone,
            replied: false,
        },
        now,
    ));
    assert_eq!(error.code(), Code::Unavailable);
}

#[test]
fn max_wait_bounds_the_wait_when_it_ends_before_the_deadline() {
    let now = Instant::now();
    let deadline = now + Duration::from_secs(60);
    let mut state = RouteState::new(AGENT, Some(deadline), MAX_WAIT, false, now);
    assert_eq!(state.wait_until(), now + MAX_WAIT);
    let step = state.next_step(RouteEvent::Looked { idle_here: false }, now);
    assert_eq!(
        step,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: None
        }
    );
    let error = give_up(state.next_step(RouteEvent::Expired, now + MAX_WAIT));
    assert_eq!(error.kind(), ErrorKind::NoTunnel);
    assert_eq!(error.code(), Code::DeadlineExceeded);
    assert_eq!(
        error.message(),
        "agent 7 has no free tunnel on this node after waiting 5s"
    );
}

#[test]
fn the_deadline_bounds_the_wait_when_it_comes_first() {
    let now = Instant::now();
    let deadline = now + Duration::from_millis(300);
    let mut state = RouteState::new(AGENT, Some(deadline), MAX_WAIT, true, now);
    assert_eq!(state.wait_until(), deadline);
    let error = give_up(state.next_step(RouteEvent::Expired, deadline));
    assert_eq!(error.kind(), ErrorKind::DeadlineExceeded);
    assert_eq!(error.code(), Code::DeadlineExceeded);
    assert_eq!(
        error.message(),
        "deadline exceeded while waiting for a tunnel of agent 7"
    );
}

#[test]
fn a_cluster_call_out_of_time_names_the_cluster() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let error = give_up(state.next_step(RouteEvent::Looked { idle_here: false }, now + MAX_WAIT));
    assert_eq!(
        error.message(),
        "agent 7 has no free tunnel in the cluster after waiting 5s"
    );
}

#[test]
fn an_arrival_wakes_the_wait_and_the_next_lookup_is_fresh() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::Looked { idle_here: false }, now);
    let step = state.next_step(RouteEvent::Located(Vec::new()), now);
    assert_eq!(
        step,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: Some(ROUTE_POLL)
        }
    );
    let later = now + Duration::from_millis(50);
    assert_eq!(
        state.next_step(RouteEvent::Woken, later),
        RouteStep::Look { retried: false }
    );
    // The agent arrived on this node: its tunnel counts as "waited".
    assert!(matches!(
        state.next_step(RouteEvent::Looked { idle_here: true }, later),
        RouteStep::ClaimLocal { .. }
    ));
    assert_eq!(state.local_label(), "waited");
    // Or it arrived elsewhere: the locator is asked afresh.
    assert_eq!(
        state.next_step(RouteEvent::Looked { idle_here: false }, later),
        RouteStep::Locate {
            fresh: true,
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn a_locator_failure_waits_a_grace_for_local_tunnels_then_fails_unavailable() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    assert_eq!(
        state.next_step(RouteEvent::LocatorFailed, now),
        RouteStep::Wait {
            until: now + REMOTE_FAILURE_GRACE,
            poll: Some(ROUTE_POLL)
        }
    );
    // A tunnel arriving here within the grace still serves the call.
    assert!(matches!(
        state
            .clone()
            .next_step(RouteEvent::Looked { idle_here: true }, now),
        RouteStep::ClaimLocal { .. }
    ));
    let error = give_up(state.next_step(RouteEvent::Expired, now + REMOTE_FAILURE_GRACE));
    assert_eq!(error.code(), Code::Unavailable);
    assert_eq!(error.kind(), ErrorKind::LocatorUnavailable);
    assert!(
        error.to_string().contains("tracker (Redis) did not answer"),
        "{error}"
    );
}

#[test]
fn a_locator_that_answers_again_within_the_grace_routes_the_call() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    state.next_step(RouteEvent::LocatorFailed, now);
    let later = now + Duration::from_millis(300);
    assert!(matches!(
        state.next_step(RouteEvent::Woken, later),
        RouteStep::Look { .. }
    ));
    assert!(matches!(
        state.next_step(RouteEvent::Looked { idle_here: false }, later),
        RouteStep::Locate { fresh: true, .. }
    ));
    let step = state.next_step(RouteEvent::Located(vec![peer("b", 1)]), later);
    assert!(matches!(step, RouteStep::Direct { .. }), "{step:?}");
    // Redis answered: a later wait is the node's whole wait again.
    let nobody = state.next_step(RouteEvent::Located(Vec::new()), later);
    assert_eq!(
        nobody,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: Some(ROUTE_POLL)
        }
    );
}

#[test]
fn every_listed_node_failing_ends_the_call_unavailable_after_the_grace() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let peers = [peer("b", 1)];
    state.next_step(RouteEvent::Unreachable(&peers), now);
    state.next_step(RouteEvent::Looked { idle_here: false }, now);
    state.next_step(RouteEvent::Located(peers.to_vec()), now);
    let error = give_up(state.next_step(RouteEvent::Expired, now + REMOTE_FAILURE_GRACE));
    assert_eq!(error.code(), Code::Unavailable);
    assert_eq!(error.kind(), ErrorKind::PeerUnavailable);
    assert!(
        error
            .to_string()
            .contains("held only by node b (10.0.0.1:1)"),
        "{error}"
    );
    // Past the grace, a look that finds nothing here gives up at once too.
    let mut again = cluster_call(now);
    again.next_step(RouteEvent::Unreachable(&peers), now);
    again.next_step(RouteEvent::Located(peers.to_vec()), now);
    let late = now + REMOTE_FAILURE_GRACE;
    let error = give_up(again.next_step(RouteEvent::Looked { idle_here: false }, late));
    assert_eq!(error.code(), Code::Unavailable);
}

#[test]
fn nodes_that_refused_the_call_are_waited_out_not_given_up_on() {
    // A rolling restart: the node holding the agent refuses (draining), and the agent is about
    // to reconnect elsewhere. Only a node that did not answer at all starts the short grace.
    let now = Instant::now();
    let mut state = cluster_call(now);
    let peers = [peer("b", 1)];
    state.next_step(RouteEvent::RaceLost(&peers), now);
    state.next_step(RouteEvent::Looked { idle_here: false }, now);
    let step = state.next_step(RouteEvent::Located(peers.to_vec()), now);
    assert_eq!(
        step,
        RouteStep::Wait {
            until: now + MAX_WAIT,
            poll: Some(ROUTE_POLL)
        }
    );
    let later = now + REMOTE_FAILURE_GRACE + Duration::from_millis(1);
    assert!(matches!(
        state.next_step(RouteEvent::Looked { idle_here: false }, later),
        RouteStep::Locate { .. }
    ));
    let moved = [peer("c", 2)];
    assert_eq!(
        state.next_step(RouteEvent::Located(moved.to_vec()), later),
        RouteStep::Direct {
            candidate: peer("c", 2),
            until: now + MAX_WAIT
        }
    );
}

#[test]
fn the_wait_still_ends_with_deadline_exceeded_when_no_node_ever_failed() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    assert!(matches!(
        state.next_step(RouteEvent::Located(Vec::new()), now),
        RouteStep::Wait { .. }
    ));
    let error = give_up(state.next_step(RouteEvent::Expired, now + MAX_WAIT));
    assert_eq!(error.code(), Code::DeadlineExceeded);
}

#[test]
fn a_claim_that_timed_out_gives_up_at_the_end_of_the_wait() {
    let now = Instant::now();
    let mut state = RouteState::new(AGENT, None, MAX_WAIT, false, now);
    let error = give_up(state.next_step(RouteEvent::ClaimTimedOut, now + MAX_WAIT));
    assert_eq!(error.code(), Code::DeadlineExceeded);
}

#[test]
fn a_client_reset_gives_up_without_an_answer() {
    let now = Instant::now();
    let mut state = cluster_call(now);
    let error = give_up(state.next_step(RouteEvent::ClientReset, now));
    assert_eq!(error.kind(), ErrorKind::ClientGone);
    assert_eq!(error.code(), Code::Cancelled);
}

#[test]
fn the_locator_listing_leaves_out_this_node_and_bad_addresses() {
    let entry = |node: &str, address: &str| NodeEntry {
        node: node.to_string(),
        private_address: address.to_string(),
        expires_at_unix_ms: 0,
    };
    let peers = peers_of(
        vec![
            entry("n", "10.0.0.1:1"),
            entry("b", "10.0.0.2:2"),
            entry("c", "not an address"),
        ],
        "n",
    );
    assert_eq!(
        peers,
        vec![("b".to_string(), "10.0.0.2:2".parse().unwrap())]
    );
}
