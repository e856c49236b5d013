//! The fan-out scenario's simulated peers: the watchers (hosts of `WatchClient`s sharing one
//! Transport, and a consumer of each client's snapshots) and the open-loop writer.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use serde_json::json;
use sluice_watch_client::{
    Change, ResourceMetrics, Snapshot, Transport, WatchClient, WatchClientConfig,
};
use tokio::sync::{watch, Semaphore};

use super::fanout::{Kind, Plan, SENT_ANNOTATION};
use super::fanout_plan::Client;
use super::fanout_raw::RawWatcher;

/// Writes in flight at once at most; a write beyond it is not sent and counts as an error.
const MAX_IN_FLIGHT: usize = 256;
/// Hosts starting (LIST + WATCH of each of their watchers) at once.
const STARTING_HOSTS: usize = 64;

/// The annotation's value: `SEQ NANOS`.
pub(super) fn parse_sent(value: &str) -> Option<(u64, u64)> {
    let (seq, nanos) = value.split_once(' ')?;
    Some((seq.parse().ok()?, nanos.parse().ok()?))
}

/// Send times (Unix ns) of every write, by write index: 0 until sent (a write that never
/// went out stays 0 and is no delivery).
pub struct WriteLog {
    pub sent: Vec<AtomicU64>,
}

/// One watcher's view: the highest sequence number seen per object, its latencies.
pub struct Tally {
    pub kind: Kind,
    seen: Vec<u64>,
    latencies_us: Vec<u32>,
    delivered: u64,
}

impl Tally {
    fn new(kind: Kind, objects: usize) -> Self {
        Self {
            kind,
            seen: vec![0; objects],
            latencies_us: Vec::new(),
            delivered: 0,
        }
    }

    /// Object `object` is now at `seq` (sent at `nanos`), seen at `now`: every write to it
    /// after the one seen before is delivered now, its send time looked up when coalesced.
    pub(super) fn observe(
        &mut self,
        plan: &Plan,
        log: &WriteLog,
        object: usize,
        seq: u64,
        now: u64,
    ) {
        let Some(seen) = self.seen.get(object).copied() else {
            return;
        };
        for s in seen + 1..=seq {
            let index = plan.write_index(self.kind, object, s) as usize;
            let sent = log
                .sent
                .get(index)
                .map_or(0, |at| at.load(Ordering::Relaxed));
            if sent == 0 {
                continue;
            }
            let micros = now.saturating_sub(sent) / 1_000;
            self.latencies_us
                .push(u32::try_from(micros).unwrap_or(u32::MAX));
            self.delivered += 1;
        }
        if seq > seen {
            self.seen[object] = seq;
        }
    }
}

pub fn object_name(object: usize) -> String {
    format!("fanout-{object:03}")
}

fn object_of(name: &str) -> Option<usize> {
    name.strip_prefix("fanout-")?.parse().ok()
}

/// What the watchers share with the harness.
pub struct Watchers {
    pub tallies: Vec<Arc<Mutex<Tally>>>,
    metrics: Vec<ResourceMetrics>,
    synced: AtomicUsize,
    pub(super) failed: AtomicUsize,
    /// MODIFIED events the light watchers (`client=raw`) read; the product's client counts
    /// its own in `metrics`.
    pub(super) raw_events: AtomicU64,
}

impl Watchers {
    pub fn delivered(&self) -> u64 {
        self.tallies
            .iter()
            .map(|tally| tally.lock().map_or(0, |t| t.delivered))
            .sum()
    }

    pub fn received(&self) -> u64 {
        let counted: u64 = self.metrics.iter().map(|m| m.events("MODIFIED")).sum();
        counted + self.raw_events.load(Ordering::Relaxed)
    }

    pub fn errors(&self) -> u64 {
        let counted: u64 = self
            .metrics
            .iter()
            .map(|m| m.relists.get() + m.reconnects.get() + m.events("ERROR"))
            .sum();
        counted + self.failed.load(Ordering::Relaxed) as u64
    }

    /// The latencies recorded since the last call.
    pub fn drain_latencies(&self) -> Vec<u32> {
        let mut all = Vec::new();
        for tally in &self.tallies {
            if let Ok(mut tally) = tally.lock() {
                all.append(&mut tally.latencies_us);
            }
        }
        all.sort_unstable();
        all
    }
}

