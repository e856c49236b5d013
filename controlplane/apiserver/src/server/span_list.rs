//! A VM agent's LIST of a policy resource, answered from the shared span view instead of the
//! store: the few objects of its span, already decoded, at the view's revision (issue 36: after
//! a control-plane restart every agent lists three resources at once, and decoding every
//! policy object for each list made that resync take minutes at 500 VMs).
//!
//! Pages follow kube's rules as the store-backed list does: a continue token holds the
//! revision and the next key, and a later page is read from the view as it was at that
//! revision (410 once the view no longer remembers it, and the client lists again).

use serde_json::Value;
use sluice_apimachinery::list::{ContinueToken, ListPage};
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::StatusError;

use super::objects::{Call, MAX_PAGE};
use super::span_watch::shown_to;
use super::ApiServer;
use crate::kinds::PolicyResource;

impl ApiServer {
    /// One page of the objects of `vm`'s span a list selects.
    pub(crate) async fn span_list(
        &self,
        call: &Call<'_>,
        options: &ListOptions,
        vm: &str,
    ) -> Result<(Vec<Value>, ListPage), StatusError> {
        let feed = self.span_feed();
        let (view, start) = match &options.continue_token {
            Some(token) => (
                feed.at(vm, token.revision).await?,
                Some(token.start.as_str()),
            ),
            None => (feed.fresh(vm).await?, None),
        };
        let limit = options
            .limit
            .map_or(MAX_PAGE, |limit| (limit as usize).min(MAX_PAGE));
        let prefix = super::keys::list_prefix(call.spec, call.request.namespace);
        let resource = PolicyResource::from_plural(&call.spec.plural);
        let mut selected = view
            .objects(resource, vm, &prefix, options)
            .filter(|(key, _)| start.is_none_or(|start| *key >= start))
            .peekable();
        let mut items = Vec::new();
        let mut continue_token = None;
        while let Some((key, object)) = selected.next() {
            items.push(shown_to(resource, object, vm).as_ref().clone());
            if items.len() == limit && selected.peek().is_some() {
                // kube's continue key: the next key at or after the last one plus NUL.
                let next = format!("{key}\0");
                continue_token = Some(ContinueToken::new(next, view.revision).encode());
                break;
            }
        }
        let page = ListPage {
            resource_version: view.revision,
            continue_token,
            remaining_item_count: None,
        };
        Ok((items, page))
    }
}
