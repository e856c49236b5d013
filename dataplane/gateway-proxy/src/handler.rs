//! One core's gateway: its per-core state (upstream connections, auth caches, flow-control
//! counters, round-robin cursors, request counters), never shared with other cores, and the
//! request pipeline read top-down:
//!
//! request info -> admit (`admit.rs`: cluster, authentication, impersonation, dispatch, flow
//! control, upstream pick) -> forward (`forward.rs`) -> answer; a refusal from any phase is
//! answered in one place (`answer.rs`).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;
use sluice_gateway::cluster::spec::ConnectionPool;
use sluice_gateway::fair_share::LongRunningLimits;
use sluice_gateway::flow_control::{CoreFlowControl, CoreShare};
use sluice_gateway::identity::UserInfo;
use sluice_gateway::request_info::{decode_path, PathError, RequestInfo};
use sluice_gateway::status::GatewayError;
use sluice_metrics::{PerCoreCounter, PerCoreHistogram};

use crate::access::AccessNote;
use crate::auth::CoreAuth;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::forward_metrics::ServerKind;
use crate::pool::CorePool;
use crate::state::{Gateway, Generation};
use crate::upstream::RoundRobin;

/// Cluster names whose latency histogram a core keeps at hand (clusters are configured, so
/// this is only reached across many reloads that rename them).
const MAX_CACHED_DURATIONS: usize = 1024;

/// Request-counter label sets a core caches; more are looked up each time.
const COUNTER_CACHE_LIMIT: usize = 2_000;

/// Flow-control state per cluster, for the generation (number) it was built for.
type FlowStates = Option<(u64, HashMap<Box<str>, Rc<CoreFlowControl>>)>;

/// One core's gateway state: never shared with other cores.
pub struct GatewayHandler {
    pub gateway: Arc<Gateway>,
    pub worker: usize,
    pub share: CoreShare,
    pub pool: CorePool,
    pub auth: CoreAuth,
    /// Flow-control state of each cluster for the generation it was built for.
    flow: RefCell<FlowStates>,
    /// Round-robin cursor per (cluster, policy).
    pub round_robin: RefCell<RoundRobin>,
    counters: RefCell<CounterCache>,
    /// Latency histogram per cluster name, so observing allocates nothing once a cluster has
    /// been seen (bounded like the counters: past the cap a miss costs a family lookup).
    durations: RefCell<HashMap<Box<str>, PerCoreHistogram>>,
    /// `system:anonymous`, made once per core and shared by every anonymous request.
    pub anonymous: Rc<UserInfo>,
    /// Forwarded requests by cluster, server kind and result: this core's handles.
    forward_metrics: RefCell<crate::forward_metrics::CoreForwardMetrics>,
    /// This core's budget of refusal log lines.
    refusal_logs: RefCell<crate::answer::LogBudget>,
    /// This core's link to the tunnel node of this process (agent servers), opened on first use.
    pub(crate) agent_link: RefCell<Option<h2::client::SendRequest<bytes::Bytes>>>,
}

/// What is known about a client connection after its handshake.
pub struct ClientConnection {
    pub cluster: Box<str>,
    /// The client's address (rejected bearer tokens are limited per address).
    pub peer: std::net::IpAddr,
    /// From a client certificate the cluster's client CA verified (shared by its requests).
    pub certificate_user: Option<Rc<UserInfo>>,
}

/// A request's info, decided on its decoded path (as the apiserver will see it); a path that
/// does not decode to exactly one path, or that the apiserver cannot interpret, is a 400.
pub fn request_info<'a>(
    method: &str,
    decoded: &'a Result<Cow<'_, str>, PathError>,
    query: &'a str,
) -> Result<RequestInfo<'a>, GatewayError> {
    let path = decoded
        .as_ref()
        .map_err(|error| GatewayError::from(*error))?;
    RequestInfo::parse(method, path, query).map_err(GatewayError::from)
}

/// The decoded path of a raw one (see [`request_info`]): borrowed unless it had escapes.
pub fn decoded_path(raw: &str) -> Result<Cow<'_, str>, PathError> {
    decode_path(raw)
}

/// The verb and resource labels of a request (`unknown` when its path did not parse).
pub fn request_labels<'a>(info: &Result<RequestInfo<'a>, GatewayError>) -> (&'static str, &'a str) {
    match info {
        Ok(info) => (info.verb.as_str(), info.resource),
        Err(_) => ("unknown", ""),
    }
}

/// The `resource` label of a request: empty when it was refused before its client was
/// authenticated (nobody may grow the label set without credentials), else a bounded name (see
/// [`crate::metrics::bounded_resource_label`]).
pub fn resource_label<'a>(resource: &'a str, refusal: Option<&ProxyError>) -> &'a str {
    match refusal {
        Some(error) if error.before_authentication() => "",
        _ => crate::metrics::bounded_resource_label(resource),
    }
}

