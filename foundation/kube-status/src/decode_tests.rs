use proptest::prelude::*;
use serde_json::json;

use super::*;

fn details() -> impl Strategy<Value = Option<StatusDetails>> {
    let cause =
        (".{0,12}", ".{0,12}", "[a-z.\\[\\]0-9]{0,12}").prop_map(|(reason, message, field)| {
            StatusCause {
                reason,
                message,
                field,
            }
        });
    let details = (
        ".{0,12}",
        ".{0,12}",
        ".{0,12}",
        prop::collection::vec(cause, 0..3),
        prop::option::of(any::<u32>()),
    )
        .prop_map(
            |(name, group, kind, causes, retry_after_seconds)| StatusDetails {
                name,
                group,
                kind,
                causes,
                retry_after_seconds,
            },
        );
    prop::option::of(details)
}

fn status() -> impl Strategy<Value = Status> {
    let reason = prop_oneof![
        prop::sample::select(StatusReason::ALL.to_vec()).prop_map(|r| Cow::Borrowed(r.as_str())),
        ".{0,16}".prop_map(Cow::Owned),
    ];
    (any::<bool>(), ".{0,40}", reason, details(), any::<u16>()).prop_map(
        |(success, message, reason, details, code)| Status {
            outcome: if success {
                Outcome::Success
            } else {
                Outcome::Failure
            },
            message,
            reason,
            details,
            code,
        },
    )
}

proptest! {
    #[test]
    fn every_status_round_trips_through_bytes_and_values(status in status()) {
        prop_assert_eq!(Status::decode(&status.to_vec()).unwrap(), status.clone());
        prop_assert_eq!(Status::from_value(&status.to_value()).unwrap(), status.clone());
        prop_assert_eq!(serde_json::to_vec(&status.to_value()).unwrap().len(), status.to_vec().len());
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        let _ = Status::decode(&bytes);
    }

    #[test]
    fn mutated_statuses_decode_or_fail_without_panicking(
        status in status(), at in any::<prop::sample::Index>(), byte in any::<u8>()
    ) {
        let mut bytes = status.to_vec();
        let at = at.index(bytes.len());
        bytes[at] = byte;
        let _ = Status::decode(&bytes);
    }
}

#[test]
fn missing_and_null_fields_are_go_zero_values() {
    // A watch ERROR event's object as the control plane's watch cache sends it: no apiVersion,
    // no status, no metadata.
    let gone = json!({"kind": "Status", "code": 410, "reason": "Expired",
                      "message": "too old resource version: 3 (10)", "details": null});
    let status = Status::from_value(&gone).unwrap();
    assert_eq!(status.known_reason(), Some(StatusReason::Expired));
    assert_eq!((status.code, status.outcome), (410, Outcome::Failure));
    assert_eq!(status.details, None);
    let bare = Status::from_value(&json!({})).unwrap();
    assert_eq!(bare, Status::failure_with_code(0, "", ""));
    let bare = Status::decode(br#"{"kind":"Status"}"#).unwrap();
    assert_eq!(bare, Status::failure_with_code(0, "", ""));
    let success = Status::decode(br#"{"kind":"Status","status":"Success","code":200}"#).unwrap();
    assert_eq!(success.outcome, Outcome::Success);
}

#[test]
fn malformed_statuses_name_what_is_wrong() {
    let cases: [(&[u8], &str); 15] = [
        (b"", "a Status must be JSON"),
        (b"{\"kind\":", "a Status must be JSON"),
        (b"[1]", "a Status must be a JSON object"),
        (b"\"Status\"", "a Status must be a JSON object"),
        (b"{}", "a Status document must say kind: Status"),
        (
            br#"{"kind":null,"code":404}"#,
            "a Status document must say kind: Status",
        ),
        (br#"{"kind":"Pod"}"#, "kind is \"Pod\", not Status"),
        (br#"{"kind":7}"#, "kind must be a string"),
        (
            br#"{"kind":"Status","code":"404"}"#,
            "code must be an integer",
        ),
        (
            br#"{"kind":"Status","code":404.5}"#,
            "code must be an integer",
        ),
        (
            br#"{"kind":"Status","code":-1}"#,
            "code is -1, out of range 0..=65535",
        ),
        (
            br#"{"kind":"Status","code":70000}"#,
            "code is 70000, out of range 0..=65535",
        ),
        (
            br#"{"kind":"Status","message":["a"]}"#,
            "message must be a string",
        ),
        (
            br#"{"kind":"Status","details":{"causes":[{"field":1}]}}"#,
            "details.causes[*].field must be a string",
        ),
        (
            br#"{"kind":"Status","details":{"retryAfterSeconds":4294967296}}"#,
            "details.retryAfterSeconds is 4294967296, out of range 0..=4294967295",
        ),
    ];
    for (bytes, expected) in cases {
        let error = Status::decode(bytes).expect_err(&String::from_utf8_lossy(bytes));
        assert!(
            error.to_string().starts_with(expected),
            "{}: {error}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert!(matches!(
        Status::from_value(&json!({"details": "x"})),
        Err(DecodeError::WrongType {
            field: "details",
            ..
        })
    ));
    assert!(matches!(
        Status::from_value(&json!({"details": {"causes": {}}})),
        Err(DecodeError::WrongType {
            field: "details.causes",
            ..
        })
    ));
}

#[test]
fn a_foreign_kind_is_quoted_at_most_64_characters() {
    let long = format!(r#"{{"kind":"{}"}}"#, "k".repeat(1000));
    match Status::decode(long.as_bytes()) {
        Err(DecodeError::NotAStatus { kind }) => assert_eq!(kind.len(), MAX_QUOTED),
        other => panic!("{other:?}"),
    }
}
