//! Reads of stored objects (GET and LIST) and the dispatch of a resource request to its verb.

use std::time::SystemTime;

use bytes::Bytes;
use http::request::Parts;
use hyper::body::Incoming;
use serde_json::Value;
use sluice_apimachinery::list::{list_document, ContinueToken, ListPage};
use sluice_apimachinery::meta::set_resource_version;
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::table::{self, IncludeObject, ResponseFormat, TableOptions};
use sluice_apimachinery::{KindSpec, StatusError};
use sluice_store::{KeyValue, StoreError};

use super::keys::{list_prefix, object_key};
use super::query::Query;
use super::reply::Reply;
use super::visibility::Visibility;
use super::ApiServer;
use crate::auth::Verb;
use crate::request::ResourceRequest;

/// Most objects one LIST page returns, whatever `limit` asks (kube has no cap; a cap keeps one
/// request's memory bounded).
pub const MAX_PAGE: usize = 5000;

/// A resource request after authorization.
pub struct Call<'a> {
    pub spec: &'a KindSpec,
    pub request: ResourceRequest<'a>,
    pub query: &'a Query,
    pub parts: &'a Parts,
    pub visibility: Visibility,
    /// The caller's user name, for refusals.
    pub user: String,
    /// The caller, whose write budget a write spends.
    pub identity: crate::auth::Identity,
}

impl Call<'_> {
    pub fn name(&self) -> &str {
        self.request.name.unwrap_or("")
    }

    pub fn key(&self) -> String {
        object_key(self.spec, self.request.namespace, self.name())
    }

    pub fn header(&self, name: http::header::HeaderName) -> Option<&str> {
        self.parts.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The response format the `Accept` header asks for, with `includeObject` for Tables.
    pub fn format(&self) -> Result<(ResponseFormat, TableOptions), StatusError> {
        let format = table::negotiate(self.header(http::header::ACCEPT))?;
        let options = TableOptions {
            version: match format {
                ResponseFormat::Table(version) => version,
                ResponseFormat::Object => table::TableVersion::V1,
            },
            include_object: IncludeObject::parse(self.query.get("includeObject"))?,
            now: SystemTime::now(),
        };
        Ok((format, options))
    }
}

impl ApiServer {
    /// Checks the request's scope and subresource, then runs its verb.
    pub(crate) async fn resource(
        &self,
        call: Call<'_>,
        body: Incoming,
    ) -> Result<Reply, StatusError> {
        check_scope(&call)?;
        check_field_labels(&call)?;
        let status = match call.request.subresource {
            None => false,
            Some("status") if call.spec.status_subresource => true,
            Some(_) => return Err(not_found_path()),
        };
        match call.request.verb {
            Verb::Get => self.get(&call).await,
            Verb::List => self.list(&call).await,
            Verb::Watch => self.watch(&call).await,
            Verb::Create if !status => self.create(&call, body).await,
            Verb::Update => self.update(&call, body, status).await,
            Verb::Patch => self.patch(&call, body, status).await,
            Verb::Delete if !status => self.delete(&call).await,
            Verb::DeleteCollection => self.delete_collection(&call).await,
            Verb::Create | Verb::Delete => Err(StatusError::method_not_allowed(
                call.spec,
                call.request.verb.as_str(),
            )),
        }
    }

    async fn get(&self, call: &Call<'_>) -> Result<Reply, StatusError> {
        let (format, table_options) = call.format()?;
        let object = self.read(call.spec, &call.key(), call.name()).await?;
        if !call.visibility.allows(call.spec, &object) {
            return Err(call_forbidden(call));
        }
        let object = call.visibility.present(call.spec, object);
        Ok(Reply::ok(match format {
            ResponseFormat::Object => object,
            ResponseFormat::Table(_) => table::table_for_object(call.spec, &object, &table_options),
        }))
    }

    /// The stored object at `key`, with its resourceVersion; 404 when there is none.
    pub(crate) async fn read(
        &self,
        spec: &KindSpec,
        key: &str,
        name: &str,
    ) -> Result<Value, StatusError> {
        let stored = self
            .store
            .get(key)
            .await
            .map_err(|error| store_status(spec, name, error))?
            .ok_or_else(|| StatusError::not_found(spec, name))?;
        decode(&stored)
    }

    async fn list(&self, call: &Call<'_>) -> Result<Reply, StatusError> {
        let options = ListOptions::parse(call.query.pairs())?;
        let (format, table_options) = call.format()?;
        let (items, page) = self.list_items(call, &options).await?;
        let list = list_document(call.spec, items, &page);
        Ok(Reply::ok(match format {
            ResponseFormat::Object => list,
            ResponseFormat::Table(_) => table::table_for_list(call.spec, &list, &table_options),
        }))
    }

