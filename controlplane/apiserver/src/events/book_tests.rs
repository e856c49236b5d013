use super::*;

const T0: Duration = Duration::from_secs(1_800_000_000);

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(seconds)
}

fn vm(name: &str) -> Involved {
    Involved {
        api_version: "vm.sluice.dev/v1alpha1".into(),
        kind: "VirtualMachine".into(),
        name: name.into(),
        namespace: None,
        uid: format!("uid-{name}"),
    }
}

fn occurrence(name: &str, reason: &str) -> Occurrence {
    Occurrence::new(
        vm(name),
        EventType::Normal,
        reason,
        "state changed",
        "vm-manager",
    )
}

fn limits() -> EventLimits {
    EventLimits {
        per_namespace: 3,
        total: 4,
        ttl: Duration::from_secs(3600),
        queue: 8,
        writes_per_second: 2,
        write_burst: 4,
    }
}

fn uid() -> String {
    "e-uid".into()
}

/// The figures docs/CONTROLPLANE.md ("Events") gives.
#[test]
fn the_documented_defaults() {
    let limits = EventLimits::default();
    assert_eq!((limits.per_namespace, limits.total), (1000, 5000));
    assert_eq!(limits.ttl, Duration::from_secs(3600));
    assert_eq!(limits.queue, 1024);
    assert_eq!((limits.writes_per_second, limits.write_burst), (20, 100));
}

#[test]
fn repeats_aggregate_into_one_event_with_count_and_times() {
    let mut book = EventBook::new(limits(), "cp-1");
    book.record(occurrence("vm1", "HeartbeatReceived"), at(0), uid);
    book.record(occurrence("vm1", "HeartbeatReceived"), at(5), uid);
    book.record(occurrence("vm1", "HeartbeatMissed"), at(6), uid);
    assert_eq!(book.len(), 2);
    let writes = book.writes(at(6));
    assert_eq!(writes.len(), 2);
    let received = writes
        .iter()
        .find(|w| w.object["reason"] == "HeartbeatReceived")
        .expect("written");
    let event = &received.object;
    assert_eq!(event["count"], 2);
    assert_eq!(event["firstTimestamp"], format_rfc3339(at(0)));
    assert_eq!(event["lastTimestamp"], format_rfc3339(at(5)));
    assert_eq!(event["type"], "Normal");
    assert_eq!(
        event["source"],
        json!({"component": "vm-manager", "host": "cp-1"})
    );
    assert_eq!(
        event["involvedObject"],
        json!({"apiVersion": "vm.sluice.dev/v1alpha1", "kind": "VirtualMachine",
            "name": "vm1", "uid": "uid-vm1"})
    );
    assert_eq!(event["metadata"]["namespace"], CLUSTER_EVENTS_NAMESPACE);
    assert!(received.name.starts_with("vm1."), "{}", received.name);
    assert_eq!(received.revision, None);
    // Written at revision 7, a repeat replaces that version.
    book.written(&received.name, 7);
    book.record(occurrence("vm1", "HeartbeatReceived"), at(9), uid);
    let again = book.writes(at(9));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].revision, Some(7));
    assert_eq!(again[0].object["count"], 3);
    assert!(book.writes(at(9)).is_empty(), "nothing changed since");
}

#[test]
fn the_oldest_is_evicted_past_the_namespace_and_total_caps() {
    let mut book = EventBook::new(limits(), "cp-1");
    for (second, name) in ["a", "b", "c"].iter().enumerate() {
        assert!(book
            .record(occurrence(name, "R"), at(second as u64), uid)
            .is_empty());
    }
    // A fourth in the same namespace evicts the oldest ("a", never written).
    let evicted = book.record(occurrence("d", "R"), at(10), uid);
    assert_eq!(evicted.len(), 1);
    assert!(evicted[0].name.starts_with("a."));
    assert_eq!((evicted[0].revision, evicted[0].reason), (None, "cap"));
    // Another namespace: the per-namespace cap does not apply, the total (4) does.
    let mut other = occurrence("p", "R");
    other.involved.namespace = Some("prod".into());
    assert!(book.record(other.clone(), at(11), uid).is_empty());
    let mut second = other.clone();
    second.involved.name = "q".into();
    let evicted = book.record(second, at(12), uid);
    assert!(evicted[0].name.starts_with("b."), "{evicted:?}");
    assert_eq!(book.len(), 4);
}

