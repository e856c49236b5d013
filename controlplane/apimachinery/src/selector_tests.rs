use proptest::prelude::*;
use serde_json::json;

use super::*;

fn labelled(labels: Value) -> Value {
    json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
}

#[test]
fn label_operators() {
    let obj = labelled(json!({"app": "web", "tier": "front", "n": "5"}));
    let matches = |s: &str| LabelSelector::parse(s).expect(s).matches(&obj);
    assert!(matches(""));
    assert!(matches("app=web"));
    assert!(matches("app==web,tier"));
    assert!(matches("app != db"));
    assert!(matches("missing!=x"));
    assert!(matches("app in (web, db)"));
    assert!(!matches("app notin (web)"));
    assert!(matches("missing notin (x)"));
    assert!(matches("!missing"));
    assert!(!matches("!app"));
    assert!(matches("n>4,n<6"));
    assert!(!matches("sluice.dev/role=gateway"));
    assert!(!LabelSelector::parse("app")
        .expect("exists")
        .matches(&labelled(json!(null))));
}

#[test]
fn label_parse_errors_are_bad_requests() {
    for bad in [
        "app=",
        "a b",
        "app in web",
        "app in (web",
        "=x",
        "app=x,",
        "app=x y",
        "n>x",
        "a=b=c",
    ] {
        let parsed = LabelSelector::parse(bad);
        if bad == "app=" {
            // An empty value is a valid label value: `app=` selects app="".
            assert!(parsed.is_ok());
            continue;
        }
        let error = parsed.expect_err(bad);
        assert_eq!(error.code, 400, "{bad}");
        assert!(
            error.message.contains("unable to parse requirement"),
            "{}",
            error.message
        );
    }
}

#[test]
fn field_selectors() {
    let obj = labelled(json!({}));
    let matches = |s: &str| FieldSelector::parse(s).expect(s).matches(&obj);
    assert!(matches("metadata.name=a"));
    assert!(matches("metadata.name==a,metadata.namespace!=other"));
    assert!(!matches("metadata.namespace=other"));
    assert_eq!(
        FieldSelector::parse("metadata.name=a")
            .expect("ok")
            .exact_name(),
        Some("a")
    );
    let error = FieldSelector::parse("spec.size=1").expect_err("unsupported");
    assert_eq!(error.message, "field label not supported: spec.size");
    assert_eq!(
        FieldSelector::parse("nonsense").expect_err("syntax").code,
        400
    );
    let escaped = FieldSelector::parse(r"metadata.name=a\,b").expect("escaped comma");
    assert_eq!(escaped.requirements[0].value, "a,b");
}

/// `kubectl describe`'s selector of a cluster-scoped object's events: the empty namespace
/// matches an involvedObject without one; other kinds refuse event fields.
#[test]
fn event_field_selectors() {
    let event = json!({"metadata": {"name": "vm1.1", "namespace": "default"},
        "involvedObject": {"kind": "VirtualMachine", "name": "vm1", "uid": "u-1"},
        "source": {"component": "vm-manager"}, "type": "Normal"});
    let selector = |s: &str| FieldSelector::parse(s).expect(s);
    let describe = "involvedObject.name=vm1,involvedObject.namespace=,\
        involvedObject.kind=VirtualMachine,involvedObject.uid=u-1";
    assert!(selector(describe).matches(&event));
    assert!(!selector("involvedObject.uid=u-2").matches(&event));
    assert!(selector("source=vm-manager,type!=Warning").matches(&event));
    assert!(!selector("reason=Started").matches(&event));
    assert!(selector(describe).unsupported(true).is_none());
    let refused = selector(describe)
        .unsupported(false)
        .expect("not an event kind");
    assert_eq!(
        (refused.code, refused.message.as_str()),
        (400, "field label not supported: involvedObject.name")
    );
    assert!(selector("metadata.name=a").unsupported(false).is_none());
}

proptest! {
    #[test]
    fn label_parser_never_panics(text in ".{0,64}") {
        let _ = LabelSelector::parse(&text);
    }

    #[test]
    fn label_parser_never_panics_on_selector_alphabet(text in "[a-z!=,() in/.<>0-9-]{0,40}") {
        let _ = LabelSelector::parse(&text);
    }

    #[test]
    fn field_parser_never_panics(text in ".{0,64}") {
        let _ = FieldSelector::parse(&text);
    }

    #[test]
    fn written_selectors_parse_back(
        key in "[a-z][a-z0-9]{0,8}",
        values in proptest::collection::btree_set("[a-z0-9]{1,6}", 1..4),
        negated in any::<bool>(),
    ) {
        let joined: Vec<&str> = values.iter().map(String::as_str).collect();
        let op = if negated { "notin" } else { "in" };
        let text = format!("{key} {op} ({}),!{key}x", joined.join(","));
        let parsed = LabelSelector::parse(&text).expect("valid selector");
        let first = if negated {
            LabelRequirement::NotIn(key.clone(), values.clone())
        } else {
            LabelRequirement::In(key.clone(), values.clone())
        };
        prop_assert_eq!(parsed.requirements, vec![first, LabelRequirement::NotExists(format!("{key}x"))]);
    }
}
