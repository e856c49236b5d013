//! Active health checks: a background task on worker 0 asks every server of every cluster for
//! its health path (`GET /readyz` by default) each interval, as the gateway itself, on its own
//! connections. A server leaves rotation after `unhealthyThreshold` failures in a row and
//! returns after `healthyThreshold` successes; cores see the change at their next pick.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Request};
use sluice_gateway::cluster::spec::HealthCheck;
use sluice_gateway::cluster::CompiledServer;
use sluice_gateway::flow_control::CoreShare;
use sluice_runtime::{BackgroundTask, StopSignal, WorkerContext};

use crate::error::{ApiCallFailure, UpstreamFailure};
use crate::pool::CorePool;
use crate::review::excerpt;
use crate::state::Gateway;

#[derive(Debug, Clone)]
pub struct HealthChecker {
    pub gateway: Arc<Gateway>,
}

/// One server's run of probe outcomes.
#[derive(Debug, Default)]
struct Streak {
    successes: u32,
    failures: u32,
    next_check: Option<Instant>,
}

impl Streak {
    /// Counts one probe outcome; the health the server should have now, once a run of
    /// outcomes reaches its threshold (`None`: not enough in a row to say).
    fn record(&mut self, healthy: bool, thresholds: &HealthCheck) -> Option<bool> {
        if healthy {
            self.successes += 1;
            self.failures = 0;
            (self.successes >= thresholds.healthy_threshold).then_some(true)
        } else {
            self.failures += 1;
            self.successes = 0;
            (self.failures >= thresholds.unhealthy_threshold).then_some(false)
        }
    }
}

impl BackgroundTask for HealthChecker {
    fn run(
        &self,
        worker: &WorkerContext,
        stop: Arc<StopSignal>,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        let gateway = self.gateway.clone();
        let worker = worker.index;
        Box::pin(async move {
            // Its own connections (one per server), so probes never queue behind client load.
            let pool = CorePool::new(CoreShare::SINGLE, &gateway.metrics, worker);
            let mut streaks: HashMap<(Box<str>, Box<str>), Streak> = HashMap::new();
            loop {
                let round = check_due(&gateway, &pool, &mut streaks);
                monoio::select! {
                    _ = round => {}
                    _ = stop.wait() => return,
                }
                monoio::select! {
                    _ = monoio::time::sleep(std::time::Duration::from_millis(100)) => {}
                    _ = stop.wait() => return,
                }
            }
        })
    }
}

async fn check_due(
    gateway: &Gateway,
    pool: &CorePool,
    streaks: &mut HashMap<(Box<str>, Box<str>), Streak>,
) {
    let generation = gateway.current();
    let now = Instant::now();
    let mut due = Vec::new();
    for (cluster_index, cluster) in generation.snapshot.clusters().iter().enumerate() {
        for (server_index, server) in cluster.servers.iter().enumerate() {
            if server.disabled {
                continue;
            }
            let streak = streaks
                .entry((cluster.name.clone(), server.endpoint.clone()))
                .or_default();
            if streak.next_check.is_none_or(|next| next <= now) {
                streak.next_check = Some(now + probe_interval(server, &cluster.health_check));
                due.push((cluster_index, server_index));
            }
        }
    }
    let probes = due.into_iter().map(|(cluster_index, server_index)| {
        let generation = generation.clone();
        async move {
            let healthy = probe(pool, gateway, &generation, (cluster_index, server_index)).await;
            (cluster_index, server_index, healthy)
        }
    });
    for (cluster_index, server_index, outcome) in futures_util::future::join_all(probes).await {
        let cluster = &generation.snapshot.clusters()[cluster_index];
        let server = &cluster.servers[server_index];
        let health = &generation.clusters[cluster_index].health[server_index];
        let Some(streak) = streaks.get_mut(&(cluster.name.clone(), server.endpoint.clone())) else {
            continue;
        };
        match (
            streak.record(outcome.is_ok(), &cluster.health_check),
            &outcome,
        ) {
            (Some(true), _) if health.set(true) => {
                tracing::info!(cluster = %cluster.name, server = %server.endpoint, "upstream healthy again: back in rotation");
            }
            (Some(false), Err(why)) if health.set(false) => {
                tracing::warn!(cluster = %cluster.name, server = %server.endpoint, %why, "upstream unhealthy: out of rotation");
            }
            _ => {}
        }
    }
}