/// Spawns every host: one Transport, `per_connection` watch clients of its kind on it, and a
/// consumer per client. At most [`STARTING_HOSTS`] start at once (until their first sync).
pub fn start_watchers(
    runtime: &tokio::runtime::Runtime,
    plan: &Plan,
    configs: &[WatchClientConfig],
    log: &Arc<WriteLog>,
    stopping: &watch::Receiver<bool>,
) -> Arc<Watchers> {
    let mut tallies = Vec::new();
    let mut metrics = Vec::new();
    let mut hosts = Vec::new();
    for host in 0..plan.hosts() {
        let kind = Kind::of_host(host);
        let count = plan
            .per_connection
            .min(plan.watchers - host * plan.per_connection);
        let mut members = Vec::new();
        for _ in 0..count {
            let tally = Arc::new(Mutex::new(Tally::new(kind, plan.objects)));
            let metric = ResourceMetrics::unregistered(&kind.resource().plural);
            tallies.push(tally.clone());
            metrics.push(metric.clone());
            members.push((tally, metric));
        }
        hosts.push((kind, members));
    }
    let watchers = Arc::new(Watchers {
        tallies,
        metrics,
        synced: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        raw_events: AtomicU64::new(0),
    });
    let starting = Arc::new(Semaphore::new(STARTING_HOSTS));
    for (kind, members) in hosts {
        let host = Host {
            config: configs[kind.index()].clone(),
            kind,
            plan: plan.clone(),
            log: log.clone(),
            watchers: watchers.clone(),
            stopping: stopping.clone(),
        };
        runtime.spawn(host.run(members, starting.clone()));
    }
    watchers
}

struct Host {
    config: WatchClientConfig,
    kind: Kind,
    plan: Plan,
    log: Arc<WriteLog>,
    watchers: Arc<Watchers>,
    stopping: watch::Receiver<bool>,
}

impl Host {
    async fn run(
        self,
        members: Vec<(Arc<Mutex<Tally>>, ResourceMetrics)>,
        starting: Arc<Semaphore>,
    ) {
        let Ok(permit) = starting.acquire_owned().await else {
            return;
        };
        let transport = match Transport::new(&self.config) {
            Ok(transport) => Arc::new(transport),
            Err(error) => {
                eprintln!("fanout host: {error}");
                self.watchers
                    .failed
                    .fetch_add(members.len(), Ordering::Relaxed);
                return;
            }
        };
        let (first_sync, mut synced) = tokio::sync::mpsc::channel::<()>(members.len());
        let count = members.len();
        for (tally, metric) in members {
            if self.plan.client == Client::Raw {
                tokio::spawn(
                    RawWatcher {
                        transport: transport.clone(),
                        resource: self.kind.resource(),
                        watch_timeout: self.config.watch_timeout,
                        tally,
                        plan: self.plan.clone(),
                        log: self.log.clone(),
                        watchers: self.watchers.clone(),
                        first_sync: first_sync.clone(),
                        stopping: self.stopping.clone(),
                    }
                    .run(),
                );
                continue;
            }
            let client = WatchClient::with_transport(
                self.config.clone(),
                self.kind.resource(),
                metric,
                transport.clone(),
            );
            let snapshots = client.subscribe();
            let mut stop = self.stopping.clone();
            tokio::spawn(client.run(async move {
                let _ = stop.wait_for(|stop| *stop).await;
            }));
            tokio::spawn(consume(
                snapshots,
                tally,
                self.plan.clone(),
                self.log.clone(),
                first_sync.clone(),
                self.stopping.clone(),
            ));
        }
        for _ in 0..count {
            if synced.recv().await.is_none() {
                break;
            }
            self.watchers.synced.fetch_add(1, Ordering::Relaxed);
        }
        drop(permit);
    }
}

