//! The query parameters of GET/LIST/WATCH (`metav1.ListOptions`), parsed once with 400s for
//! what kube-apiserver refuses.

use crate::list::ContinueToken;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::StatusError;

/// A parsed LIST or WATCH request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListOptions {
    /// `labelSelector`
    pub label_selector: LabelSelector,
    /// `fieldSelector`
    pub field_selector: FieldSelector,
    /// `limit` (0 or absent: no paging).
    pub limit: Option<u64>,
    /// `continue`, decoded.
    pub continue_token: Option<ContinueToken>,
    /// `resourceVersion`: `None` (absent or "": most recent), `Some(0)` ("0": any), or a revision.
    pub resource_version: Option<u64>,
    /// `watch=true|1`
    pub watch: bool,
    /// `allowWatchBookmarks=true|1`
    pub allow_watch_bookmarks: bool,
    /// `timeoutSeconds`: how long a watch may stay open.
    pub timeout_seconds: Option<u64>,
}

/// A `resourceVersion` as the store's revision; 400 when it is not a number.
pub fn parse_resource_version(text: &str) -> Result<u64, StatusError> {
    text.parse().map_err(|_| {
        StatusError::bad_request(format!(
            "invalid resource version {text:?}: must be a non-negative integer"
        ))
    })
}

fn parse_bool(name: &str, value: &str) -> Result<bool, StatusError> {
    match value {
        "" | "true" | "1" | "True" => Ok(true),
        "false" | "0" | "False" => Ok(false),
        other => Err(StatusError::bad_request(format!(
            "{name}: invalid boolean {other:?}"
        ))),
    }
}

fn parse_number(name: &str, value: &str) -> Result<u64, StatusError> {
    value.parse().map_err(|_| {
        StatusError::bad_request(format!(
            "{name}: invalid value {value:?}: must be a non-negative integer"
        ))
    })
}

impl ListOptions {
    /// Parses percent-decoded query pairs; unknown parameters (`fieldManager`, `pretty`,
    /// `includeObject`...) are left to their handlers.
    pub fn parse<'a>(
        query: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, StatusError> {
        let mut options = Self::default();
        let mut resource_version_given = false;
        for (name, value) in query {
            match name {
                "labelSelector" => options.label_selector = LabelSelector::parse(value)?,
                "fieldSelector" => options.field_selector = FieldSelector::parse(value)?,
                "limit" => options.limit = Some(parse_number(name, value)?).filter(|n| *n > 0),
                "continue" if !value.is_empty() => {
                    options.continue_token = Some(ContinueToken::decode(value)?)
                }
                "resourceVersion" if !value.is_empty() => {
                    options.resource_version = Some(parse_resource_version(value)?);
                    resource_version_given = true;
                }
                "watch" => options.watch = parse_bool(name, value)?,
                "allowWatchBookmarks" => options.allow_watch_bookmarks = parse_bool(name, value)?,
                "timeoutSeconds" => options.timeout_seconds = Some(parse_number(name, value)?),
                _ => {}
            }
        }
        // kube-apiserver: a continue token carries its own revision.
        if options.continue_token.is_some()
            && resource_version_given
            && options.resource_version != Some(0)
        {
            return Err(StatusError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        if options.watch && options.continue_token.is_some() {
            return Err(StatusError::bad_request(
                "continue is not supported for watch requests",
            ));
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_and_informer_queries() {
        let token = ContinueToken::new("/w/a", 7).encode();
        let list = ListOptions::parse([
            ("limit", "500"),
            ("continue", token.as_str()),
            ("labelSelector", "app=web"),
        ])
        .expect("list");
        assert_eq!(list.limit, Some(500));
        assert_eq!(list.continue_token.expect("token").revision, 7);
        assert_eq!(list.label_selector.requirements.len(), 1);
        let watch = ListOptions::parse([
            ("watch", "true"),
            ("resourceVersion", "42"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", "300"),
        ])
        .expect("watch");
        assert!(watch.watch && watch.allow_watch_bookmarks);
        assert_eq!(
            (watch.resource_version, watch.timeout_seconds),
            (Some(42), Some(300))
        );
        assert_eq!(
            ListOptions::parse([("watch", "1"), ("limit", "0")])
                .expect("w")
                .limit,
            None
        );
    }

    #[test]
    fn refuses_what_kube_refuses() {
        let token = ContinueToken::new("/w/a", 7).encode();
        for bad in [
            vec![("resourceVersion", "abc")],
            vec![("limit", "-1")],
            vec![("watch", "yes")],
            vec![("continue", "garbage")],
            vec![("continue", token.as_str()), ("resourceVersion", "5")],
            vec![("continue", token.as_str()), ("watch", "true")],
            vec![("fieldSelector", "spec.x=1")],
        ] {
            assert_eq!(
                ListOptions::parse(bad.clone()).expect_err("bad").code,
                400,
                "{bad:?}"
            );
        }
    }
}
