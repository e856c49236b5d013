//! Keeping nodes connected: one loop per node dials, runs a pool of idle tunnels on the
//! connection until it dies, backs off, and dials again. How many tunnels to open and how long
//! to back off are plain functions, tested below.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use event_listener::Event;
use sluice_config::{Endpoint, PoolConfig};
use sluice_grpc::transport::ClientConnection;
use sluice_runtime::StopSignal;

use super::tunnel::tunnel;
use super::{dial, AgentShared};
use crate::error::{ErrorKind, TunnelError};

/// How a node connection's pool ended.
pub(super) enum PoolEnd {
    Stopped,
    Lost,
    Refused(TunnelError),
    /// The node is draining (or retiring the connection): tunnels go on a new connection
    /// now, while calls in flight finish on the old one.
    Moved,
}

/// Tunnel counts of one node connection.
#[derive(Default)]
pub(super) struct Pool {
    pub(super) open: Cell<usize>,
    pub(super) idle: Cell<usize>,
    pub(super) refused: RefCell<Option<TunnelError>>,
    /// A tunnel was closed because the node's connection goes away (`TunnelEnd::Moved`).
    pub(super) moving: Cell<bool>,
    pub(super) changed: Event,
}

/// Tunnels to open now so that at least `min_idle` wait on the node, growing `grow_by` at a
/// time, never more than `max` open.
pub(super) fn tunnels_to_open(idle: usize, open: usize, pool: &PoolConfig) -> usize {
    if idle < pool.min_idle && open < pool.max {
        pool.grow_by.min(pool.max - open)
    } else {
        0
    }
}

/// The backoff after `current`: doubled, at most `max`.
pub(super) fn next_backoff(current: Duration, max: Duration) -> Duration {
    (current * 2).min(max)
}

