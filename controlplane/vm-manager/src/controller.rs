//! The VMManager's I/O: follow the store, evaluate what changed (and every VM on a timer, for
//! staleness), write the statuses that differ. Every replica runs one; a status write is a
//! compare-and-swap on the resourceVersion it read, so replicas that decide the same thing
//! converge (the second finds nothing to change) and a conflict is re-read and retried.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use serde_json::Value;
use sluice_apimachinery::{KindSpec, StatusReason};
use sluice_apiserver::kinds::{
    applied_to_group, network_policy, runtime_info, virtual_machine, PolicyResource, SpanIndex,
};
use sluice_apiserver::server::{list_prefix, ApiServer};
use sluice_store::{Store, StoreError, WatchBatch, WatchStream};
use tokio::sync::watch;

use crate::cache::{decode, Cache, Followed};
use crate::error::VmManagerError;
use crate::metrics::VmMetrics;
use crate::state::{policy_status, state_of, vm_status, VmInputs, VmState};

/// Tries of one status write that keeps meeting another writer.
const WRITE_TRIES: usize = 4;
/// The shortest staleness check interval.
const MIN_TICK: Duration = Duration::from_millis(250);
/// Pause before following the store again after an error.
const RESTART_PAUSE: Duration = Duration::from_secs(1);
/// The shortest time between two passes over every NetworkPolicy's status: realization counts
/// lag by at most this much, and a burst of state changes costs one pass per gap.
const POLICY_PASS_GAP: Duration = Duration::from_millis(250);

/// What woke the follow loop.
enum Next {
    /// The staleness timer: every VM is evaluated again.
    Sweep,
    /// A policy pass or a count of the states was put off and its gap is over.
    Due,
    /// A batch (or the end) of one of the three watches.
    Batch(usize, Option<Result<WatchBatch, StoreError>>),
}

/// The VMManager of one control-plane replica.
pub struct VmManager {
    server: Arc<ApiServer>,
    timeout: Duration,
    metrics: VmMetrics,
    /// When this replica saw each VM's runtime info written (server clock). Kept across
    /// re-lists: a list is not a report.
    seen: HashMap<String, SystemTime>,
    /// When the VMs were last listed (the start of the grace in [`VmInputs::listed`]).
    listed: SystemTime,
    /// The earliest time of the next pass over the policies' statuses.
    next_policy_pass: tokio::time::Instant,
    /// The earliest time the states gauge is counted again, and whether a count waits for it.
    next_count: tokio::time::Instant,
    count_pending: bool,
}

/// One followed resource: its prefix, how far it was read, its watch.
struct Follow {
    followed: Followed,
    prefix: String,
    revision: u64,
    stream: WatchStream,
    outages: u32,
}

