use std::io::Write as _;

use proptest::prelude::*;

use super::*;
use crate::model::Direction;

const VALID: &str = r#"
addressGroups:
  - name: web-clients
    members: [10.0.0.2, 10.0.1.0/24, "fd00::2"]
appliedToGroups:
  - name: vm1
    members:
      - {name: vm1-eth0, ofport: 1, ips: [10.0.0.1], mac: "02:00:0a:00:00:01"}
policies:
  - name: web
    namespace: default
    priority: 10
    appliedTo: [vm1]
    rules:
      - name: http
        direction: Ingress
        action: Allow
        peers:
          addressGroups: [web-clients]
          ipBlocks: [{cidr: 10.2.0.0/16, except: [10.2.3.0/24]}]
        services:
          - {protocol: TCP, port: 80, endPort: 90}
          - {protocol: ICMP, icmpType: 8, icmpCode: 0}
      - {direction: Egress, action: Reject}
"#;

fn errors_of(text: &str, format: Format) -> Vec<String> {
    match load_str(text, "p.yaml", format) {
        Ok(set) => panic!("expected errors, got {set:?}"),
        Err(error) => error.to_string().lines().map(String::from).collect(),
    }
}

#[test]
fn valid_document_loads() {
    let set = load_str(VALID, "p.yaml", Format::Yaml).expect("valid");
    let policy = &set.policies["default/web"];
    assert_eq!(policy.priority, 10);
    assert_eq!(policy.rules.len(), 2);
    assert_eq!(
        policy.isolation,
        [Direction::Ingress, Direction::Egress].into()
    );
    assert_eq!(policy.rules[0].services[0].end_port, Some(90));
    assert_eq!(policy.rules[0].peers.ip_blocks[0].except.len(), 1);
    assert_eq!(set.address_groups["web-clients"].members.len(), 3);
    let vm = &set.applied_to_groups["vm1"].members["vm1-eth0"];
    assert_eq!(vm.ofport, 1);
    assert_eq!(
        vm.mac.map(|m| m.to_string()).as_deref(),
        Some("02:00:0a:00:00:01")
    );
}

#[test]
fn an_interface_without_ofport_is_left_for_the_agent_to_resolve() {
    let text = "appliedToGroups: [{name: g, members: [{name: eth0, ips: [10.0.0.9]}, {name: e1}]}]";
    let set = load_str(text, "p.yaml", Format::Yaml).expect("ofport is optional");
    let members = &set.applied_to_groups["g"].members;
    assert_eq!(members["eth0"].ofport, crate::model::UNRESOLVED_PORT);
    assert_eq!(
        members["e1"].ofport,
        crate::model::UNRESOLVED_PORT,
        "two unresolved ports do not clash"
    );
}

#[test]
fn json_loads_the_same_as_yaml() {
    let json = r#"{"addressGroups":[{"name":"g","members":["10.0.0.2"]}],
        "appliedToGroups":[{"name":"vm1","members":[{"name":"e0","ofport":1,"ips":["10.0.0.1"]}]}],
        "policies":[{"name":"p","priority":1,"appliedTo":["vm1"],
          "rules":[{"direction":"Ingress","action":"Allow","peers":{"addressGroups":["g"]}}]}]}"#;
    let from_json = load_str(json, "p.json", Format::Json).expect("valid json");
    let from_yaml = load_str(json, "p.yaml", Format::Yaml).expect("json is yaml");
    assert_eq!(from_json, from_yaml);
    assert_eq!(
        errors_of("{} trailing", Format::Json).len(),
        1,
        "trailing characters are an error"
    );
}