/// `base` plus up to 20% (from `nanos`, any changing number), so many agents restarted
/// together do not reconnect in lockstep.
pub(super) fn jitter(base: Duration, nanos: u32) -> Duration {
    base + base.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

/// A per-process, per-node connection id, so ListConnectedAgents tells agent processes apart.
pub(super) fn connection_id(index: usize, nanos: u64, pid: u32) -> i64 {
    let mixed =
        (nanos ^ (u64::from(pid) << 32) ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 1) as i64
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Keeps one node connected: dial, run the tunnel pool until the connection dies, back off
/// (doubling from the initial to the maximum backoff, with jitter), repeat.
pub(super) async fn node_loop(
    agent: Rc<AgentShared>,
    node: Endpoint,
    index: usize,
    stop: Arc<StopSignal>,
) {
    let config = &agent.task.config;
    let metrics = &agent.task.metrics;
    let connection_id = connection_id(index, since_epoch().as_nanos() as u64, std::process::id());
    let mut backoff = config.reconnect.initial_backoff;
    while !stop.is_fired() {
        let dialled = dial(
            &node,
            &agent.task.node_tls,
            &agent.settings,
            ErrorKind::NodeGone,
        )
        .await;
        match dialled {
            Ok(connection) => {
                tracing::info!(node = %node.url, connection_id, "connected to node");
                metrics.nodes_connected.inc(0);
                let outcome = run_pool(&agent, connection, connection_id, &stop).await;
                metrics.nodes_connected.dec(0);
                match outcome {
                    PoolEnd::Stopped => return,
                    PoolEnd::Moved => {
                        // At once, no backoff: behind a load balancer this reaches another
                        // node; a restarting node refuses, and the backoff starts from its
                        // initial value.
                        tracing::info!(node = %node.url, connection_id, "node is draining; opening tunnels on a new connection while calls finish on the old one");
                        metrics.moves.inc(0);
                        backoff = config.reconnect.initial_backoff;
                        continue;
                    }
                    PoolEnd::Lost => {
                        tracing::warn!(node = %node.url, "connection to node lost; reconnecting");
                        backoff = config.reconnect.initial_backoff;
                    }
                    PoolEnd::Refused(why) => {
                        tracing::error!(node = %node.url, %why, "node refused the agent");
                        metrics.connect_failures.inc(0);
                    }
                }
            }
            Err(why) => {
                tracing::warn!(node = %node.url, %why, retry_in = ?backoff, "cannot connect to node");
                metrics.connect_failures.inc(0);
            }
        }
        monoio::select! {
            _ = monoio::time::sleep(jitter(backoff, since_epoch().subsec_nanos())) => {}
            _ = stop.wait() => return,
        }
        backoff = next_backoff(backoff, config.reconnect.max_backoff);
    }
}

/// Opens tunnels as [`tunnels_to_open`] says, until the connection ends.
async fn run_pool(
    agent: &Rc<AgentShared>,
    connection: ClientConnection,
    connection_id: i64,
    stop: &Arc<StopSignal>,
) -> PoolEnd {
    let pool_config = &agent.task.config.pool;
    let pool = Rc::new(Pool::default());
    let ClientConnection {
        send_request,
        mut driver,
    } = connection;
    loop {
        if let Some(why) = pool.refused.borrow_mut().take() {
            return PoolEnd::Refused(why);
        }
        if pool.moving.get() {
            // No new tunnel on this connection: the node would not take it. The tunnels still
            // carrying calls keep the connection open until they end; then it closes.
            drop(send_request);
            sluice_runtime::spawn_contained(
                "agent-old-connection",
                finish_old(driver, stop.clone()),
            );
            return PoolEnd::Moved;
        }
        for _ in 0..tunnels_to_open(pool.idle.get(), pool.open.get(), pool_config) {
            pool.open.set(pool.open.get() + 1);
            sluice_runtime::spawn_contained(
                "agent-tunnel",
                tunnel(
                    agent.clone(),
                    pool.clone(),
                    send_request.clone(),
                    connection_id,
                    stop.clone(),
                ),
            );
        }
        let changed = pool.changed.listen();
        monoio::select! {
            _ = changed => {}
            _ = &mut driver => {
                // The tunnels end with their connection; one may have read the node's drain
                // UNAVAILABLE just before it closed (an idle connection closes at once).
                let _ = monoio::time::timeout(Duration::from_secs(1), all_ended(&pool)).await;
                return if pool.moving.get() { PoolEnd::Moved } else { PoolEnd::Lost };
            }
            _ = stop.wait() => break,
        }
    }
    // Stopping: every tunnel task sees the stop and closes its stream. Close the connection only
    // then, and wait for its driver, so the socket is really closed before this worker's runtime
    // ends (monoio does not run the tasks of a finished runtime, which would leave the node
    // waiting for this connection until its drain deadline).
    drop(send_request);
    let closed = async {
        all_ended(&pool).await;
        driver.await;
    };
    let _ = monoio::time::timeout(Duration::from_secs(2), closed).await;
    PoolEnd::Stopped
}

/// Returns once no tunnel of the pool is open.
async fn all_ended(pool: &Pool) {
    while pool.open.get() > 0 {
        let changed = pool.changed.listen();
        if pool.open.get() == 0 {
            break;
        }
        changed.await;
    }
}

/// Lets a connection the agent moved away from close by itself (its last call done), or, if
/// the agent stops first, gives it the stop's grace like [`run_pool`] does.
async fn finish_old(mut driver: monoio::task::JoinHandle<Option<()>>, stop: Arc<StopSignal>) {
    monoio::select! {
        _ = &mut driver => {}
        _ = stop.wait() => {
            let _ = monoio::time::timeout(Duration::from_secs(2), driver).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(min_idle: usize, max: usize, grow_by: usize) -> PoolConfig {
        PoolConfig {
            min_idle,
            max,
            grow_by,
            idle_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_pool_grows_by_steps_until_enough_tunnels_are_idle() {
        let config = pool(2, 500, 10);
        assert_eq!(
            tunnels_to_open(0, 0, &config),
            10,
            "an empty pool grows by a step"
        );
        assert_eq!(
            tunnels_to_open(1, 40, &config),
            10,
            "busy tunnels do not count as idle"
        );
        assert_eq!(tunnels_to_open(2, 40, &config), 0, "enough idle tunnels");
        assert_eq!(tunnels_to_open(5, 5, &config), 0);
    }

    #[test]
    fn the_pool_never_opens_more_than_its_maximum() {
        let config = pool(2, 500, 10);
        assert_eq!(tunnels_to_open(0, 495, &config), 5, "only the room left");
        assert_eq!(tunnels_to_open(0, 500, &config), 0, "full");
        assert_eq!(tunnels_to_open(0, 0, &pool(4, 3, 10)), 3);
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum() {
        let max = Duration::from_secs(20);
        let mut backoff = Duration::from_secs(1);
        let mut seen = Vec::new();
        for _ in 0..7 {
            seen.push(backoff.as_secs());
            backoff = next_backoff(backoff, max);
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 20, 20]);
    }

    #[test]
    fn jitter_adds_at_most_a_fifth() {
        let base = Duration::from_secs(10);
        assert_eq!(jitter(base, 0), base);
        for nanos in [1, 499, 999, 123_456_789, u32::MAX] {
            let jittered = jitter(base, nanos);
            assert!(
                jittered >= base && jittered < base + base / 5,
                "{jittered:?}"
            );
        }
    }

    #[test]
    fn connection_ids_are_positive_and_differ_by_node() {
        let ids: Vec<i64> = (0..4)
            .map(|index| connection_id(index, 1_234_567, 42))
            .collect();
        assert!(ids.iter().all(|id| *id >= 0));
        for (i, a) in ids.iter().enumerate() {
            assert!(ids[i + 1..].iter().all(|b| b != a), "{ids:?}");
        }
        assert_ne!(
            connection_id(0, 1, 42),
            connection_id(0, 2, 42),
            "processes differ"
        );
    }
}
