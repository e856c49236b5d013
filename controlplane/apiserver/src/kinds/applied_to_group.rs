//! `policy.sluice.dev/v1alpha1 AppliedToGroup`: cluster-scoped; the VM interfaces policies are
//! enforced on (a policy file's `appliedToGroups[]` entry; the name is `metadata.name`). Each
//! member names its `vm`, which decides the agents the group and its policies are sent to (see
//! `span`).

use serde_json::Value;
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_policy_model::object::validate_applied_to_group;

use super::policy::{model_errors, policy_kind, Names};

pub fn applied_to_group() -> KindSpec {
    policy_kind(
        Names {
            kind: "AppliedToGroup",
            plural: "appliedtogroups",
            singular: "appliedtogroup",
            short: "atg",
        },
        vec![
            PrinterColumn::new(
                "VM",
                ".spec.members[0].vm",
                "string",
                "the VM of the first member",
            ),
            PrinterColumn::new(
                "Interface",
                ".spec.members[0].name",
                "string",
                "the first member interface",
            ),
        ],
        "members: VM interfaces (name, ofport, ips, mac, vm), as a policy file's applied-to group",
        validate,
    )
}

fn validate(object: &Value) -> Vec<FieldError> {
    model_errors(object, validate_applied_to_group)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kinds::policy::tests::{created, example};

    #[test]
    fn the_example_is_a_valid_object() {
        created(
            &applied_to_group(),
            example(test_support::examples::APPLIED_TO_GROUP),
        );
    }

    #[test]
    fn each_mistake_names_its_field() {
        let mut object = example(test_support::examples::APPLIED_TO_GROUP);
        object["spec"]["members"][0]["ofport"] = json!(0);
        object["spec"]["members"][1]
            .as_object_mut()
            .unwrap()
            .remove("vm");
        object["spec"]["members"][1]["mac"] = json!("zz");
        let errors = validate(&object);
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.members[0].ofport",
                "spec.members[1].mac",
                "spec.members[1].vm"
            ],
            "{errors:?}"
        );
        assert!(errors[0]
            .detail
            .contains("0 is not a valid OpenFlow port number"));
    }
}