#[test]
fn every_error_is_reported_with_its_path() {
    let text = r#"
addressGroups:
  - name: g
    members: [10.0.0.1, not-an-ip, 10.0.0.1/8]
  - name: g
appliedToGroups:
  - name: vm1
    members: [{name: e0, ofport: 0, ips: [10.0.0.300], mac: "zz"}]
policies:
  - name: p
    priority: 1000
    appliedTo: [vm1, missing]
    rules:
      - direction: Sideways
        action: Permit
        peers:
          addressGroups: [nope]
          ipBlocks: [{cidr: 10.0.0.0/24, except: [10.1.0.0/24]}, {cidr: 10.0.0.0}]
        services:
          - {protocol: TCP, port: 70000}
          - {protocol: TCP, port: 90, endPort: 80}
          - {protocol: ICMP, port: 8}
          - {protocol: GRE}
          - {protocol: UDP, icmpType: 3}
  - name: p
    priority: 2
    appliedTo: [vm1]
  - name: q
    priority: 2
    appliedTo: [vm1]
"#;
    let errors = errors_of(text, Format::Yaml);
    let expected = [
        "p.yaml: addressGroups[0].members[1]: \"not-an-ip\" is not a valid CIDR",
        "p.yaml: addressGroups[0].members[2]: 10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)",
        "p.yaml: addressGroups[1].name: duplicate address group name \"g\"",
        "p.yaml: appliedToGroups[0].members[0].ofport: 0 is not a valid OpenFlow port number",
        "p.yaml: appliedToGroups[0].members[0].ips[0]: \"10.0.0.300\" is not an IP address",
        "p.yaml: policies[0].priority: 1000 is out of range 0..=999 (lower number = higher precedence)",
        "p.yaml: policies[0].appliedTo[1]: applied-to group \"missing\" is not defined in appliedToGroups",
        "p.yaml: policies[0].rules[0].direction: \"Sideways\" is not a direction (Ingress or Egress)",
        "p.yaml: policies[0].rules[0].action: \"Permit\" is not an action (Allow, Drop or Reject)",
        "p.yaml: policies[0].rules[0].peers.addressGroups[0]: address group \"nope\" is not defined in addressGroups",
        "p.yaml: policies[0].rules[0].peers.ipBlocks[0].except[0]: 10.1.0.0/24 is not inside the cidr 10.0.0.0/24",
        "p.yaml: policies[0].rules[0].peers.ipBlocks[1].cidr: \"10.0.0.0\" is an address, a CIDR (address/prefix) is needed here",
        "p.yaml: policies[0].rules[0].services[0].port: 70000 is not a valid port",
        "p.yaml: policies[0].rules[0].services[1].endPort: port range 90-80 is reversed (endPort must be >= port)",
        "p.yaml: policies[0].rules[0].services[2].port: ICMP has no ports; use icmpType",
        "p.yaml: policies[0].rules[0].services[3].protocol: \"GRE\" is not a protocol (TCP, UDP, SCTP or ICMP)",
        "p.yaml: policies[0].rules[0].services[4].icmpType: icmpType only applies to ICMP, not UDP",
        "p.yaml: policies[2].priority: priority 2 is already used by policy \"p\"; policy priorities must be unique",
    ];
    for line in expected {
        assert!(
            errors.iter().any(|e| e == line),
            "missing {line}\ngot:\n{}",
            errors.join("\n")
        );
    }
    // The MAC error is reported too; policies[1] reuses the name of an invalid policy and is
    // accepted on its own.
    assert!(errors
        .iter()
        .any(|e| e.starts_with("p.yaml: appliedToGroups[0].members[0].mac: ")));
    assert_eq!(errors.len(), expected.len() + 1, "{}", errors.join("\n"));
}

#[test]
fn duplicate_policy_and_unknown_fields_are_rejected() {
    let text = r#"
appliedToGroups: [{name: vm1, members: [{name: e0, ofport: 1, colour: red}]}]
policies:
  - {name: p, priority: 1, appliedTo: [vm1], tier: high}
  - {name: p, priority: 2, appliedTo: [vm1]}
extra: 1
"#;
    let errors = errors_of(text, Format::Yaml);
    assert_eq!(
        errors,
        [
            "p.yaml: appliedToGroups[0].members[0].colour: unknown field",
            "p.yaml: policies[0].tier: unknown field",
            "p.yaml: extra: unknown field",
            "p.yaml: policies[1].name: duplicate policy \"p\"",
        ]
    );
}

