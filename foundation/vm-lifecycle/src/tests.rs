use std::str::FromStr;

use super::*;

/// Every word parses back from its name, serde writes and reads the same name, and `NAMES`
/// lists exactly the names of `ALL`.
macro_rules! round_trips {
    ($($word:ty),+) => {$(
        assert_eq!(<$word>::ALL.map(<$word>::as_str), <$word>::NAMES);
        for value in <$word>::ALL {
            assert_eq!(<$word>::parse(value.as_str()), Some(value));
            assert_eq!(<$word>::from_str(value.as_str()), Ok(value));
            let json = serde_json::to_string(&value).unwrap();
            assert_eq!(json, format!("{:?}", value.as_str()));
            assert_eq!(serde_json::from_str::<$word>(&json).unwrap(), value);
            assert_eq!(value.to_string(), value.as_str());
        }
    )+};
}

#[test]
fn every_word_round_trips() {
    round_trips!(
        Management,
        VmState,
        ConnectedReason,
        AgentMode,
        PolicyPhase,
        VmCondition,
        AgentCondition,
        ConditionStatus
    );
}

#[test]
fn the_wire_names_are_the_seeds() {
    // These strings are stored in objects and read by kubectl users and older agents:
    // changing one is a wire change, not a refactoring.
    assert_eq!(Management::NAMES, ["Agented", "Agentless", "Unmanaged"]);
    assert_eq!(
        VmState::NAMES,
        [
            "Unmanaged",
            "Agentless",
            "AgentedBootstrap",
            "AgentedConnected"
        ]
    );
    assert_eq!(AgentMode::NAMES, ["NoOp", "Active"]);
    assert_eq!(PolicyPhase::NAMES, ["Pending", "Realizing", "Realized"]);
    assert_eq!(
        AGENT_CONDITIONS,
        [
            "ControlPlaneConnected",
            "OVSDBConnected",
            "OpenFlowConnected",
            "PoliciesRealized"
        ]
    );
    let reasons =
        AgentCondition::ALL.map(|condition| (condition.reason(true), condition.reason(false)));
    assert_eq!(
        reasons,
        [
            ("Reporting", "Unreachable"),
            ("Connected", "Unreachable"),
            ("InSync", "Reconnecting"),
            ("Realized", "Failed")
        ]
    );
    assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
    assert_eq!(Management::one_of(), "Agented, Agentless or Unmanaged");
    assert_eq!(AgentMode::one_of(), "NoOp or Active");
}

#[test]
fn unknown_names_are_refused_naming_the_field_and_the_choices() {
    let error = Management::from_str("agented").unwrap_err();
    assert_eq!(
        error.to_string(),
        "spec.management: \"agented\" is not one of [\"Agented\", \"Agentless\", \"Unmanaged\"]"
    );
    assert_eq!(VmState::parse(""), None);
    let long = "x".repeat(500);
    assert_eq!(AgentMode::from_str(&long).unwrap_err().found.len(), 64);
    assert!(serde_json::from_str::<VmState>("\"Connected\"").is_err());
}

#[test]
fn only_connected_vms_receive_policies_and_phases_follow_counts() {
    let receiving: Vec<VmState> = VmState::ALL
        .into_iter()
        .filter(|state| state.receives_policies())
        .collect();
    assert_eq!(receiving, [VmState::AgentedConnected]);
    assert_eq!(PolicyPhase::of(0, 0), PolicyPhase::Pending);
    assert_eq!(PolicyPhase::of(2, 1), PolicyPhase::Realizing);
    assert_eq!(PolicyPhase::of(2, 2), PolicyPhase::Realized);
    assert_eq!(ConditionStatus::of(true).as_str(), "True");
    assert_eq!(ConditionStatus::of(false).as_str(), "False");
}
