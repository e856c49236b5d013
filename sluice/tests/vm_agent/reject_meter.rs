//! A VM flooding a Reject rule: the Reject meter bounds what reaches the agent (packet-ins, and
//! so replies) by its rate and burst, counts what it dropped, and allowed traffic keeps flowing.

use super::*;

/// The meter's settings for this test, passed explicitly so the bound below does not silently
/// follow a change of the defaults.
const RATE: u32 = 100;
const BURST: u32 = 200;
/// How long vm3 floods.
const FLOOD: Duration = Duration::from_secs(2);
/// UDP port of the `flood` Reject rule.
const FLOOD_PORT: u16 = 9999;
/// Datagrams vm3 sends per 10 ms: 5,000 per second, 25 times the meter's rate.
const PER_TICK: u32 = 50;

fn flood_policy(vm1_port: u32) -> String {
    format!(
        r#"
addressGroups:
  - {{name: clients, members: [10.0.0.2]}}
  - {{name: vm3, members: [10.0.0.3]}}
appliedToGroups:
  - name: vm1
    members: [{{name: vm1-eth0, ofport: {vm1_port}, ips: [10.0.0.1]}}]
policies:
  - name: web
    priority: 50
    appliedTo: [vm1]
    rules:
      - {{name: http, direction: Ingress, action: Allow, peers: {{addressGroups: [clients]}}, services: [{{protocol: TCP, port: 80}}]}}
      - {{name: flood, direction: Ingress, action: Reject, peers: {{addressGroups: [vm3]}}, services: [{{protocol: UDP, port: {FLOOD_PORT}}}]}}
"#
    )
}

/// Sends UDP datagrams from `from` to vm1's flood port for `FLOOD`, `PER_TICK` every 10 ms;
/// returns how many the kernel accepted. One socket is enough: the Reject flow never commits to
/// conntrack, so every datagram is `+new` and meets the rule again.
fn flood(from: &NetNs) -> u64 {
    let script = format!(
        "import socket, time\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         sent = 0\n\
         end = time.monotonic() + {seconds}\n\
         while time.monotonic() < end:\n\
         \x20   for _ in range({PER_TICK}):\n\
         \x20       try:\n\
         \x20           s.sendto(b'x' * 32, ('10.0.0.1', {FLOOD_PORT}))\n\
         \x20           sent += 1\n\
         \x20       except OSError:\n\
         \x20           pass\n\
         \x20   time.sleep(0.01)\n\
         print(sent)\n",
        seconds = FLOOD.as_secs_f64()
    );
    let output = from.exec(&["python3", "-c", &script]).unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

fn replies(agent: &Agent) -> f64 {
    agent
        .metric("sluice_policy_reject_replies_total{kind=\"icmp_unreachable\"}")
        .unwrap_or(0.0)
}

/// Why this fails without the meter: every flooded datagram then becomes a packet-in and the
/// agent answers each one, far above the bound, and the dropped counter stays at zero. Measured
/// with the meter opened to 1,000,000/s: 9,750 of 9,750 datagrams answered, 0 dropped (with
/// these settings: 399 of 9,800 answered, 9,401 dropped).
#[test]
fn a_reject_flood_is_cut_to_the_meter_rate_while_allowed_traffic_flows() {
    let ovs = OvsInstance::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies.yaml");
    // The agent creates the bridge the VMs attach to; their policy follows once the ports exist.
    write_policies(&policies, "policies: []\n");
    let (rate, burst) = (RATE.to_string(), BURST.to_string());
    let agent = Agent::start_with(
        &ovs,
        &policies,
        &["--reject-rate", &rate, "--reject-burst", &burst],
    );
    let vms = attach_vms(&ovs);
    let generation = agent.metric("sluice_policy_generation ").unwrap();
    write_policies(&policies, &flood_policy(vms.vm1_port));
    wait_generation(&agent, generation);
    assert_eq!(probe(&vms.vm2, "10.0.0.1", 80, "2").0, Probe::Connected);
    let before = replies(&agent);

    let started = Instant::now();
    let (sent, allowed) = std::thread::scope(|scope| {
        let flooding = scope.spawn(|| flood(&vms.vm3));
        // Allowed traffic while vm3 floods: new connections from vm2 keep being admitted. The
        // flood is under way once the agent has answered one of its datagrams.
        assert!(
            wait(FLOOD, || replies(&agent) > before),
            "the flood never reached the agent"
        );
        let allowed: Vec<Probe> = (0..3)
            .map(|_| probe(&vms.vm2, "10.0.0.1", 80, "2").0)
            .collect();
        assert!(!flooding.is_finished(), "the probes ran after the flood");
        (flooding.join().unwrap(), allowed)
    });
    let flooded_for = started.elapsed();
    assert_eq!(
        allowed,
        [Probe::Connected; 3],
        "allowed traffic during the flood"
    );

    // Settled: replies, the rule's flow stats (which OVS's revalidators update about every
    // 500 ms) and the meter's drops stopped changing, and drops were counted.
    let read = |agent: &Agent| {
        let metric = |name: &str| agent.metric(name).unwrap_or(0.0);
        (
            replies(agent) - before,
            metric("sluice_policy_rule_packets_total{policy=\"web\",rule=\"flood\""),
            metric("sluice_policy_reject_meter_dropped_packets_total"),
        )
    };
    let mut seen = (0.0, 0.0, 0.0);
    assert!(
        wait(Duration::from_secs(15), || {
            let earlier = read(&agent);
            std::thread::sleep(Duration::from_millis(700));
            seen = read(&agent);
            seen == earlier && seen.2 > 0.0
        }),
        "not settled or no drops counted ({seen:?}): {}",
        agent.get("/metrics").1
    );
    let (handled, hit_rule, dropped) = seen;
    // The bound: what the meter lets through while the flood lasted (its bucket starts full at
    // `BURST` and refills at `RATE`), plus two seconds of `RATE` as margin: one for OVS's bucket
    // (some releases size it burst + rate), one for timing between our clock and the switch's.
    let seconds = flooded_for.as_secs_f64();
    let bound = f64::from(RATE) * (seconds + 2.0) + f64::from(BURST);
    eprintln!(
        "flood: {sent} datagrams sent in {seconds:.2} s, {hit_rule} reached the Reject rule, \
         {handled} answered by the agent (bound {bound:.0}), {dropped} dropped by the meter"
    );
    assert!(handled >= 1.0, "the rule still answers");
    assert!(handled <= bound, "{handled} replies exceed {bound:.0}");
    // The flood was far beyond the bound, so the bound is the meter's doing.
    assert!(
        hit_rule > 3.0 * bound,
        "only {hit_rule} packets hit the rule"
    );
    // Everything the meter did not let through, it dropped and counted.
    assert!(
        dropped >= hit_rule - bound,
        "{dropped} dropped of {hit_rule}"
    );
    // What the meter let through fits the agent's packet-in queue: nothing dropped unanswered
    // (and the counter that would say so is exported).
    assert_eq!(
        agent.metric("sluice_policy_packet_ins_dropped_total"),
        Some(0.0)
    );
}
