//! `proxy.sluice.dev/v1alpha1 UpstreamCluster`: cluster-scoped; its spec is what the gateway
//! loads from files (`sluice-upstream-cluster`), its status the per-server health gateways
//! report.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_upstream_cluster::spec::KIND;

use super::invalid_at;

pub fn upstream_cluster() -> KindSpec {
    KindSpec {
        group: "proxy.sluice.dev".into(),
        version: "v1alpha1".into(),
        kind: KIND.into(),
        plural: "upstreamclusters".into(),
        singular: "upstreamcluster".into(),
        short_names: vec!["uc".into()],
        namespaced: false,
        status_subresource: true,
        printer_columns: vec![
            PrinterColumn::new(
                "Server",
                ".spec.servers[0].endpoint",
                "string",
                "the first apiserver endpoint",
            ),
            PrinterColumn::new(
                "Hostnames",
                ".spec.secureServing.extraHostnames",
                "string",
                "server names clients may use besides the cluster's name",
            ),
        ],
        // The spec's structure is checked by the gateway's own model (unknown fields are
        // errors there, with their path), so the schema only says it is a required object.
        schema: json!({"type": "object", "required": ["spec"], "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}),
        validate,
    }
}

/// The gateway's validation of the object's name and spec; server-set metadata and the status
/// are not the gateway's business and are left out of what it reads.
fn validate(object: &Value) -> Vec<FieldError> {
    match sluice_upstream_cluster::api::parse_object(object) {
        Ok(_) => Vec::new(),
        Err(problems) => problems
            .into_iter()
            .map(|(path, reason)| invalid_at(object, &path, reason))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn example() -> Value {
        let yaml: serde_norway::Value =
            serde_norway::from_str(test_support::examples::UPSTREAM_CLUSTER).unwrap();
        serde_json::to_value(yaml).unwrap()
    }

    #[test]
    fn the_file_example_is_a_valid_object() {
        let created = sluice_apimachinery::meta::prepare_create(
            &upstream_cluster(),
            example(),
            None,
            SystemTime::UNIX_EPOCH,
            "uid-1",
        )
        .unwrap();
        assert_eq!(created["metadata"]["uid"], "uid-1");
    }

    #[test]
    fn mistakes_get_the_gateway_loaders_paths_and_reasons() {
        let mut object = example();
        object["spec"]["servers"][2]["endpoint"] = json!("10.0.0.3:6443");
        object["spec"]["dispatchPolicies"][0]["rules"][0]["verbs"] = json!(["get", "fly"]);
        let errors = validate(&object);
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.servers[2].endpoint",
                "spec.dispatchPolicies[0].rules[0].verbs[1]"
            ],
            "{errors:?}"
        );
        assert!(
            errors[1].detail.contains("\"fly\" is not a request verb"),
            "{errors:?}"
        );
        // The value at the path is quoted, as kube-apiserver does.
        assert_eq!(
            errors[0].kind,
            sluice_apimachinery::FieldErrorKind::Invalid(json!("10.0.0.3:6443"))
        );
    }

    #[test]
    fn unknown_fields_and_wrong_types_name_their_path() {
        let mut object = example();
        object["spec"]["healthCheck"]["intervall"] = json!("1s");
        let errors = validate(&object);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.healthCheck.intervall");
        assert!(
            errors[0].detail.contains("unknown field `intervall`"),
            "{errors:?}"
        );

        let mut object = example();
        object["spec"]["servers"] = json!("one");
        let errors = validate(&object);
        assert_eq!(errors[0].field, "spec.servers", "{errors:?}");
    }

    #[test]
    fn a_file_path_climbing_out_with_dot_dot_is_invalid() {
        // The gateway confines the files an object names to its own credentials directory;
        // a `..` can only mean to leave it, so the control plane refuses it at once.
        let mut object = example();
        object["spec"]["clientConfig"]["bearerTokenFile"] = json!("../../etc/hostname");
        let errors = validate(&object);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.clientConfig.bearerTokenFile");
        assert!(
            errors[0].detail.contains("gateway.credentials_dir"),
            "{errors:?}"
        );
    }

    #[test]
    fn server_set_metadata_and_status_are_not_the_gateways_business() {
        let mut object = example();
        object["metadata"]["uid"] = json!("u");
        object["metadata"]["resourceVersion"] = json!("7");
        object["status"] = json!({"servers": [{"endpoint": "x", "healthy": true}]});
        assert_eq!(validate(&object), []);
    }
}