/// How often a server is probed: an agent server's probe asks only whether the agent is
/// connected (this process's registry, else one locator lookup), so it runs at least every
/// second and a returning agent is back in rotation within about a second.
fn probe_interval(server: &CompiledServer, check: &HealthCheck) -> Duration {
    match server.agent {
        Some(_) => check.interval.min(AGENT_PROBE_INTERVAL),
        None => check.interval,
    }
}

const AGENT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

async fn probe(
    pool: &CorePool,
    gateway: &Gateway,
    generation: &crate::state::Generation,
    (cluster_index, server_index): (usize, usize),
) -> Result<(), ApiCallFailure> {
    let cluster = &generation.snapshot.clusters()[cluster_index];
    let runtime = &generation.clusters[cluster_index];
    let server = &cluster.servers[server_index];
    if let Some(agent) = server.agent {
        let connected = match gateway.agent_path() {
            Some(path) => path.link.connected(agent).await,
            None => false,
        };
        return match connected {
            true => Ok(()),
            false => Err(ApiCallFailure::AgentNotConnected { agent }),
        };
    }
    let check = async {
        let (send, _slot) = pool
            .stream(
                &cluster.name,
                server,
                &runtime.client_tls,
                &cluster.connection_pool,
            )
            .await?;
        let mut send = send.ready().await.map_err(UpstreamFailure::Ready)?;
        let scheme = if server.tls { "https" } else { "http" };
        let mut request = Request::get(format!(
            "{scheme}://{}:{}{}",
            server.host, server.port, cluster.health_check.path
        ))
        .body(())?;
        request
            .headers_mut()
            .insert(http::header::ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(bearer) = &runtime.bearer {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, bearer.clone());
        }
        let (response, _) = send
            .send_request(request, true)
            .map_err(UpstreamFailure::Send)?;
        let response = response.await.map_err(UpstreamFailure::Response)?;
        let status = response.status();
        let mut body = response.into_body();
        // Read to the end (the stream slot frees then); keep the start for the log.
        let mut start = Vec::new();
        while let Some(chunk) = poll_fn(|cx| body.poll_data(cx)).await {
            let chunk = chunk.map_err(UpstreamFailure::Response)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if start.len() < 256 {
                start.extend_from_slice(&chunk[..chunk.len().min(256 - start.len())]);
            }
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(ApiCallFailure::Status {
                path: cluster.health_check.path.as_str().into(),
                status,
                excerpt: excerpt(&start),
            })
        }
    };
    match monoio::time::timeout(cluster.health_check.timeout, check).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ApiCallFailure::Timeout {
            path: cluster.health_check.path.as_str().into(),
            timeout: cluster.health_check.timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds(healthy: u32, unhealthy: u32) -> HealthCheck {
        HealthCheck {
            healthy_threshold: healthy,
            unhealthy_threshold: unhealthy,
            ..HealthCheck::default()
        }
    }

    #[test]
    fn a_server_leaves_rotation_after_the_unhealthy_threshold_in_a_row() {
        let thresholds = thresholds(2, 3);
        let mut streak = Streak::default();
        assert_eq!(streak.record(false, &thresholds), None);
        assert_eq!(streak.record(false, &thresholds), None);
        assert_eq!(streak.record(false, &thresholds), Some(false));
        assert_eq!(
            streak.record(false, &thresholds),
            Some(false),
            "stays out while failing"
        );
    }

    #[test]
    fn a_success_breaks_a_run_of_failures() {
        let thresholds = thresholds(2, 3);
        let mut streak = Streak::default();
        for _ in 0..5 {
            assert_eq!(streak.record(false, &thresholds), None);
            assert_eq!(streak.record(false, &thresholds), None);
            assert_eq!(streak.record(true, &thresholds), None);
        }
    }

    #[test]
    fn a_server_returns_after_the_healthy_threshold_in_a_row() {
        let thresholds = thresholds(2, 1);
        let mut streak = Streak::default();
        assert_eq!(streak.record(false, &thresholds), Some(false));
        assert_eq!(streak.record(true, &thresholds), None);
        assert_eq!(streak.record(false, &thresholds), Some(false));
        assert_eq!(streak.record(true, &thresholds), None);
        assert_eq!(streak.record(true, &thresholds), Some(true));
    }
}
