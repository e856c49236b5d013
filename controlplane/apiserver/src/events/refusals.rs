//! Which refused writes become Warning events: the ones an operator must see to act on,
//! i.e. an object refused as invalid (what the data plane would refuse to load), too large, over
//! a write budget or over the store's quota. Not conflicts, 404s or 403s: those answer the
//! caller and say nothing about the system.

use sluice_apimachinery::{KindSpec, StatusError};

use super::book::{EventType, Involved, Occurrence};
use crate::auth::Verb;

/// The component refusal events name as their source.
pub const COMPONENT: &str = "sluice-apiserver";

/// The Warning event of a write refused with `error`, or `None` when it is not one to record.
/// `name` comes from the path, else from the error's details (a refused create).
pub fn refusal(
    spec: &KindSpec,
    verb: Verb,
    namespace: Option<&str>,
    name: Option<&str>,
    user: &str,
    error: &StatusError,
) -> Option<Occurrence> {
    if !matches!(
        verb,
        Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
    ) {
        return None;
    }
    let reason = match error.code {
        413 => "ObjectTooLarge",
        422 => "Invalid",
        429 => "WriteBudgetExceeded",
        507 => "StorageQuotaExceeded",
        _ => return None,
    };
    let name = name
        .filter(|name| !name.is_empty())
        .or_else(|| error.details.as_ref().map(|details| details.name.as_str()))
        .unwrap_or("");
    let involved = Involved {
        api_version: spec.api_version(),
        kind: spec.kind.clone(),
        name: name.to_string(),
        namespace: namespace.map(str::to_string),
        uid: String::new(),
    };
    let message = format!("{verb} by {user:?} refused: {}", error.message);
    Some(Occurrence::new(
        involved,
        EventType::Warning,
        reason,
        &message,
        COMPONENT,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_apimachinery::StatusReason;

    #[test]
    fn only_writes_refused_for_validity_size_budget_or_quota_are_recorded() {
        let spec = crate::kinds::virtual_machine();
        let budget = StatusError::too_many_requests("too many writes", 1);
        let occurrence = refusal(
            &spec,
            Verb::Patch,
            None,
            Some("vm1"),
            "sluice:admin:ops",
            &budget,
        )
        .expect("recorded");
        assert_eq!(occurrence.reason, "WriteBudgetExceeded");
        assert_eq!(occurrence.event_type, EventType::Warning);
        assert_eq!(
            occurrence.message,
            "patch by \"sluice:admin:ops\" refused: too many writes"
        );
        assert_eq!(
            (
                occurrence.involved.kind.as_str(),
                occurrence.involved.name.as_str()
            ),
            ("VirtualMachine", "vm1")
        );
        assert!(refusal(&spec, Verb::Get, None, Some("vm1"), "u", &budget).is_none());
        let conflict = StatusError::conflict(&spec, "vm1");
        assert!(refusal(&spec, Verb::Update, None, Some("vm1"), "u", &conflict).is_none());
        let full = StatusError::new(StatusReason::StorageQuotaExceeded, "full");
        assert_eq!(
            refusal(&spec, Verb::Create, None, None, "u", &full).map(|o| o.reason),
            Some("StorageQuotaExceeded".into())
        );
    }

    #[test]
    fn a_refused_create_names_the_object_from_the_error() {
        let spec = crate::kinds::virtual_machine();
        let invalid = StatusError::invalid(
            &spec,
            "vm9",
            &[sluice_apimachinery::FieldError::required(
                "spec.management",
                "",
            )],
        );
        let occurrence = refusal(&spec, Verb::Create, None, None, "u", &invalid).expect("422");
        assert_eq!(
            (
                occurrence.reason.as_str(),
                occurrence.involved.name.as_str()
            ),
            ("Invalid", "vm9")
        );
        assert!(
            occurrence.message.contains("spec.management"),
            "{occurrence:?}"
        );
    }
}
