use super::*;

const T: Duration = Duration::from_secs(90);

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
}

#[test]
fn the_state_machine_table() {
    use Management as M;
    use VmState as S;
    let now = at(1000);
    let rows: [(Management, Option<SystemTime>, VmState, Reason); 9] = [
        (M::Unmanaged, None, S::Unmanaged, Reason::Unmanaged),
        (M::Unmanaged, Some(at(999)), S::Unmanaged, Reason::Unmanaged),
        (M::Agentless, None, S::Agentless, Reason::Agentless),
        (M::Agentless, Some(at(999)), S::Agentless, Reason::Agentless),
        (M::Agented, None, S::AgentedBootstrap, Reason::NeverReported),
        (
            M::Agented,
            Some(at(999)),
            S::AgentedConnected,
            Reason::HeartbeatReceived,
        ),
        // Exactly the timeout old is stale: three missed 30 s reports.
        (
            M::Agented,
            Some(at(910)),
            S::AgentedBootstrap,
            Reason::HeartbeatMissed,
        ),
        (
            M::Agented,
            Some(at(911)),
            S::AgentedConnected,
            Reason::HeartbeatReceived,
        ),
        // Another replica's clock ahead: fresh, not an error.
        (
            M::Agented,
            Some(at(1005)),
            S::AgentedConnected,
            Reason::HeartbeatReceived,
        ),
    ];
    for (management, heartbeat, state, reason) in rows {
        assert_eq!(
            evaluate(management, heartbeat, now, T),
            (state, reason),
            "{management:?} {heartbeat:?}"
        );
    }
}

fn vm(management: &str, status: Value) -> Value {
    json!({"metadata": {"name": "vm1", "resourceVersion": "7"},
           "spec": {"management": management, "uplink": {"name": "eth0"}}, "status": status})
}

fn report() -> Value {
    json!({"metadata": {"name": "vm1"}, "agentState": "Active", "os": "Debian 12",
           "agentVersion": "0.1.0", "networkPolicies": {"web": "2", "db": "1"},
           "conditions": [{"type": "OVSDBConnected", "status": "True"},
                          {"type": "SomethingElse", "status": "True"}]})
}

fn inputs<'a>(vm: &'a Value, info: Option<&'a Value>, seen: Option<SystemTime>) -> VmInputs<'a> {
    VmInputs {
        vm,
        runtime_info: info,
        seen,
        // Listed long ago: no grace unless a test says so.
        listed: at(0),
        now: at(1000),
        timeout: T,
    }
}

#[test]
fn a_connected_vm_carries_its_agents_report() {
    let vm = vm("Agented", json!({"state": "AgentedBootstrap"}));
    let info = report();
    let decision = vm_status(&inputs(&vm, Some(&info), Some(at(999)))).unwrap();
    assert_eq!(decision.from, Some(VmState::AgentedBootstrap));
    assert_eq!(decision.to, VmState::AgentedConnected);
    assert!(decision.transition());
    let status = &decision.status;
    assert_eq!(status["lastHeartbeat"], json!(format_rfc3339(at(999))));
    assert_eq!(status["agentVersion"], json!("0.1.0"));
    assert_eq!(status["policiesRealized"], json!(2));
    assert_eq!(status["networkPolicies"]["web"], json!("2"));
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["AgentConnected", "OVSDBConnected"]);
    assert_eq!(status["conditions"][0]["status"], json!("True"));
    assert_eq!(
        status["conditions"][0]["lastTransitionTime"],
        json!(format_rfc3339(at(1000)))
    );
}

#[test]
fn a_restarted_replica_gives_connected_vms_one_timeout_to_report() {
    // Back after 10 minutes, this replica has seen no report: the control plane's absence is
    // not the agent's fault, so a Connected VM keeps its state until one timeout after the list.
    let stored = vm(
        "Agented",
        json!({"state": "AgentedConnected", "lastHeartbeat": format_rfc3339(at(400))}),
    );
    let info = report();
    let mut restarted = inputs(&stored, Some(&info), None);
    restarted.listed = at(995);
    let decision = vm_status(&restarted).unwrap();
    assert_eq!(decision.to, VmState::AgentedConnected);
    assert!(!decision.transition());
    // The stored time is what was seen: the grace does not pretend a report.
    assert_eq!(
        decision.status["lastHeartbeat"],
        json!(format_rfc3339(at(400)))
    );
    // No report within the timeout of the list: demoted.
    restarted.now = at(995) + T;
    let decision = vm_status(&restarted).unwrap();
    assert_eq!(decision.to, VmState::AgentedBootstrap);
    assert_eq!(decision.reason, Reason::HeartbeatMissed);
    // The grace never promotes: a VM stored Bootstrap stays so until its agent reports.
    let stale = vm(
        "Agented",
        json!({"state": "AgentedBootstrap", "lastHeartbeat": format_rfc3339(at(400))}),
    );
    let mut restarted = inputs(&stale, Some(&info), None);
    restarted.listed = at(995);
    assert_eq!(vm_status(&restarted).unwrap().to, VmState::AgentedBootstrap);
    // No runtime info: never reported, whatever the stored time or the grace says.
    let mut gone = inputs(&stored, None, Some(at(999)));
    gone.listed = at(995);
    let decision = vm_status(&gone).unwrap();
    assert_eq!(decision.to, VmState::AgentedBootstrap);
    assert_eq!(decision.reason, Reason::NeverReported);
}

