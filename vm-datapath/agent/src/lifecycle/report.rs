//! `VirtualMachineRuntimeInfo`: what the agent tells the VMManager, every `interval` and at
//! once on every change. Its arrival is the agent's heartbeat (the VMManager keeps a VM
//! AgentedConnected while they come), so a failed write is retried with a jittered backoff
//! rather than at the next interval.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Map, Value};
use sluice_watch_client::{Backoff, Transport, WatchError};
use tokio::sync::watch;

use sluice_vm_lifecycle::{AgentCondition, ConditionStatus};

use super::decision::Mode;

const PLURAL_PATH: &str = "/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos";
/// How much of the server's answer is read (the object echoed back).
const ANSWER_LIMIT: usize = 1 << 20;
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// What the next report says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub mode: Mode,
    /// Policy name -> realized generation.
    pub network_policies: BTreeMap<String, String>,
    pub ovsdb_connected: bool,
    pub openflow_connected: bool,
    /// The last policy change the control plane asked for is on the switch.
    pub policies_realized: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Default)]
pub struct ReportMetrics {
    reports: Family<ResultLabels, Counter>,
}

impl ReportMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "sluice_vm_agent_runtime_reports",
            "VirtualMachineRuntimeInfo writes by result (ok, error)",
            self.reports.clone(),
        );
    }
}

/// Starts the reporter on `transport` (the agent's watches share it); it sends what `reports`
/// holds (nothing while it holds `None`).
pub fn spawn(
    transport: Arc<Transport>,
    vm: &str,
    interval: Duration,
    reports: watch::Receiver<Option<Report>>,
    metrics: ReportMetrics,
) {
    let reporter = Reporter {
        transport,
        vm: vm.to_string(),
        sent_policies: None,
        metrics,
    };
    tokio::spawn(reporter.run(interval, reports));
}

struct Reporter {
    transport: Arc<Transport>,
    vm: String,
    /// The policies of the last report the server took; `None`: none taken yet (or the object
    /// must be created).
    sent_policies: Option<BTreeMap<String, String>>,
    metrics: ReportMetrics,
}

impl Reporter {
    async fn run(mut self, interval: Duration, mut reports: watch::Receiver<Option<Report>>) {
        let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX.min(interval));
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                changed = reports.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(next) => {}
            }
            let Some(report) = reports.borrow_and_update().clone() else {
                next = tokio::time::Instant::now() + interval;
                continue;
            };
            match self.send(&report).await {
                Ok(()) => {
                    self.count("ok");
                    backoff.reset();
                    next = tokio::time::Instant::now() + interval;
                }
                Err(error) => {
                    self.count("error");
                    let pause = backoff.next_delay();
                    tracing::info!(%error, retry_in = ?pause, "runtime info not reported");
                    next = tokio::time::Instant::now() + pause;
                }
            }
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .reports
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A merge patch of the whole report (removed policies as `null`); a create when the
    /// object does not exist yet.
    async fn send(&mut self, report: &Report) -> Result<(), WatchError> {
        let path = format!("{PLURAL_PATH}/{}", self.vm);
        let mut object = runtime_info(&self.vm, report);
        if let Some(sent) = &self.sent_policies {
            let removed = sent
                .keys()
                .filter(|name| !report.network_policies.contains_key(*name));
            if let Some(Value::Object(policies)) = object.get_mut("networkPolicies") {
                for name in removed {
                    policies.insert(name.clone(), Value::Null);
                }
            }
        }
        let body = Bytes::from(object.to_string());
        match self.transport.merge_patch(&path, body, ANSWER_LIMIT).await {
            Err(WatchError::Status { status: 404, .. }) => {
                let created = Bytes::from(runtime_info(&self.vm, report).to_string());
                self.transport
                    .post_json(PLURAL_PATH, created, ANSWER_LIMIT)
                    .await?;
            }
            other => {
                other?;
            }
        }
        self.sent_policies = Some(report.network_policies.clone());
        Ok(())
    }
}

/// The runtime info object for `report` (kube-style conditions; `reportedAt` makes every
/// report a real write, which is what the VMManager counts as a heartbeat).
pub fn runtime_info(vm: &str, report: &Report) -> Value {
    let condition = |kind: AgentCondition, up: bool| {
        json!({"type": kind.as_str(), "status": ConditionStatus::of(up).as_str(),
               "reason": kind.reason(up)})
    };
    let policies: Map<String, Value> = report
        .network_policies
        .iter()
        .map(|(name, generation)| (name.clone(), Value::String(generation.clone())))
        .collect();
    json!({
        "apiVersion": sluice_vm_lifecycle::API_VERSION,
        "kind": sluice_vm_lifecycle::RUNTIME_INFO,
        "metadata": {"name": vm},
        "agentState": report.mode.as_str(),
        "os": std::env::consts::OS,
        "agentVersion": env!("CARGO_PKG_VERSION"),
        "networkPolicies": policies,
        "conditions": [
            condition(AgentCondition::ControlPlaneConnected, true),
            condition(AgentCondition::OVSDBConnected, report.ovsdb_connected),
            condition(AgentCondition::OpenFlowConnected, report.openflow_connected),
            condition(AgentCondition::PoliciesRealized, report.policies_realized),
        ],
        "reportedAt": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_as_runtime_info() {
        let report = Report {
            mode: Mode::Active,
            network_policies: BTreeMap::from([("web".into(), "3".into())]),
            ovsdb_connected: true,
            openflow_connected: false,
            policies_realized: true,
        };
        let info = runtime_info("vm1", &report);
        assert_eq!(info["metadata"]["name"], "vm1");
        assert_eq!(info["agentState"], "Active");
        assert_eq!(info["networkPolicies"], json!({"web": "3"}));
        let conditions = info["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 4);
        assert_eq!(conditions[2]["type"], "OpenFlowConnected");
        assert_eq!(conditions[2]["status"], "False");
        assert!(info["reportedAt"].as_str().unwrap().ends_with('Z'));
    }
}