/// Reads a watcher's snapshots until stopped: every changed object of the fan-out set is
/// observed at the snapshot's arrival.
async fn consume(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    tally: Arc<Mutex<Tally>>,
    plan: Plan,
    log: Arc<WriteLog>,
    first_sync: tokio::sync::mpsc::Sender<()>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut previous = Arc::new(Snapshot::default());
    let mut announced = false;
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let now = u64::try_from(super::fleet::now_nanos()).unwrap_or(u64::MAX);
        if snapshot.synced {
            if let Ok(mut tally) = tally.lock() {
                for change in snapshot.changes_since(&previous) {
                    let object = match &change {
                        Change::Added { object, .. } | Change::Modified { new: object, .. } => {
                            object
                        }
                        Change::Deleted { .. } => continue,
                    };
                    let index = object_of(&change.key().name);
                    let sent = object
                        .pointer("/metadata/annotations")
                        .and_then(|a| a.get(SENT_ANNOTATION))
                        .and_then(|v| v.as_str())
                        .and_then(parse_sent);
                    if let (Some(index), Some((seq, _))) = (index, sent) {
                        tally.observe(&plan, &log, index, seq, now);
                    }
                }
            }
            previous = snapshot;
            if !announced {
                announced = true;
                let _ = first_sync.send(()).await;
            }
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            _ = stopping.wait_for(|stop| *stop) => return,
        }
    }
}

pub async fn wait_synced(watchers: &Watchers, expected: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    while watchers.synced.load(Ordering::Relaxed) < expected {
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "{} of {expected} watchers synced after 10 minutes ({} errors)",
                watchers.synced.load(Ordering::Relaxed),
                watchers.errors()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub struct Writes {
    pub sent: usize,
    pub ack_us: Vec<u32>,
    pub elapsed: Duration,
}

/// Patches the objects at `rate` per second for the plan's window, open loop, from write
/// index `first`; each write's send time goes into the log before its request does.
pub async fn write_steadily(
    transport: Arc<Transport>,
    plan: Plan,
    log: Arc<WriteLog>,
    rate: u32,
    first: u64,
) -> Writes {
    let total = u64::from(rate) * plan.window.as_secs();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for n in first..first + total {
        ticker.tick().await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            continue;
        };
        let (kind, object, seq) = plan.write_target(n);
        let path = format!("{}/{}", kind.resource().path(), object_name(object));
        let sent = u64::try_from(super::fleet::now_nanos()).unwrap_or(u64::MAX);
        log.sent[n as usize].store(sent, Ordering::Relaxed);
        let patch =
            json!({"metadata": {"annotations": {SENT_ANNOTATION: format!("{seq} {sent}")}}});
        let body = Bytes::from(patch.to_string());
        let transport = transport.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            match transport.merge_patch(&path, body, 1 << 20).await {
                Ok(_) => Some(u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX)),
                Err(error) => {
                    eprintln!("fanout write {n}: {error}");
                    None
                }
            }
        }));
    }
    let mut ack_us = Vec::new();
    for task in tasks {
        if let Ok(Some(us)) = task.await {
            ack_us.push(us);
        }
    }
    Writes {
        sent: total as usize,
        ack_us,
        elapsed: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            objects: 3,
            ..Plan::new(true)
        }
    }

    #[test]
    fn a_coalesced_view_delivers_every_write_it_covers_at_once() {
        let plan = plan();
        let log = WriteLog {
            sent: (0..20)
                .map(|n| AtomicU64::new(1_000_000 * (n + 1)))
                .collect(),
        };
        // Write 12 (gateway, object 0, seq 3) was never sent.
        log.sent[12].store(0, Ordering::Relaxed);
        let mut tally = Tally::new(Kind::Gateway, plan.objects);
        // Object 0 seen at seq 2 at 20 ms: writes 0 and 6 (sent at 1 and 7 ms).
        tally.observe(&plan, &log, 0, 2, 20_000_000);
        assert_eq!(tally.latencies_us, vec![19_000, 13_000]);
        // An older value arriving late changes nothing.
        tally.observe(&plan, &log, 0, 1, 30_000_000);
        assert_eq!(tally.delivered, 2);
        // seq 4 covers the unsent 3: only write 18 counts.
        tally.observe(&plan, &log, 0, 4, 40_000_000);
        assert_eq!(tally.delivered, 3);
        assert_eq!(tally.latencies_us[2], 21_000);
        // An object outside the set is ignored.
        tally.observe(&plan, &log, 7, 1, 40_000_000);
        assert_eq!(tally.seen, vec![4, 0, 0]);
    }

    #[test]
    fn sent_annotations_parse_and_reject_garbage() {
        assert_eq!(
            parse_sent("3 1700000000000000000"),
            Some((3, 1_700_000_000_000_000_000))
        );
        assert_eq!(parse_sent("3"), None);
        assert_eq!(parse_sent("x 1"), None);
        assert_eq!(object_of("fanout-007"), Some(7));
        assert_eq!(object_of("other-007"), None);
    }
}