#[test]
fn events_not_repeated_within_the_ttl_expire() {
    let mut book = EventBook::new(limits(), "cp-1");
    book.record(occurrence("old", "R"), at(0), uid);
    book.record(occurrence("new", "R"), at(100), uid);
    let written = book.writes(at(100));
    let old = written
        .iter()
        .find(|w| w.name.starts_with("old."))
        .expect("old");
    book.written(&old.name, 3);
    assert!(book.expire(at(3599)).is_empty());
    let expired = book.expire(at(3600));
    assert_eq!(expired.len(), 1);
    assert_eq!((expired[0].revision, expired[0].reason), (Some(3), "ttl"));
    assert_eq!(book.len(), 1);
    // A repeat keeps an event alive.
    book.record(occurrence("new", "R"), at(3000), uid);
    assert!(book.expire(at(3700)).is_empty());
}

#[test]
fn the_write_budget_holds_back_changes_until_it_refills() {
    let mut book = EventBook::new(limits(), "cp-1");
    for name in ["a", "b", "c"] {
        book.record(occurrence(name, "R"), at(0), uid);
    }
    let mut other = occurrence("p", "R");
    other.involved.namespace = Some("prod".into());
    book.record(other, at(0), uid);
    let mut extra = occurrence("z", "R");
    extra.involved.namespace = Some("prod".into());
    book.record(extra, at(0), uid);
    // Total cap 4 evicted one; burst 4 writes all that is left, then nothing.
    assert_eq!(book.writes(at(0)).len(), 4);
    book.record(occurrence("c", "R"), at(0), uid);
    assert!(book.writes(at(0)).is_empty(), "the burst is spent");
    // 2 writes per second: half a second buys one.
    assert_eq!(book.writes(at(0) + Duration::from_millis(500)).len(), 1);
}

#[test]
fn a_failed_write_is_retried_only_when_the_store_says_what_it_holds() {
    let mut book = EventBook::new(limits(), "cp-1");
    book.record(occurrence("a", "R"), at(0), uid);
    let name = book.writes(at(0))[0].name.clone();
    book.failed(&name, Stored::Unknown);
    assert!(book.writes(at(1)).is_empty(), "dropped until it repeats");
    book.failed(&name, Stored::At(9));
    assert_eq!(book.writes(at(2))[0].revision, Some(9));
    book.failed(&name, Stored::Gone);
    assert_eq!(book.writes(at(3))[0].revision, None);
}

#[test]
fn hostile_names_and_texts_are_bounded() {
    let mut long = occurrence(&"Ü/../x".repeat(100), &"r".repeat(500));
    long.message = "m".repeat(5000);
    let occurrence = Occurrence::new(
        long.involved.clone(),
        EventType::Warning,
        &long.reason,
        &long.message,
        "apiserver",
    );
    assert_eq!(occurrence.reason.len(), MAX_REASON);
    assert_eq!(occurrence.message.len(), MAX_MESSAGE);
    assert!(occurrence.involved.name.len() <= 253);
    let mut book = EventBook::new(limits(), "cp-1");
    book.record(occurrence, at(0), uid);
    let name = book.writes(at(0))[0].name.clone();
    assert!(name.len() <= 253, "{name}");
    assert!(name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
    assert!(
        name.starts_with(|c: char| c.is_ascii_alphanumeric()),
        "{name}"
    );
}

#[test]
fn the_sweep_deletes_the_expired_then_the_oldest_past_each_cap() {
    let event = |key: &str, namespace: &str, seconds: Option<u64>| StoredEvent {
        key: key.into(),
        namespace: namespace.into(),
        last: seconds.map(at),
    };
    let events = [
        event("expired", "default", Some(0)),
        event("timeless", "default", None),
        event("d1", "default", Some(4000)),
        event("d2", "default", Some(4001)),
        event("d3", "default", Some(4002)),
        event("d4", "default", Some(4003)),
        event("p1", "prod", Some(4004)),
        event("p2", "prod", Some(4005)),
    ];
    let mut doomed = sweep(&events, &limits(), at(4010));
    doomed.sort();
    // default keeps its newest 3 (d2-d4); the total of 4 then keeps p2, p1, d4, d3.
    assert_eq!(doomed, ["d1", "d2", "expired", "timeless"]);
}