#[test]
fn type_errors_name_the_field_without_internal_names() {
    let errors = errors_of("policies: [{name: p, priority: high}]", Format::Yaml);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("p.yaml: policies[0].priority: "),
        "{errors:?}"
    );
    let errors = errors_of("policies: 3", Format::Yaml);
    assert!(!errors[0].contains("Raw"), "{errors:?}");
    let errors = errors_of(r#"{"policies": [{"name": 1}]}"#, Format::Json);
    assert!(
        errors[0].starts_with("p.yaml: policies[0].name: "),
        "{errors:?}"
    );
}

#[test]
fn too_many_rules_is_an_error() {
    let rules = vec!["{direction: Ingress, action: Drop}"; 65].join(", ");
    let text = format!(
        "appliedToGroups: [{{name: vm1, members: []}}]\npolicies: [{{name: p, appliedTo: [vm1], rules: [{rules}]}}]"
    );
    let errors = errors_of(&text, Format::Yaml);
    assert_eq!(
        errors,
        ["p.yaml: policies[0].rules: 65 rules exceed the limit of 64 per policy"]
    );
}

#[test]
fn files_are_read_by_extension_and_missing_files_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("policies.json");
    let mut file = std::fs::File::create(&path).expect("create");
    file.write_all(br#"{"policies": []}"#).expect("write");
    assert!(load_file(&path).expect("loads").policies.is_empty());
    let missing = dir.path().join("missing.yaml");
    let error = load_file(&missing).expect_err("missing");
    assert!(error.to_string().contains("cannot read file"), "{error}");
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_the_loader(text in ".{0,300}") {
        let _ = load_str(&text, "fuzz.yaml", Format::Yaml);
        let _ = load_str(&text, "fuzz.json", Format::Json);
    }

    #[test]
    fn mutated_documents_never_panic_the_loader(
        cut in 0usize..VALID.len(),
        insert in "[-:\\[\\]{}0-9a-zA-Z/., \n]{0,20}",
    ) {
        let mut text = VALID.to_string();
        let cut = (0..=cut).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.insert_str(cut, &insert);
        let _ = load_str(&text, "fuzz.yaml", Format::Yaml);
    }

    #[test]
    fn arbitrary_numbers_are_validated_not_panicked(port: i64, end: i64, priority: i64, ofport: i64) {
        let text = format!(
            "appliedToGroups: [{{name: vm1, members: [{{name: e, ofport: {ofport}}}]}}]\n\
             policies: [{{name: p, priority: {priority}, appliedTo: [vm1], rules: [\
             {{direction: Ingress, action: Allow, services: [{{protocol: TCP, port: {port}, endPort: {end}}}]}}]}}]"
        );
        let result = load_str(&text, "n.yaml", Format::Yaml);
        let valid = (1..=65535).contains(&port) && (port..=65535).contains(&end)
            && (0..=999).contains(&priority) && (1..0xffff_ff00).contains(&ofport);
        prop_assert_eq!(result.is_ok(), valid, "{:?}", result.err());
    }
}

#[test]
fn one_port_cannot_belong_to_two_interfaces() {
    let text = r#"
appliedToGroups:
  - {name: a, members: [{name: e0, ofport: 1}]}
  - {name: b, members: [{name: e0, ofport: 1}, {name: e1, ofport: 1}]}
"#;
    assert_eq!(
        errors_of(text, Format::Yaml),
        ["p.yaml: appliedToGroups[1].members[1].ofport: OpenFlow port 1 already belongs to interface \"e0\""]
    );
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write policy file");
}

