use super::*;
use crate::kind::tests::widget;
use serde_json::json;

fn gadget() -> KindSpec {
    let mut spec = widget();
    spec.schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "size": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
            "pinned": {"type": "object", "x-kubernetes-map-type": "atomic"},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    spec
}

fn paths(set: &FieldSet) -> Vec<String> {
    set.members()
        .iter()
        .map(|p| super::super::fieldset::render_path(p))
        .collect()
}

#[test]
fn applied_set_owns_leaves_map_entries_and_atomic_fields() {
    let spec = gadget();
    let config = json!({"metadata": {"labels": {"app": "a"}},
        "spec": {"size": 1, "tags": ["x", "y"], "limits": {"cpu": 2},
                 "pinned": {"a": 1}, "extra": {"deep": {"x": 1}}, "empty": {}}});
    let set = applied_set(&root_schema(&spec), &config);
    assert_eq!(
        paths(&set),
        [
            ".metadata.labels.app",
            ".spec.empty",
            ".spec.extra.deep",
            ".spec.extra.deep.x",
            ".spec.limits.cpu",
            ".spec.pinned",
            ".spec.size",
            ".spec.tags",
        ]
    );
}

#[test]
fn project_leaves_out_server_metadata_and_the_status_subresource() {
    let object = json!({"apiVersion": "v", "kind": "k",
        "metadata": {"name": "a", "uid": "u", "resourceVersion": "4", "labels": {"x": "y"}},
        "spec": {"size": 1}, "status": {"ok": true}});
    let main = project(&gadget(), &object, Scope::Main);
    assert_eq!(
        main,
        json!({"metadata": {"labels": {"x": "y"}}, "spec": {"size": 1}})
    );
    let status = project(&gadget(), &object, Scope::Status);
    assert_eq!(status, json!({"status": {"ok": true}}));
    let bare = json!({"metadata": {"name": "a"}, "spec": {}});
    assert_eq!(
        project(&gadget(), &bare, Scope::Main),
        json!({"metadata": {}, "spec": {}})
    );
}

#[test]
fn compare_reports_added_modified_and_removed_fields() {
    let schema = root_schema(&gadget());
    let old = json!({"spec": {"size": 1, "tags": ["x"], "limits": {"cpu": 1}}});
    let new = json!({"spec": {"size": 2, "tags": ["x"], "extra": {"a": 1}}});
    let comparison = compare(&schema, &old, &new);
    assert_eq!(paths(&comparison.added), [".spec.extra", ".spec.extra.a"]);
    assert_eq!(paths(&comparison.modified), [".spec.size"]);
    assert_eq!(
        paths(&comparison.removed),
        [".spec.limits", ".spec.limits.cpu"]
    );
    assert!(compare(&schema, &old, &old).is_empty());
    // A list is one field: any change modifies it as a whole.
    let retagged = json!({"spec": {"size": 1, "tags": ["y"], "limits": {"cpu": 1}}});
    assert_eq!(
        paths(&compare(&schema, &old, &retagged).modified),
        [".spec.tags"]
    );
}

#[test]
fn merge_keeps_live_fields_and_replaces_lists() {
    let schema = root_schema(&gadget());
    let live = json!({"metadata": {"name": "a"}, "spec": {"size": 1, "tags": ["x", "y"],
                      "limits": {"cpu": 1}}});
    let config = json!({"spec": {"tags": ["z"], "limits": {"mem": 2, "cpu": null}}});
    assert_eq!(
        merge(Some(&schema), &live, &config),
        json!({"metadata": {"name": "a"}, "spec": {"size": 1, "tags": ["z"],
               "limits": {"mem": 2}}})
    );
}

#[test]
fn prune_removes_only_what_the_applier_alone_owned() {
    let schema = root_schema(&gadget());
    let mut object = json!({"metadata": {"name": "a", "labels": {"gone": "1"}},
        "spec": {"size": 1, "tags": ["x"], "limits": {"cpu": 1, "mem": 2}}});
    let last = applied_set(
        &schema,
        &json!({"metadata": {"labels": {"gone": "1"}},
                "spec": {"size": 1, "tags": ["x"], "limits": {"cpu": 1}}}),
    );
    // Now applies only the size; other managers own the tags and the memory limit.
    let kept = applied_set(
        &schema,
        &json!({"spec": {"size": 1, "tags": ["x"], "limits": {"mem": 2}}}),
    );
    prune_object(&schema, &mut object, &last, &kept);
    assert_eq!(
        object,
        json!({"metadata": {"name": "a"},
               "spec": {"size": 1, "tags": ["x"], "limits": {"mem": 2}}})
    );
}