    /// One page of the objects a list selects, read at one revision (the continue token's).
    pub(crate) async fn list_items(
        &self,
        call: &Call<'_>,
        options: &ListOptions,
    ) -> Result<(Vec<Value>, ListPage), StatusError> {
        if let Visibility::Span { vm, .. } = &call.visibility {
            return self.span_list(call, options, vm).await;
        }
        let prefix = match &call.visibility {
            // A VM agent listing its own VM reads that key, not every VM (issue 36: 5,000
            // agents listing at once after a restart); names extending it are filtered below.
            Visibility::Own { name } => object_key(call.spec, None, name),
            _ => list_prefix(call.spec, call.request.namespace),
        };
        let limit = options
            .limit
            .map_or(MAX_PAGE, |limit| (limit as usize).min(MAX_PAGE));
        let (mut cursor, mut revision) = match &options.continue_token {
            Some(token) => {
                let start = token.start.strip_suffix('\0').unwrap_or(&token.start);
                (Some(start.to_string()), Some(token.revision))
            }
            None => (None, None),
        };
        let mut items = Vec::new();
        let mut continue_token = None;
        'pages: loop {
            let page = self
                .store
                .list(&prefix, cursor.as_deref(), limit, revision)
                .await
                .map_err(|error| list_status(call.spec, options, error))?;
            revision = Some(page.revision);
            let mut rows = page.items.into_iter().peekable();
            while let Some(row) = rows.next() {
                cursor = Some(row.key.clone());
                let object = decode(&row)?;
                if selected(call, options, &object) {
                    items.push(call.visibility.present(call.spec, object));
                }
                if items.len() == limit && (rows.peek().is_some() || page.more) {
                    // kube's continue key: the next key at or after the last one plus NUL.
                    continue_token =
                        Some(ContinueToken::new(format!("{}\0", row.key), page.revision));
                    break 'pages;
                }
            }
            if !page.more {
                break;
            }
        }
        let page = ListPage {
            resource_version: revision.unwrap_or(0),
            continue_token: continue_token.map(|token| token.encode()),
            remaining_item_count: None,
        };
        Ok((items, page))
    }
}

/// Whether a listed object is one the request selects and the caller may see.
fn selected(call: &Call<'_>, options: &ListOptions, object: &Value) -> bool {
    matches_selection(call.spec, &call.visibility, options, object)
}

/// Whether an object passes a list's or watch's selectors and the caller's visibility.
pub(crate) fn matches_selection(
    spec: &KindSpec,
    visibility: &Visibility,
    options: &ListOptions,
    object: &Value,
) -> bool {
    options.label_selector.matches(object)
        && options.field_selector.matches(object)
        && visibility.allows(spec, object)
}

/// A stored row as an object, its resourceVersion the row's mod_revision.
pub(crate) fn decode(row: &KeyValue) -> Result<Value, StatusError> {
    let mut object: Value = serde_json::from_slice(&row.value).map_err(|error| {
        StatusError::internal(format!(
            "the stored object at {} does not parse: {error}",
            row.key
        ))
    })?;
    set_resource_version(&mut object, row.mod_revision);
    Ok(object)
}

pub(crate) fn encode(object: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(object).unwrap_or_default())
}

/// A namespaced kind needs a namespace on named requests and creates; a cluster-scoped kind
/// has none.
fn check_scope(call: &Call<'_>) -> Result<(), StatusError> {
    let namespaced_path = call.request.namespace.is_some();
    let needs_namespace = call.request.name.is_some() || call.request.verb == Verb::Create;
    match (call.spec.namespaced, namespaced_path) {
        (false, true) => Err(not_found_path()),
        (true, false) if needs_namespace => Err(not_found_path()),
        _ => Ok(()),
    }
}

/// Event fields select only events (kube answers other kinds "field label not supported").
fn check_field_labels(call: &Call<'_>) -> Result<(), StatusError> {
    let Some(text) = call.query.get("fieldSelector") else {
        return Ok(());
    };
    let selector = sluice_apimachinery::selector::FieldSelector::parse(text)?;
    let events = call.spec.is_core() && call.spec.kind == "Event";
    selector.unsupported(events).map_or(Ok(()), Err)
}

fn not_found_path() -> StatusError {
    StatusError::new(
        sluice_apimachinery::StatusReason::NotFound,
        "the server could not find the requested resource",
    )
}

pub(crate) fn call_forbidden(call: &Call<'_>) -> StatusError {
    StatusError::forbidden(
        call.spec,
        call.request.namespace,
        call.name(),
        &call.user,
        call.request.verb.as_str(),
    )
}

/// The `Status` for a store failure about one object.
pub(crate) fn store_status(spec: &KindSpec, name: &str, error: StoreError) -> StatusError {
    use sluice_apimachinery::StatusReason as Reason;
    match error {
        StoreError::NotFound { .. } => StatusError::not_found(spec, name),
        StoreError::AlreadyExists { .. } => StatusError::already_exists(spec, name),
        StoreError::Conflict { .. } => StatusError::conflict(spec, name),
        StoreError::Compacted { compact_revision } => StatusError::gone(0, compact_revision),
        StoreError::FutureRevision { requested, current } => StatusError::new(
            Reason::ServiceUnavailable,
            format!("Too large resource version: {requested}, current: {current}"),
        ),
        StoreError::ValueTooLarge { size, max } => {
            sluice_apimachinery::limits::object_size_error(spec, name, size, max).unwrap_or_else(
                || StatusError::new(Reason::RequestEntityTooLarge, "the object is too large"),
            )
        }
        StoreError::QuotaExceeded { full } => StatusError::new(
            Reason::StorageQuotaExceeded,
            format!(
                "{} {name:?} was not written: {full}",
                spec.qualified_resource()
            ),
        ),
        StoreError::InvalidKey { reason } => {
            StatusError::bad_request(format!("invalid name: {reason}"))
        }
        StoreError::Unavailable { source } => StatusError::new(
            Reason::ServiceUnavailable,
            format!("the store is not reachable: {source}"),
        ),
        other => StatusError::internal(other),
    }
}

fn list_status(spec: &KindSpec, options: &ListOptions, error: StoreError) -> StatusError {
    match error {
        StoreError::Compacted { .. } if options.continue_token.is_some() => {
            StatusError::continue_expired()
        }
        other => store_status(spec, "", other),
    }
}

/// The object without its resourceVersion: what decides whether a write or an event changes
/// anything.
pub(crate) fn without_version(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    copy
}