impl VmManager {
    /// `timeout`: how long after the last runtime-info write a VM stays `AgentedConnected`.
    pub fn new(server: Arc<ApiServer>, timeout: Duration, metrics: VmMetrics) -> Self {
        Self {
            server,
            timeout,
            metrics,
            seen: HashMap::new(),
            listed: SystemTime::now(),
            next_policy_pass: tokio::time::Instant::now(),
            next_count: tokio::time::Instant::now(),
            count_pending: false,
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let outcome = tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                outcome = self.follow() => outcome,
            };
            if let Err(error) = outcome {
                tracing::warn!(%error, retryable = error.retryable(), "the VMManager starts over");
            }
            tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                _ = tokio::time::sleep(RESTART_PAUSE) => {}
            }
        }
    }

    /// Lists the three resources, evaluates every VM (a Connected VM keeps one timeout from
    /// here to report), then follows their changes.
    async fn follow(&mut self) -> Result<(), VmManagerError> {
        let mut cache = Cache::default();
        let mut follows = Vec::new();
        for (followed, prefix) in prefixes() {
            let (rows, revision) = list_all(self.server.store().as_ref(), &prefix).await?;
            cache.replace(followed, &rows);
            let stream = self.server.store().watch(&prefix, revision);
            follows.push(Follow {
                followed,
                prefix,
                revision,
                stream,
                outages: 0,
            });
        }
        self.listed = SystemTime::now();
        self.reconcile(&mut cache).await;
        let tick = (self.timeout / 4).max(MIN_TICK);
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let pass_due = tokio::time::sleep_until(self.next_policy_pass);
            let count_due = tokio::time::sleep_until(self.next_count);
            let count_pending = self.count_pending;
            let next = {
                let [vms, infos, policies] = &mut follows[..] else {
                    return Ok(());
                };
                tokio::select! {
                    _ = ticker.tick() => Next::Sweep,
                    _ = pass_due, if cache.policies_dirty => Next::Due,
                    _ = count_due, if count_pending => Next::Due,
                    item = vms.stream.next() => Next::Batch(0, item),
                    item = infos.stream.next() => Next::Batch(1, item),
                    item = policies.stream.next() => Next::Batch(2, item),
                }
            };
            match next {
                Next::Sweep => cache.dirty_vms.extend(cache.vms.keys().cloned()),
                Next::Due => {}
                Next::Batch(index, item) => {
                    let follow = &mut follows[index];
                    self.receive(follow, item, &mut cache).await?;
                }
            }
            self.reconcile(&mut cache).await;
        }
    }

    async fn receive(
        &mut self,
        follow: &mut Follow,
        item: Option<Result<WatchBatch, StoreError>>,
        cache: &mut Cache,
    ) -> Result<(), VmManagerError> {
        let store = self.server.store().clone();
        match item {
            Some(Ok(batch)) => {
                follow.outages = 0;
                follow.revision = batch.revision;
                let now = SystemTime::now();
                for event in &batch.events {
                    if let Some(vm) = cache.apply(follow.followed, event) {
                        self.seen.insert(vm, now);
                        self.metrics.heartbeats.inc();
                    } else if follow.followed == Followed::RuntimeInfos {
                        // A deleted runtime info: the agent never reported, as far as the
                        // state machine is concerned.
                        self.seen.remove(crate::cache::name_of(event.key()));
                    }
                }
            }
            Some(Err(StoreError::Lagged { last_revision })) => {
                follow.revision = last_revision;
                follow.stream = store.watch(&follow.prefix, last_revision);
            }
            Some(Err(StoreError::Unavailable { .. })) if follow.outages < 50 => {
                follow.outages += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                follow.stream = store.watch(&follow.prefix, follow.revision);
            }
            Some(Err(source)) => {
                return Err(VmManagerError::Watch {
                    prefix: follow.prefix.clone(),
                    source,
                })
            }
            None => {
                follow.stream = store.watch(&follow.prefix, follow.revision);
            }
        }
        Ok(())
    }

    /// Evaluates the dirty VMs, then (if anything changed) every NetworkPolicy's status.
    async fn reconcile(&mut self, cache: &mut Cache) {
        let dirty = std::mem::take(&mut cache.dirty_vms);
        for name in dirty {
            self.reconcile_vm(cache, &name).await;
        }
        // A pass over every policy costs a span index and each policy's span: at most one per
        // POLICY_PASS_GAP, however many VMs change state or realize meanwhile.
        if cache.policies_dirty && tokio::time::Instant::now() >= self.next_policy_pass {
            cache.policies_dirty = false;
            self.reconcile_policies(cache).await;
            self.next_policy_pass = tokio::time::Instant::now() + POLICY_PASS_GAP;
        }
        // The states gauge reads every VM: only after a state changed, and at most once per
        // POLICY_PASS_GAP (issue 36: at 5,000 VMs counting per change took most of the core,
        // and counting per pass a tenth of it with nothing changing).
        if !cache.states_dirty {
            self.count_pending = false;
            return;
        }
        let now = tokio::time::Instant::now();
        if now < self.next_count {
            self.count_pending = true;
            return;
        }
        self.count_pending = false;
        cache.states_dirty = false;
        self.next_count = now + POLICY_PASS_GAP;
        let mut counts: BTreeMap<VmState, i64> =
            VmState::ALL.into_iter().map(|state| (state, 0)).collect();
        for vm in cache.vms.values() {
            if let Some(state) = state_of(vm) {
                *counts.entry(state).or_default() += 1;
            }
        }
        let counts: Vec<(VmState, i64)> = counts.into_iter().collect();
        self.metrics.set_states(&counts);
    }

    async fn reconcile_vm(&mut self, cache: &mut Cache, name: &str) {
        let spec = virtual_machine();
        let Some(mut vm) = cache.vms.get(name).cloned() else {
            return;
        };
        for _ in 0..WRITE_TRIES {
            let inputs = VmInputs {
                vm: &vm,
                runtime_info: cache.runtime_infos.get(name),
                seen: self.seen.get(name).copied(),
                listed: self.listed,
                now: SystemTime::now(),
                timeout: self.timeout,
            };
            let Some(decision) = vm_status(&inputs) else {
                return;
            };
            if vm.get("status") == Some(&decision.status) {
                return;
            }
            match self
                .server
                .write_status(&spec, &vm, decision.status.clone())
                .await
            {
                Ok(written) => {
                    self.metrics.write("ok");
                    if decision.transition() {
                        self.metrics.transition(decision.from, decision.to);
                        tracing::info!(
                            vm = name,
                            from = decision.from.map_or("None", VmState::as_str),
                            to = decision.to.as_str(),
                            reason = decision.reason.as_str(),
                            "VM state changed"
                        );
                        let event = crate::events::transition_event(&written, &decision);
                        self.server.events().record(event);
                    }
                    // The watch will bring this write back as unchanged: who is desired may
                    // have changed now.
                    if state_of(&vm) != state_of(&written) {
                        cache.policies_dirty = true;
                        cache.states_dirty = true;
                    }
                    cache.vms.insert(name.to_string(), written);
                    return;
                }
                Err(error) => match self.after_failed_write(&spec, name, error).await {
                    Some(fresh) => vm = fresh,
                    None => return,
                },
            }
        }
    }

    /// After a refused status write: the object as stored now when another writer got in
    /// between (to decide again), `None` when there is nothing to retry.
    async fn after_failed_write(
        &self,
        spec: &KindSpec,
        name: &str,
        error: sluice_apimachinery::StatusError,
    ) -> Option<Value> {
        if error.reason != StatusReason::Conflict {
            self.metrics.write("error");
            if error.reason != StatusReason::NotFound {
                tracing::warn!(object = name, kind = %spec.kind, message = %error.message, "a status write failed");
            }
            return None;
        }
        self.metrics.write("conflict");
        let key = sluice_apiserver::server::object_key(spec, None, name);
        match self.server.store().get(&key).await {
            Ok(Some(row)) => decode(&row),
            Ok(None) => None,
            Err(error) => {
                tracing::warn!(object = name, %error, "re-reading after a conflict failed");
                None
            }
        }
    }

    async fn reconcile_policies(&mut self, cache: &mut Cache) {
        let spec = network_policy();
        let index = span_index(cache);
        for (key, mut policy) in policies_to_write(cache, &index) {
            for _ in 0..WRITE_TRIES {
                let status = policy_status_in(cache, &index, &policy);
                if policy.get("status") == Some(&status) {
                    break;
                }
                let name = sluice_apimachinery::meta::object_name(&policy).to_string();
                match self.server.write_status(&spec, &policy, status).await {
                    Ok(written) => {
                        self.metrics.write("ok");
                        cache.policy_objects.insert(key.clone(), written);
                        break;
                    }
                    Err(error) => match self.after_failed_write(&spec, &name, error).await {
                        Some(fresh) => policy = fresh,
                        None => break,
                    },
                }
            }
        }
    }
}

