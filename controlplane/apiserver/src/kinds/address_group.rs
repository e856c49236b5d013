//! `policy.sluice.dev/v1alpha1 AddressGroup`: cluster-scoped; a named set of peer addresses
//! (a policy file's `addressGroups[]` entry; the name is `metadata.name`). Policies' rules name
//! it in `peers.addressGroups`; it is sent to the VMs of those policies (see `span`).

use serde_json::Value;
use sluice_apimachinery::{FieldError, KindSpec, PrinterColumn};
use sluice_policy_model::object::validate_address_group;

use super::policy::{model_errors, policy_kind, Names};

pub fn address_group() -> KindSpec {
    policy_kind(
        Names {
            kind: "AddressGroup",
            plural: "addressgroups",
            singular: "addressgroup",
            short: "adg",
        },
        vec![PrinterColumn::new(
            "Members",
            ".spec.members",
            "string",
            "addresses and CIDRs",
        )],
        "members: addresses and CIDRs, as a policy file's address group",
        validate,
    )
}

fn validate(object: &Value) -> Vec<FieldError> {
    model_errors(object, validate_address_group)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kinds::policy::tests::{created, example};

    #[test]
    fn the_example_is_a_valid_object() {
        created(
            &address_group(),
            example(test_support::examples::ADDRESS_GROUP),
        );
    }

    #[test]
    fn each_mistake_names_its_field_with_the_files_reason() {
        let mut object = example(test_support::examples::ADDRESS_GROUP);
        object["spec"]["members"] = json!(["10.0.0.2", "10.0.0.1/8", "nope"]);
        let errors = validate(&object);
        let fields: Vec<&str> = errors.iter().map(|error| error.field.as_str()).collect();
        assert_eq!(fields, ["spec.members[1]", "spec.members[2]"]);
        assert!(errors[0]
            .detail
            .contains("10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"));
    }
}
