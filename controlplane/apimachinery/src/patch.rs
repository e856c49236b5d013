//! PATCH: JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on stored objects.
//!
//! Strategic merge patch needs Go struct tags the custom kinds do not have; kube-apiserver
//! refuses it for CRDs with 415 and the list of accepted types, and so do we. Server-side apply
//! (`application/apply-patch+yaml`) is its own write path: see [`crate::apply`].

use serde_json::Value;

use crate::kind::KindSpec;
use crate::meta::{prepare_status_update, prepare_update};
use crate::openapi::PATCH_CONTENT_TYPES;
use crate::status::{StatusError, StatusReason};

/// The patch formats the server applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    JsonPatch,
    /// `application/merge-patch+json`
    MergePatch,
}

impl PatchType {
    /// The patch type of a request's Content-Type (parameters such as `charset` ignored);
    /// 415 listing the accepted types otherwise (strategic merge and apply patches included).
    pub fn from_content_type(content_type: &str) -> Result<Self, StatusError> {
        let media_type = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media_type.as_str() {
            "application/json-patch+json" => Ok(Self::JsonPatch),
            "application/merge-patch+json" => Ok(Self::MergePatch),
            _ => Err(StatusError::unsupported_media_type(&PATCH_CONTENT_TYPES)),
        }
    }
}

/// Whether a PATCH's Content-Type is a server-side apply (`application/apply-patch+yaml`).
pub fn is_apply(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/apply-patch+yaml")
}

/// Applies a patch body to `target` and returns the patched document (not yet validated).
/// A body that does not parse is 400; a JSON patch that cannot apply (failed `test`, missing
/// path) is 422, as kube-apiserver answers.
pub fn apply_patch(
    target: &Value,
    patch_type: PatchType,
    body: &[u8],
) -> Result<Value, StatusError> {
    let mut patched = target.clone();
    match patch_type {
        PatchType::MergePatch => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| StatusError::bad_request(format!("invalid JSON merge patch: {e}")))?;
            json_patch::merge(&mut patched, &patch);
        }
        PatchType::JsonPatch => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| StatusError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut patched, &patch).map_err(|e| {
                StatusError::new(
                    StatusReason::Invalid,
                    format!("the JSON patch could not be applied: {e}"),
                )
            })?;
        }
    }
    Ok(patched)
}

/// PATCH of the main resource: patch the stored object, then the update rules (status kept
/// when it is a subresource, resourceVersion precondition when the patch sets one).
pub fn patch_object(
    spec: &KindSpec,
    old: &Value,
    content_type: &str,
    body: &[u8],
) -> Result<Value, StatusError> {
    let patch_type = PatchType::from_content_type(content_type)?;
    let patched = apply_patch(old, patch_type, body)?;
    prepare_update(spec, old, patched)
}

/// PATCH of the `status` subresource: only the patched status is kept.
pub fn patch_status(
    spec: &KindSpec,
    old: &Value,
    content_type: &str,
    body: &[u8],
) -> Result<Value, StatusError> {
    let patch_type = PatchType::from_content_type(content_type)?;
    let patched = apply_patch(old, patch_type, body)?;
    prepare_status_update(spec, old, patched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::kind::tests::widget;

    fn stored() -> Value {
        json!({"apiVersion": "tests.sluice.dev/v1", "kind": "Widget",
               "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                            "generation": 1, "creationTimestamp": "1970-01-01T00:00:00Z"},
               "spec": {"size": 1, "tags": ["x"]}})
    }

    #[test]
    fn merge_patch_updates_and_bumps_generation() {
        let body = br#"{"spec": {"size": 2, "tags": null}, "metadata": {"labels": {"a": "b"}}}"#;
        let patched =
            patch_object(&widget(), &stored(), "application/merge-patch+json", body).expect("ok");
        assert_eq!(patched["spec"], json!({"size": 2}));
        assert_eq!(patched["metadata"]["labels"]["a"], "b");
        assert_eq!(patched["metadata"]["generation"], 2);
    }

    #[test]
    fn json_patch_applies_and_tests() {
        let body = br#"[{"op": "add", "path": "/spec/tags/-", "value": "y"}]"#;
        let patched = patch_object(
            &widget(),
            &stored(),
            "application/json-patch+json; charset=utf-8",
            body,
        )
        .expect("ok");
        assert_eq!(patched["spec"]["tags"], json!(["x", "y"]));
        let failing = br#"[{"op": "test", "path": "/spec/size", "value": 9}]"#;
        let error = patch_object(&widget(), &stored(), "application/json-patch+json", failing)
            .expect_err("test op");
        assert_eq!(error.code, 422);
        let error = patch_object(&widget(), &stored(), "application/json-patch+json", b"{}")
            .expect_err("not a list");
        assert_eq!(error.code, 400);
    }

    #[test]
    fn stale_resource_version_in_patch_conflicts() {
        let body = br#"{"metadata": {"resourceVersion": "2"}, "spec": {"size": 5}}"#;
        let error = patch_object(&widget(), &stored(), "application/merge-patch+json", body)
            .expect_err("stale");
        assert_eq!(error.code, 409);
    }

    #[test]
    fn strategic_merge_is_refused_like_crds() {
        let error = patch_object(
            &widget(),
            &stored(),
            "application/strategic-merge-patch+json",
            b"{}",
        )
        .expect_err("415");
        assert_eq!(error.code, 415);
        assert_eq!(error.message, "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml");
        assert!(is_apply("application/apply-patch+yaml; charset=utf-8"));
        assert!(!is_apply("application/merge-patch+json"));
    }

    #[test]
    fn status_patch_touches_only_status() {
        let body = br#"{"status": {"ready": true}, "spec": {"size": 7}}"#;
        let patched =
            patch_status(&widget(), &stored(), "application/merge-patch+json", body).expect("ok");
        assert_eq!(patched["status"]["ready"], true);
        assert_eq!(patched["spec"]["size"], 1);
    }
}
