//! What the two `vm.sluice.dev/v1alpha1` kinds share: the group, the bounded shapes of
//! conditions and realized-policy maps, and their checks. Every field is written by an agent
//! on a VM the operator does not fully trust, so every size is bounded with a field error
//! naming the limit.

use serde_json::{json, Value};
use sluice_apimachinery::timestamp::parse_rfc3339;
use sluice_apimachinery::FieldError;

pub const GROUP: &str = sluice_vm_lifecycle::GROUP;
pub const VERSION: &str = sluice_vm_lifecycle::VERSION;

/// Most entries of a `networkPolicies` map (a VM in more policies is refused, not truncated).
pub const MAX_POLICIES: usize = 10_000;
/// Most conditions of an object.
pub const MAX_CONDITIONS: usize = 16;
/// Longest short string (names, versions, reasons).
pub const MAX_SHORT: usize = 256;
/// Longest message.
pub const MAX_MESSAGE: usize = 1024;

/// The condition statuses kube allows.
pub const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// The OpenAPI schema of a kube-style condition list.
pub fn conditions_schema() -> Value {
    json!({"type": "array", "items": {"type": "object", "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string"},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string"}}}})
}

/// The OpenAPI schema of a `networkPolicies` map: policy name -> realized generation.
pub fn policies_schema() -> Value {
    json!({"type": "object", "additionalProperties": {"type": "string"}})
}

/// A string field of at most `max` bytes, when present.
pub fn check_string(object: &Value, path: &str, max: usize, errors: &mut Vec<FieldError>) {
    match super::value_at(object, path) {
        Value::Null => {}
        Value::String(text) if text.len() <= max => {}
        Value::String(_) => errors.push(too_long(path, max)),
        other => errors.push(FieldError::invalid(path, other.clone(), "must be a string")),
    }
}

/// An RFC 3339 timestamp, when present.
pub fn check_time(object: &Value, path: &str, errors: &mut Vec<FieldError>) {
    match super::value_at(object, path) {
        Value::Null => {}
        Value::String(text) if text.len() <= 64 && parse_rfc3339(text).is_some() => {}
        other => errors.push(FieldError::invalid(
            path,
            other.clone(),
            "must be an RFC 3339 time such as 2026-01-02T03:04:05Z",
        )),
    }
}

/// A string from a closed set, when present.
pub fn check_one_of(object: &Value, path: &str, allowed: &[&str], errors: &mut Vec<FieldError>) {
    match super::value_at(object, path) {
        Value::Null => {}
        Value::String(text) if allowed.contains(&text.as_str()) => {}
        other => errors.push(FieldError::not_supported(path, other.clone(), allowed)),
    }
}

/// A map of policy name -> realized generation (a positive decimal), bounded.
pub fn check_policies(object: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let map = match super::value_at(object, path) {
        Value::Null => return,
        Value::Object(map) => map,
        other => {
            return errors.push(FieldError::invalid(
                path,
                other.clone(),
                "must map policy names to their realized generations",
            ))
        }
    };
    if map.len() > MAX_POLICIES {
        return errors.push(FieldError::invalid(
            path,
            json!(format!("{} entries", map.len())),
            format!("must have at most {MAX_POLICIES} entries"),
        ));
    }
    for (name, generation) in map {
        let at = format!("{path}[{name}]");
        if name.is_empty() || name.len() > MAX_SHORT {
            errors.push(FieldError::invalid(
                &at,
                json!(name),
                format!("a policy name has 1 to {MAX_SHORT} bytes"),
            ));
        } else if parse_generation(generation).is_none() {
            errors.push(FieldError::invalid(
                &at,
                generation.clone(),
                "must be the policy's metadata.generation as a decimal string, e.g. \"3\"",
            ));
        }
    }
}

/// A generation as the maps carry it: a decimal string of a positive integer.
pub fn parse_generation(value: &Value) -> Option<i64> {
    let text = value.as_str()?;
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>()
        .ok()
        .filter(|generation| *generation > 0)
}

/// A kube-style condition list, bounded.
pub fn check_conditions(object: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let list = match super::value_at(object, path) {
        Value::Null => return,
        Value::Array(list) => list,
        other => {
            return errors.push(FieldError::invalid(
                path,
                other.clone(),
                "must be a list of conditions",
            ))
        }
    };
    if list.len() > MAX_CONDITIONS {
        return errors.push(FieldError::invalid(
            path,
            json!(format!("{} conditions", list.len())),
            format!("must have at most {MAX_CONDITIONS} conditions"),
        ));
    }
    let mut seen = Vec::new();
    for index in 0..list.len() {
        let at = format!("{path}[{index}]");
        match super::value_at(object, &format!("{at}.type")) {
            Value::String(kind) if !kind.is_empty() && kind.len() <= MAX_SHORT => {
                if seen.contains(kind) {
                    errors.push(FieldError::duplicate(format!("{at}.type"), json!(kind)));
                }
                seen.push(kind.clone());
            }
            Value::Null => errors.push(FieldError::required(format!("{at}.type"), "")),
            other => errors.push(FieldError::invalid(
                format!("{at}.type"),
                other.clone(),
                format!("a condition type has 1 to {MAX_SHORT} bytes"),
            )),
        }
        match super::value_at(object, &format!("{at}.status")) {
            Value::Null => errors.push(FieldError::required(format!("{at}.status"), "")),
            _ => check_one_of(object, &format!("{at}.status"), &CONDITION_STATUSES, errors),
        }
        check_string(object, &format!("{at}.reason"), MAX_SHORT, errors);
        check_string(object, &format!("{at}.message"), MAX_MESSAGE, errors);
        check_time(object, &format!("{at}.lastTransitionTime"), errors);
    }
}

fn too_long(path: &str, max: usize) -> FieldError {
    FieldError::invalid(
        path,
        json!(format!("<{max}+ bytes>")),
        format!("must have at most {max} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_are_positive_decimals() {
        assert_eq!(parse_generation(&json!("3")), Some(3));
        for bad in [json!("0"), json!("-1"), json!("3a"), json!(""), json!(3)] {
            assert_eq!(parse_generation(&bad), None, "{bad}");
        }
        assert_eq!(parse_generation(&json!("9".repeat(20))), None);
    }

    #[test]
    fn conditions_are_bounded_and_typed() {
        let object = json!({"c": [
            {"type": "A", "status": "True"},
            {"type": "A", "status": "Maybe", "message": "m".repeat(2000)},
            {"status": "True", "lastTransitionTime": "yesterday"}]});
        let mut errors = Vec::new();
        check_conditions(&object, "c", &mut errors);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "c[1].type",
                "c[1].status",
                "c[1].message",
                "c[2].type",
                "c[2].lastTransitionTime"
            ]
        );
        let many = json!({"c": vec![json!({"type": "A", "status": "True"}); 17]});
        let mut errors = Vec::new();
        check_conditions(&many, "c", &mut errors);
        assert_eq!(errors.len(), 1);
    }

    #[test]
    fn policy_maps_are_bounded() {
        let mut map = serde_json::Map::new();
        for index in 0..=MAX_POLICIES {
            map.insert(format!("p{index}"), json!("1"));
        }
        let mut errors = Vec::new();
        check_policies(&json!({"p": map}), "p", &mut errors);
        assert_eq!(errors.len(), 1);
        let mut errors = Vec::new();
        check_policies(&json!({"p": {"web": "x", "": "1"}}), "p", &mut errors);
        assert_eq!(errors.len(), 2);
    }
}
