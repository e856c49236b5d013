//! `sluice vm-agent --controlplane`: the policies of this VM's span, watched on the control
//! plane (its token's subject is the VM; the server sends only the objects in its span, with
//! only this VM's interfaces in each applied-to group) instead of read from a file.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sluice_config::ControlPlaneSource;
use sluice_policy::model::PolicySet;
use sluice_watch_client::{Resource, Snapshot, WatchClient, WatchMetrics};
use tokio::sync::watch;

const GROUP: &str = "policy.sluice.dev";
const VERSION: &str = "v1alpha1";
/// The three resources, in the order `load_objects` takes them.
const RESOURCES: [&str; 3] = ["addressgroups", "appliedtogroups", "networkpolicies"];

/// Policy sets built from the watched objects: `None` until all three resources are listed; a
/// combination that does not load is logged and counted, and the last good set stays.
pub fn spawn(
    source: &ControlPlaneSource,
    registry: &mut Registry,
    errors: prometheus_client::metrics::counter::Counter,
) -> anyhow::Result<watch::Receiver<Option<Arc<PolicySet>>>> {
    let metrics = WatchMetrics::register(registry);
    let mut snapshots = Vec::new();
    for plural in RESOURCES {
        let mut config = crate::daemon::watch_client_config(source);
        config.backoff_max = Duration::from_secs(1);
        let client = WatchClient::new(
            config,
            Resource::new(GROUP, VERSION, plural),
            metrics.for_resource(plural),
        )?;
        snapshots.push(client.subscribe());
        tokio::spawn(client.run(std::future::pending()));
    }
    let (sender, receiver) = watch::channel(None);
    let origin = format!("{}/apis/{GROUP}/{VERSION}", source.url);
    tokio::spawn(combine(snapshots, sender, origin, errors));
    Ok(receiver)
}

/// Rebuilds the set whenever any of the three snapshots changes.
async fn combine(
    mut snapshots: Vec<watch::Receiver<Arc<Snapshot>>>,
    sender: watch::Sender<Option<Arc<PolicySet>>>,
    origin: String,
    errors: prometheus_client::metrics::counter::Counter,
) {
    loop {
        let current: Vec<Arc<Snapshot>> = snapshots
            .iter_mut()
            .map(|snapshot| snapshot.borrow_and_update().clone())
            .collect();
        if current.iter().all(|snapshot| snapshot.synced) {
            let objects = |index: usize| {
                current[index]
                    .objects
                    .values()
                    .map(|object| object.as_ref())
            };
            match sluice_policy::object::load_objects(objects(0), objects(1), objects(2), &origin) {
                Ok(loaded) => {
                    if !loaded.waiting.is_empty() {
                        tracing::info!(policies = ?loaded.waiting, "policies wait for groups this agent does not hold yet");
                    }
                    let _ = sender.send(Some(Arc::new(loaded.set)));
                }
                Err(error) => {
                    errors.inc();
                    for field in &error.errors {
                        tracing::error!(origin = %error.origin, path = %field.path, reason = %field.reason, "policies from the control plane refused; the last good policies stay");
                    }
                }
            }
        }
        let changes = snapshots
            .iter_mut()
            .map(|snapshot| Box::pin(snapshot.changed()));
        let (changed, _, _) = futures_util::future::select_all(changes).await;
        if changed.is_err() {
            return;
        }
    }
}
