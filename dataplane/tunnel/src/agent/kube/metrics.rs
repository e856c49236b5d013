//! `sluice_agent_kube_*`: the Kubernetes API forwarder's requests by gRPC code, assertion
//! refusals by reason, requests in flight and apiserver failures. Labels are fixed sets (code
//! names, the verifier's reason labels), never a path, user or message.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_grpc::Code;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The forwarder's metrics (registered with the agent's, whether or not the section is set).
#[derive(Debug, Clone, Default)]
pub struct KubeMetrics {
    requests: Family<CodeLabels, Counter>,
    assertion_refused: Family<ReasonLabels, Counter>,
    in_flight: Gauge,
    apiserver_errors: Counter,
}

impl KubeMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "sluice_agent_kube_requests",
            "Kubernetes API calls (MakeRequest) this agent answered, by gRPC code",
            metrics.requests.clone(),
        );
        registry.register(
            "sluice_agent_kube_assertion_refused",
            "Kubernetes API calls refused PERMISSION_DENIED because the gateway's assertion did not verify, by reason",
            metrics.assertion_refused.clone(),
        );
        registry.register(
            "sluice_agent_kube_in_flight",
            "Kubernetes API calls this agent is forwarding now (bounded by agent.kubernetes_api.max_in_flight)",
            metrics.in_flight.clone(),
        );
        registry.register(
            "sluice_agent_kube_apiserver_errors",
            "Kubernetes API calls that failed because the apiserver could not be reached or reset the request",
            metrics.apiserver_errors.clone(),
        );
        metrics
    }

    pub(super) fn answered(&self, code: Code) {
        self.requests
            .get_or_create(&CodeLabels { code: code.name() })
            .inc();
    }

    pub(super) fn refused(&self, reason: &'static str) {
        self.assertion_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(super) fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }

    pub(super) fn apiserver_error(&self) {
        self.apiserver_errors.inc();
    }

    /// Calls answered with `code` so far (tests and diagnostics).
    pub fn requests(&self, code: Code) -> u64 {
        self.requests
            .get_or_create(&CodeLabels { code: code.name() })
            .get()
    }

    /// Calls being forwarded now (tests and diagnostics).
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.get()
    }

    /// Calls failed by the apiserver so far (tests and diagnostics).
    pub fn apiserver_errors(&self) -> u64 {
        self.apiserver_errors.get()
    }

    /// Assertions refused for `reason` so far (tests and diagnostics).
    pub fn refusals(&self, reason: &'static str) -> u64 {
        self.assertion_refused
            .get_or_create(&ReasonLabels { reason })
            .get()
    }
}