impl GatewayHandler {
    pub fn new(gateway: Arc<Gateway>, worker: usize, share: CoreShare) -> Self {
        let pool = CorePool::new(share, &gateway.metrics, worker);
        Self {
            gateway,
            worker,
            share,
            pool,
            auth: CoreAuth::default(),
            flow: RefCell::new(None),
            round_robin: RefCell::default(),
            counters: RefCell::default(),
            durations: RefCell::default(),
            anonymous: Rc::new(UserInfo::anonymous()),
            refusal_logs: RefCell::default(),
            forward_metrics: RefCell::default(),
            agent_link: RefCell::default(),
        }
    }

    /// One request, start to finish.
    pub async fn serve(
        &self,
        client: &ClientConnection,
        request: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let generation = self.gateway.current();
        // The path and query are read where the request holds them: parts and body travel
        // apart so that nothing is copied to outlive the request.
        let (parts, body) = request.into_parts();
        let (method, path) = (&parts.method, parts.uri.path());
        let decoded = decoded_path(path);
        let info = request_info(method.as_str(), &decoded, parts.uri.query().unwrap_or(""));
        let (verb, resource) = request_labels(&info);
        let note = AccessNote::default();
        let outcome = match info {
            // The newest requests are the ones shed: everything admitted before goes on.
            Ok(_) if sluice_overload::shedding() => {
                sluice_overload::count_shed(sluice_overload::Role::Gateway);
                Err(ProxyError::Overloaded)
            }
            Ok(info) => {
                self.proxy(client, &generation, &info, (&parts, &note), body)
                    .await
            }
            Err(error) => Err(error.into()),
        };
        let resource = resource_label(resource, outcome.as_ref().err());
        let response = outcome.unwrap_or_else(|error| {
            self.refuse(&error, client, method.as_str(), path);
            crate::answer::response_to(method, &error)
        });
        let status = response.status().as_u16();
        if sluice_access_log::wanted(sluice_access_log::Role::Gateway, status >= 400) {
            let exchange = crate::access::Exchange::of(&parts, &response);
            crate::access::log(
                (client.peer, &client.cluster),
                &generation,
                &exchange,
                (&note, started),
            );
        }
        self.finish(&client.cluster, (verb, resource), status, started);
        response
    }

    /// The phases of a request that may end it with an error.
    async fn proxy(
        &self,
        client: &ClientConnection,
        generation: &Arc<Generation>,
        info: &RequestInfo<'_>,
        (parts, note): (&Parts, &AccessNote),
        body: Incoming,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let admitted = self
            .admit(client, generation, info, (&parts.headers, note))
            .await?;
        let kind = ServerKind::of(
            &generation.snapshot.clusters()[admitted.cluster].servers[admitted.server],
        );
        let started = Instant::now();
        let answer = self.forward(generation, admitted, info, parts, body).await;
        let result = answer.as_ref().map(|_| ());
        self.record_forward((&client.cluster, kind), result, Some(started.elapsed()));
        answer
    }

    /// Counts and logs a refusal (the client's answer is built by the caller from the same
    /// error, see `answer.rs`).
    pub fn refuse(&self, error: &ProxyError, client: &ClientConnection, method: &str, path: &str) {
        if let ProxyError::Refused(GatewayError::FairShare { level, refusal }) = error {
            let level = level.as_ref().map(|level| &**level);
            self.pool.count_refusal(&client.cluster, level, *refusal);
        }
        crate::answer::record(
            error,
            &self.gateway.metrics,
            (self.worker, &mut self.refusal_logs.borrow_mut()),
            (&client.cluster, method, path),
        );
    }

    /// One request sent towards a server of `kind` (see `forward_metrics`).
    pub fn record_forward(
        &self,
        target: (&str, crate::forward_metrics::ServerKind),
        result: Result<(), &ProxyError>,
        head: Option<std::time::Duration>,
    ) {
        self.forward_metrics.borrow_mut().record(
            &self.gateway.metrics.forward,
            self.worker,
            target,
            result,
            head,
        );
    }

