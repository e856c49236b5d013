//! `policy.sluice.dev/v1alpha1 NetworkPolicy`: a policy as the VM agent compiles it (a policy
//! file's `policies[]` entry; the name is `metadata.name`).
//!
//! Cluster-scoped. The model's policy has an *optional* namespace: Kubernetes policies have one,
//! cluster-wide ones (Antrea's ClusterNetworkPolicy) do not, and a kube kind is either namespaced
//! or not. So, like Antrea's internal (controlplane) NetworkPolicy, which is cluster-scoped and
//! keeps the source policy's namespace in `sourceRef`, the namespace is `spec.namespace`; the
//! agent's key for the policy is `spec.namespace/metadata.name` as in a file.

use serde_json::{json, Value};
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_policy_model::object::validate_network_policy;

use super::policy::{model_errors, policy_kind, Names};

pub fn network_policy() -> KindSpec {
    let mut kind = policy_kind(
        Names {
            kind: "NetworkPolicy",
            plural: "networkpolicies",
            singular: "networkpolicy",
            short: "vmnp",
        },
        vec![
            PrinterColumn::new(
                "Namespace",
                ".spec.namespace",
                "string",
                "namespace of the source policy (none: cluster-wide)",
            ),
            PrinterColumn::new(
                "Priority",
                ".spec.priority",
                "integer",
                "lower number = higher precedence",
            ),
            PrinterColumn::new(
                "Applied To",
                ".spec.appliedTo",
                "string",
                "the applied-to groups whose interfaces enforce it",
            ),
            PrinterColumn::new(
                "Realized",
                ".status.realizedVMs",
                "integer",
                "VMs whose agent reports this generation realized",
            ),
            PrinterColumn::new(
                "Desired",
                ".status.desiredVMs",
                "integer",
                "AgentedConnected VMs in the policy's span",
            ),
        ],
        "priority, appliedTo, policyTypes and ordered rules, as a policy file's entry",
        validate,
    );
    // Realization status (as Antrea's NetworkPolicy status), written by the VMManager only;
    // as a subresource it does not bump the generation the agents report back.
    kind.status_subresource = true;
    kind.schema["properties"]["status"] = json!({"type": "object", "properties": {
        "observedGeneration": {"type": "integer"},
        "desiredVMs": {"type": "integer"},
        "realizedVMs": {"type": "integer"},
        "phase": {"type": "string", "description": "Realized, Realizing or Pending"}}});
    kind
}

fn validate(object: &Value) -> Vec<FieldError> {
    model_errors(object, validate_network_policy)
}

#[cfg(test)]
mod tests {
    use sluice_apimachinery::FieldErrorKind;

    use super::*;
    use crate::kinds::policy::tests::{created, example};

    #[test]
    fn the_example_is_a_valid_object() {
        let object = created(
            &network_policy(),
            example(test_support::examples::NETWORK_POLICY),
        );
        assert_eq!(object["spec"]["appliedTo"], json!(["web-vms"]));
    }

    #[test]
    fn each_mistake_names_its_field_with_the_files_reason() {
        let mut object = example(test_support::examples::NETWORK_POLICY);
        object["spec"]["priority"] = json!(1000);
        object["spec"]["rules"][0]["services"][0]["port"] = json!(70000);
        object["spec"]["rules"][1]["action"] = json!("Permit");
        let errors = validate(&object);
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.priority",
                "spec.rules[0].services[0].port",
                "spec.rules[1].action"
            ],
            "{errors:?}"
        );
        assert!(errors[2]
            .detail
            .contains("\"Permit\" is not an action (Allow, Drop or Reject)"));
        assert_eq!(errors[1].kind, FieldErrorKind::Invalid(json!(70000)));
    }

    #[test]
    fn a_status_write_does_not_bump_the_generation() {
        use sluice_apimachinery::meta::{prepare_status_update, prepare_update};
        let kind = network_policy();
        let mut stored = created(&kind, example(test_support::examples::NETWORK_POLICY));
        stored["metadata"]["resourceVersion"] = json!("5");
        let mut new = stored.clone();
        new["status"] = json!({"observedGeneration": 1, "desiredVMs": 1, "realizedVMs": 1,
                               "phase": "Realized"});
        let updated = prepare_status_update(&kind, &stored, new.clone()).unwrap();
        assert_eq!(updated["metadata"]["generation"], json!(1));
        assert_eq!(updated["status"]["phase"], json!("Realized"));
        // A write of the main resource keeps the stored status and the generation.
        let kept = prepare_update(&kind, &stored, new).unwrap();
        assert_eq!(kept["metadata"]["generation"], json!(1));
        assert!(kept.get("status").is_none());
    }

    #[test]
    fn unknown_fields_and_a_name_in_the_spec_are_refused() {
        let mut object = example(test_support::examples::NETWORK_POLICY);
        object["spec"]["name"] = json!("web");
        object["spec"]["tier"] = json!("high");
        let fields: Vec<String> = validate(&object).into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["spec.name", "spec.tier"]);
    }
}