/// The spans of the cached groups and policies (built once per pass).
fn span_index(cache: &Cache) -> SpanIndex {
    let under = |prefix: String| {
        cache
            .policy_objects
            .iter()
            .filter(move |(key, _)| key.starts_with(&prefix))
            .map(|(_, object)| object)
    };
    SpanIndex::new(
        under(list_prefix(&applied_to_group(), None)),
        under(list_prefix(&network_policy(), None)),
    )
}

/// The NetworkPolicies whose stored status differs from what it should be (only those are
/// cloned: a pass over unchanged policies copies nothing).
fn policies_to_write(cache: &Cache, index: &SpanIndex) -> Vec<(String, Value)> {
    let prefix = list_prefix(&network_policy(), None);
    cache
        .policy_objects
        .iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .filter(|(_, policy)| policy.get("status") != Some(&policy_status_in(cache, index, policy)))
        .map(|(key, policy)| (key.clone(), policy.clone()))
        .collect()
}

/// A policy's realization status: its span, those VMs' states, their reports.
fn policy_status_in(cache: &Cache, index: &SpanIndex, policy: &Value) -> Value {
    let span = index.span(PolicyResource::NetworkPolicy, policy);
    let states: BTreeMap<String, VmState> = span
        .iter()
        .filter_map(|vm| Some((vm.clone(), state_of(cache.vms.get(vm)?)?)))
        .collect();
    policy_status(policy, &span, &states, &cache.runtime_infos)
}

/// What the VMManager follows, in the order `follow` selects on them.
fn prefixes() -> [(Followed, String); 3] {
    let groups = list_prefix(&applied_to_group(), None);
    // Every policy kind shares the group's prefix: `/registry/policy.sluice.dev/`.
    let policy_group = groups
        .trim_end_matches('/')
        .rsplit_once('/')
        .map(|(group, _)| format!("{group}/"))
        .unwrap_or(groups);
    [
        (Followed::Vms, list_prefix(&virtual_machine(), None)),
        (Followed::RuntimeInfos, list_prefix(&runtime_info(), None)),
        (Followed::Policies, policy_group),
    ]
}

/// Every row under `prefix` at one revision, page by page.
async fn list_all(
    store: &dyn Store,
    prefix: &str,
) -> Result<(Vec<sluice_store::KeyValue>, u64), VmManagerError> {
    let failed = |source| VmManagerError::List {
        prefix: prefix.to_string(),
        source,
    };
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    let mut revision = None;
    loop {
        let page = store
            .list(prefix, after.as_deref(), 1000, revision)
            .await
            .map_err(failed)?;
        revision = Some(page.revision);
        let more = page.more;
        after = page.items.last().map(|row| row.key.clone());
        rows.extend(page.items);
        if !more || after.is_none() {
            return Ok((rows, page.revision));
        }
    }
}