    /// Request count by (cluster, verb, resource, code) and the duration.
    pub fn finish(
        &self,
        cluster: &str,
        (verb, resource): (&'static str, &str),
        code: u16,
        started: Instant,
    ) {
        self.count(cluster, verb, resource, code);
        let seconds = started.elapsed().as_secs_f64();
        let mut durations = self.durations.borrow_mut();
        if let Some(histogram) = durations.get(cluster) {
            histogram.observe(self.worker, seconds);
            return;
        }
        let histogram = self.gateway.metrics.duration(cluster);
        histogram.observe(self.worker, seconds);
        if durations.len() < MAX_CACHED_DURATIONS {
            durations.insert(cluster.into(), histogram);
        }
    }

    fn count(&self, cluster: &str, verb: &'static str, resource: &str, code: u16) {
        let mut counters = self.counters.borrow_mut();
        if let Some(counter) = counters.get(cluster, verb, resource, code) {
            counter.inc(self.worker);
            return;
        }
        let counter = self.gateway.metrics.requests(cluster, verb, resource, code);
        counter.inc(self.worker);
        counters.insert(cluster, verb, resource, code, counter);
    }

    /// This core's flow-control state for `cluster` in `generation` (rebuilt once per reload,
    /// carrying in-flight counts of unchanged schemas over).
    pub fn flow_control(&self, generation: &Generation, cluster: usize) -> Rc<CoreFlowControl> {
        let compiled = &generation.snapshot.clusters()[cluster];
        let mut flow = self.flow.borrow_mut();
        let stale = flow
            .as_ref()
            .is_none_or(|(number, _)| *number != generation.number);
        if stale {
            let previous = flow.take().map(|(_, states)| states).unwrap_or_default();
            let states = generation
                .snapshot
                .clusters()
                .iter()
                .map(|cluster| {
                    let state = CoreFlowControl::new(
                        &cluster.schemas,
                        long_running_limits(&cluster.connection_pool),
                        self.share,
                        previous.get(&cluster.name).map(|state| state.as_ref()),
                    );
                    (cluster.name.clone(), Rc::new(state))
                })
                .collect();
            *flow = Some((generation.number, states));
        }
        flow.as_ref()
            .and_then(|(_, states)| states.get(&compiled.name).cloned())
            .unwrap_or_else(|| {
                let limits = long_running_limits(&compiled.connection_pool);
                Rc::new(CoreFlowControl::new(
                    &compiled.schemas,
                    limits,
                    self.share,
                    None,
                ))
            })
    }
}

/// A cluster's long-running budgets per core.
fn long_running_limits(pool: &ConnectionPool) -> LongRunningLimits {
    LongRunningLimits {
        per_user: pool.max_long_running_per_user,
        upgrades: pool.max_upgrade_connections,
    }
}

/// One cluster's counters for one (verb, code), by resource.
type ResourceCounters = HashMap<Box<str>, PerCoreCounter>;

/// (verb, code) -> cluster -> resource -> this core's cached request counter: nested so that a
/// lookup borrows the request's `&str`s instead of building an owned key per request.
#[derive(Default)]
struct CounterCache {
    counters: HashMap<(&'static str, u16), HashMap<Box<str>, ResourceCounters>>,
    len: usize,
}

impl CounterCache {
    fn get(
        &self,
        cluster: &str,
        verb: &'static str,
        resource: &str,
        code: u16,
    ) -> Option<&PerCoreCounter> {
        self.counters
            .get(&(verb, code))?
            .get(cluster)?
            .get(resource)
    }

    /// Keeps `counter` unless the cache is full (a miss then costs a family lookup).
    fn insert(
        &mut self,
        cluster: &str,
        verb: &'static str,
        resource: &str,
        code: u16,
        counter: PerCoreCounter,
    ) {
        if self.len >= COUNTER_CACHE_LIMIT {
            return;
        }
        let resources = self
            .counters
            .entry((verb, code))
            .or_default()
            .entry(Box::from(cluster))
            .or_default();
        if resources.insert(Box::from(resource), counter).is_none() {
            self.len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_authenticated_requests_name_their_resource() {
        let unauthorized = ProxyError::from(GatewayError::Unauthorized);
        assert_eq!(resource_label("pods", Some(&unauthorized)), "");
        let bad_path = ProxyError::from(GatewayError::BadRequest { reason: "x".into() });
        assert_eq!(resource_label("pods", Some(&bad_path)), "");
        let forbidden = ProxyError::from(GatewayError::NoDispatchPolicy {
            cluster: "c".into(),
            verb: "get",
            path: "/api/v1/pods".into(),
        });
        assert_eq!(resource_label("pods", Some(&forbidden)), "pods");
        assert_eq!(resource_label("pods", None), "pods");
        assert_eq!(resource_label(&"x".repeat(100), None), "other");
    }

    /// hyper spawns every HTTP/2 request's future, and each wrapper on the way (hyper's
    /// stream task, the panic guard, monoio's task cell) copies all of it. Upstream connects
    /// and token or access reviews happen on a miss only, so they are boxed out of it: with
    /// them inline a request's future was 8,704 bytes.
    #[test]
    fn a_request_future_stays_small() {
        fn future_size<'a, F: std::future::Future>(
            _serve: impl FnOnce(&'a GatewayHandler, &'a ClientConnection, Request<Incoming>) -> F,
        ) -> usize {
            std::mem::size_of::<F>()
        }
        let size = future_size(GatewayHandler::serve);
        assert!(size <= 2048, "a request's future is {size} bytes");
    }
}