#[test]
fn a_directory_merges_its_policy_files_across_references() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "10-groups.yaml",
        "addressGroups: [{name: clients, members: [10.0.0.2]}]\n\
         appliedToGroups: [{name: vm1, members: [{name: e1, ofport: 1}]}]\n",
    );
    write(
        dir.path(),
        "20-web.json",
        r#"{"policies": [{"name": "web", "priority": 1, "appliedTo": ["vm1"],
            "rules": [{"direction": "Ingress", "action": "Allow",
                       "peers": {"addressGroups": ["clients"]}}]}]}"#,
    );
    write(
        dir.path(),
        "30-db.yml",
        "policies: [{name: db, priority: 2, appliedTo: [vm1], rules: []}]\n",
    );
    // Not policy files: other extensions, hidden files, directories.
    write(dir.path(), "README.md", "not: [a, policy\n");
    write(dir.path(), ".40-swap.yaml", "policies: [{{{\n");
    std::fs::create_dir(dir.path().join("sub.yaml")).expect("mkdir");
    let set = load_path(dir.path()).expect("valid directory");
    assert_eq!(
        set.policies.keys().collect::<Vec<_>>(),
        ["db", "web"],
        "policies of both files"
    );
    assert!(set.address_groups.contains_key("clients"));
    let empty = tempfile::tempdir().expect("temp dir");
    assert!(load_dir(empty.path())
        .expect("empty is valid")
        .policies
        .is_empty());
}

#[test]
fn directory_errors_name_the_file_and_the_path_inside_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let groups = "appliedToGroups: [{name: vm1, members: [{name: e1, ofport: 1}]}]\n";
    write(dir.path(), "a.yaml", groups);
    write(
        dir.path(),
        "b.yaml",
        "policies:\n  - {name: ok, priority: 1, appliedTo: [vm1]}\n  - {name: bad, priority: 2000, appliedTo: [vm1]}\n",
    );
    write(
        dir.path(),
        "c.yaml",
        "appliedToGroups: [{name: vm1, members: []}]\npolicies: [{name: ok, priority: 3, appliedTo: [vm1]}]\n",
    );
    let error = load_dir(dir.path()).expect_err("invalid directory");
    let (a, b, c) = (
        dir.path().join("a.yaml").display().to_string(),
        dir.path().join("b.yaml").display().to_string(),
        dir.path().join("c.yaml").display().to_string(),
    );
    let lines: Vec<String> = error.to_string().lines().map(String::from).collect();
    assert_eq!(
        lines,
        [
            format!("{b}: policies[1].priority: 2000 is out of range 0..=999 (lower number = higher precedence)"),
            format!("{c}: appliedToGroups[0].name: applied-to group \"vm1\" is already defined in {a}"),
            format!("{c}: policies[0].name: policy \"ok\" is already defined in {b}"),
        ]
    );
    assert_eq!(error.error_count(), 3);
    assert_eq!(error.sources.len(), 2, "grouped by file");
}

#[test]
fn a_broken_file_in_a_directory_is_reported_alone_with_its_parse_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(dir.path(), "a.yaml", "policies: []\n");
    write(dir.path(), "b.json", "{\"policies\": [}");
    let error = load_path(dir.path()).expect_err("broken json");
    assert_eq!(error.sources.len(), 1);
    assert!(error.sources[0].origin.ends_with("b.json"), "{error}");
    let missing = dir.path().join("nope");
    let error = load_path(&missing).expect_err("missing path");
    assert!(error.to_string().contains("cannot read file"), "{error}");
}

#[test]
fn policy_file_names() {
    for name in ["a.yaml", "b.YML", "c.json", "x.y.yaml"] {
        assert!(is_policy_file_name(name), "{name}");
    }
    for name in [".a.yaml", "a.yaml.tmp", "yaml", "a.txt", "..data"] {
        assert!(!is_policy_file_name(name), "{name}");
    }
}

#[test]
fn a_file_may_name_each_interfaces_vm() {
    let text = "appliedToGroups: [{name: a, members: [{name: e0, ofport: 1, vm: vm-a}]}]\n";
    let set = load_str(text, "p.yaml", Format::Yaml).expect("vm is optional and allowed");
    assert!(set.applied_to_groups["a"].members.contains_key("e0"));
    let text = "appliedToGroups: [{name: a, members: [{name: e0, ofport: 1, vm: ''}]}]\n";
    assert_eq!(
        errors_of(text, Format::Yaml),
        ["p.yaml: appliedToGroups[0].members[0].vm: must not be empty"]
    );
}
