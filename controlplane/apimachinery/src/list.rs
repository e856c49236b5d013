//! List documents, continue tokens and watch events.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::kind::KindSpec;
use crate::status::StatusError;

/// The `metadata` of a list page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    /// The store revision the list was read at.
    pub resource_version: u64,
    /// The token for the next page, when there is one.
    pub continue_token: Option<String>,
    /// How many items are left after this page, when the store knows.
    pub remaining_item_count: Option<u64>,
}

/// `<Kind>List` with `metadata.resourceVersion`, `continue` and `remainingItemCount`.
pub fn list_document(spec: &KindSpec, items: Vec<Value>, page: &ListPage) -> Value {
    let mut metadata = Map::new();
    metadata.insert(
        "resourceVersion".into(),
        json!(page.resource_version.to_string()),
    );
    if let Some(token) = &page.continue_token {
        metadata.insert("continue".into(), json!(token));
    }
    if let Some(remaining) = page.remaining_item_count {
        metadata.insert("remainingItemCount".into(), json!(remaining));
    }
    json!({
        "apiVersion": spec.api_version(),
        "items": items,
        "kind": spec.list_kind(),
        "metadata": metadata,
    })
}

/// Where the next page starts: the key after the last item returned and the revision the
/// first page was read at (every page reads at that revision, as kube does with etcd).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// Token format version (`meta.k8s.io/v1`, as kube writes it).
    #[serde(rename = "v")]
    pub version: String,
    /// The revision the list is read at.
    #[serde(rename = "rv")]
    pub revision: u64,
    /// The first store key of the next page.
    pub start: String,
}

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

impl ContinueToken {
    /// A token for a page starting at `start`, read at `revision`.
    pub fn new(start: impl Into<String>, revision: u64) -> Self {
        Self {
            version: TOKEN_VERSION.into(),
            revision,
            start: start.into(),
        }
    }

    /// The opaque form sent to clients: URL-safe base64 of the JSON.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a client's token; 400 when it is not one of ours. (A token whose revision was
    /// compacted is the store's to refuse, with [`StatusError::continue_expired`].)
    pub fn decode(token: &str) -> Result<Self, StatusError> {
        let invalid =
            |why: &str| StatusError::bad_request(format!("continue key is not valid: {why}"));
        let bytes = URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| invalid("not base64"))?;
        let parsed: Self =
            serde_json::from_slice(&bytes).map_err(|_| invalid("not a continue token"))?;
        if parsed.version != TOKEN_VERSION {
            return Err(invalid(&format!(
                "incorrect encoded version {:?}",
                parsed.version
            )));
        }
        if parsed.revision == 0 || parsed.start.is_empty() {
            return Err(invalid("incorrect encoded start resourceVersion"));
        }
        Ok(parsed)
    }
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventType {
    /// The object was created (or existed when the watch started from "now").
    Added,
    /// The object changed.
    Modified,
    /// The object was deleted; the object is its last state.
    Deleted,
    /// Progress marker: only the revision matters.
    Bookmark,
    /// The watch ended with a `Status` (410 Expired when the revision was compacted).
    Error,
}

impl WatchEventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
            Self::Bookmark => "BOOKMARK",
            Self::Error => "ERROR",
        }
    }
}

/// `{"type": ..., "object": ...}`, one line of a watch stream.
pub fn watch_event(event_type: WatchEventType, object: Value) -> Value {
    json!({"type": event_type.as_str(), "object": object})
}

/// A BOOKMARK event: the object carries only apiVersion, kind and metadata.resourceVersion
/// (client-go's reflector reads nothing else from it).
pub fn bookmark_event(spec: &KindSpec, revision: u64) -> Value {
    let object = json!({
        "kind": spec.kind,
        "apiVersion": spec.api_version(),
        "metadata": {"resourceVersion": revision.to_string()},
    });
    watch_event(WatchEventType::Bookmark, object)
}

/// The ERROR event that ends a watch with a `Status` (e.g. [`StatusError::gone`]).
pub fn error_event(error: &StatusError) -> Value {
    watch_event(WatchEventType::Error, error.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::tests::widget;
    use proptest::prelude::*;

    #[test]
    fn list_has_kube_shape() {
        let page = ListPage {
            resource_version: 7,
            continue_token: Some("abc".into()),
            remaining_item_count: Some(3),
        };
        let list = list_document(&widget(), vec![json!({"a": 1})], &page);
        assert_eq!(list["kind"], "WidgetList");
        assert_eq!(
            list["metadata"],
            json!({"resourceVersion": "7", "continue": "abc", "remainingItemCount": 3})
        );
        let bare = list_document(
            &widget(),
            vec![],
            &ListPage {
                resource_version: 1,
                ..ListPage::default()
            },
        );
        assert_eq!(bare["metadata"], json!({"resourceVersion": "1"}));
        assert_eq!(bare["items"], json!([]));
    }

    #[test]
    fn bad_tokens_are_bad_requests() {
        for bad in ["", "!!!", "e30", "bm90IGpzb24"] {
            assert_eq!(ContinueToken::decode(bad).expect_err(bad).code, 400);
        }
        let other_version = URL_SAFE_NO_PAD.encode(br#"{"v":"x","rv":1,"start":"a"}"#);
        assert_eq!(
            ContinueToken::decode(&other_version)
                .expect_err("version")
                .code,
            400
        );
    }

    #[test]
    fn events_have_kube_shape() {
        let bookmark = bookmark_event(&widget(), 42);
        assert_eq!(
            bookmark,
            json!({"type": "BOOKMARK", "object": {
            "kind": "Widget", "apiVersion": "tests.sluice.dev/v1",
            "metadata": {"resourceVersion": "42"}}})
        );
        let error = error_event(&StatusError::gone(3, 10));
        assert_eq!(error["object"]["code"], 410);
        assert_eq!(error["object"]["reason"], "Expired");
        assert_eq!(
            error["object"]["message"],
            "too old resource version: 3 (10)"
        );
    }

    proptest! {
        #[test]
        fn tokens_round_trip(start in ".{1,40}", revision in 1u64..) {
            let token = ContinueToken::new(start, revision);
            prop_assert_eq!(ContinueToken::decode(&token.encode()).expect("own token"), token);
        }

        #[test]
        fn decode_never_panics(text in ".{0,80}") {
            let _ = ContinueToken::decode(&text);
        }
    }
}