#[test]
fn replicas_agree_on_the_later_heartbeat() {
    // A replica that saw the report earlier than the stored one judges by the later time.
    let newer = vm(
        "Agented",
        json!({"state": "AgentedBootstrap", "lastHeartbeat": format_rfc3339(at(995))}),
    );
    let info = report();
    let decision = vm_status(&inputs(&newer, Some(&info), Some(at(905)))).unwrap();
    assert_eq!(decision.to, VmState::AgentedConnected);
    assert_eq!(
        decision.status["lastHeartbeat"],
        json!(format_rfc3339(at(995)))
    );
}

/// Issue 36: a report is a runtime-info write; the VM's status moves only once per timeout
/// while nothing else changes, so 5,000 VMs reporting every 30 s cost a third of a VM write
/// per report, not one.
#[test]
fn reports_refresh_the_stored_heartbeat_once_per_timeout() {
    let info = report();
    let first = vm("Agented", json!({"state": "AgentedBootstrap"}));
    let decision = vm_status(&inputs(&first, Some(&info), Some(at(999)))).unwrap();
    assert_eq!(
        decision.status["lastHeartbeat"],
        json!(format_rfc3339(at(999)))
    );
    let stored = vm("Agented", decision.status);
    for (report_at, now, written) in [
        (1029, 1030, false),
        (1059, 1060, false),
        (1088, 1088, false),
        (1089, 1089, true),
        (1120, 1120, true),
    ] {
        let mut later = inputs(&stored, Some(&info), Some(at(report_at)));
        later.now = at(now);
        let decision = vm_status(&later).unwrap();
        assert_eq!(decision.to, VmState::AgentedConnected, "{report_at}");
        let changed = stored.get("status") != Some(&decision.status);
        assert_eq!(changed, written, "a report at {report_at}");
        if written {
            assert_eq!(
                decision.status["lastHeartbeat"],
                json!(format_rfc3339(at(report_at)))
            );
        }
    }
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let info = report();
    let first = vm("Agented", json!({}));
    let decision = vm_status(&inputs(&first, Some(&info), Some(at(999)))).unwrap();
    assert_eq!(decision.from, None);
    let mut later = vm("Agented", decision.status.clone());
    later["status"]["lastHeartbeat"] = json!(format_rfc3339(at(999)));
    let mut again = inputs(&later, Some(&info), Some(at(1030)));
    again.now = at(1040);
    let next = vm_status(&again).unwrap();
    assert!(!next.transition());
    assert_eq!(
        next.status["conditions"][0]["lastTransitionTime"],
        json!(format_rfc3339(at(1000)))
    );
}

#[test]
fn agentless_vms_ask_for_security_groups() {
    let vm = vm("Agentless", json!({"state": "AgentedConnected"}));
    let decision = vm_status(&inputs(&vm, None, None)).unwrap();
    assert_eq!(decision.to, VmState::Agentless);
    let conditions = decision.status["conditions"].as_array().unwrap();
    assert_eq!(conditions[0]["status"], json!("False"));
    assert_eq!(conditions[1]["type"], json!("SecurityGroupsRequired"));
    assert_eq!(conditions[1]["status"], json!("True"));
    let unknown = json!({"metadata": {"name": "x"}, "spec": {"management": "Other"}});
    assert!(vm_status(&inputs(&unknown, None, None)).is_none());
}

/// `kubectl get vm`'s POLICIES column says what is enforced now: an agent's last report stays
/// on its runtime info after the VM turns Agentless (a No-Op agent reports nothing) or the
/// heartbeat is missed, and must not count.
#[test]
fn only_a_connected_agents_report_counts_as_realized() {
    let info = report();
    let connected = vm("Agented", json!({"state": "AgentedConnected"}));
    let now = vm_status(&inputs(&connected, Some(&info), Some(at(999)))).unwrap();
    assert_eq!(now.status["policiesRealized"], json!(2));
    for (management, seen) in [
        ("Agentless", Some(at(999))),
        ("Unmanaged", Some(at(999))),
        ("Agented", Some(at(1))),
    ] {
        let vm = vm(
            management,
            json!({"state": "AgentedConnected", "policiesRealized": 2}),
        );
        let decision = vm_status(&inputs(&vm, Some(&info), seen)).unwrap();
        assert_ne!(decision.to, VmState::AgentedConnected, "{management}");
        assert_eq!(
            decision.status["policiesRealized"],
            json!(0),
            "{management}"
        );
        assert!(
            decision.status.get("networkPolicies").is_none(),
            "{management}"
        );
    }
}

#[test]
fn a_policy_counts_connected_vms_at_its_generation() {
    let policy = json!({"metadata": {"name": "web", "generation": 2}});
    let span: BTreeSet<String> = ["vm1", "vm2", "vm3"].map(String::from).into();
    let mut states = BTreeMap::new();
    states.insert("vm1".to_string(), VmState::AgentedConnected);
    states.insert("vm2".to_string(), VmState::AgentedConnected);
    states.insert("vm3".to_string(), VmState::AgentedBootstrap);
    let mut infos = BTreeMap::new();
    infos.insert("vm1".to_string(), json!({"networkPolicies": {"web": "2"}}));
    infos.insert("vm2".to_string(), json!({"networkPolicies": {"web": "1"}}));
    infos.insert("vm3".to_string(), json!({"networkPolicies": {"web": "2"}}));
    let status = policy_status(&policy, &span, &states, &infos);
    assert_eq!(
        status,
        json!({"observedGeneration": 2, "desiredVMs": 2, "realizedVMs": 1, "phase": "Realizing"})
    );
    infos.insert("vm2".to_string(), json!({"networkPolicies": {"web": "2"}}));
    let status = policy_status(&policy, &span, &states, &infos);
    assert_eq!(status["phase"], json!("Realized"));
    let status = policy_status(&policy, &BTreeSet::new(), &states, &infos);
    assert_eq!(status["phase"], json!("Pending"));
}
