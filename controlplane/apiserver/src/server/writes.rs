//! Writes: CREATE, UPDATE, PATCH, DELETE. Each reads what is stored, lets the pure machinery
//! decide the new object, and writes it conditionally on the revision it read, so two writers
//! never lose each other's changes.

use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::Value;
use sluice_apimachinery::limits::{object_size_error, MAX_OBJECT_BYTES};
use sluice_apimachinery::meta::{self, begin_delete, DeleteOutcome};
use sluice_apimachinery::options::ListOptions;
use sluice_apimachinery::patch;
use sluice_apimachinery::schema::{prune_unknown_fields, FieldValidation};
use sluice_apimachinery::{StatusError, StatusReason};
use sluice_store::StoreError;

use super::objects::{
    call_forbidden, decode, encode, matches_selection, store_status, without_version, Call,
};
use super::reply::Reply;
use super::write_budget::reserve_refusal;
use super::ApiServer;

#[path = "apply.rs"]
mod apply;

/// How often a PATCH or DELETE re-reads and retries after another writer got in between
/// (kube-apiserver retries such conflicts itself; the client only sees one when its own
/// precondition fails).
const CONFLICT_RETRIES: usize = 5;

impl ApiServer {
    pub(crate) async fn create(
        &self,
        call: &Call<'_>,
        body: Incoming,
    ) -> Result<Reply, StatusError> {
        let body = self.read_body(call, body).await?;
        let object = parse_object(&body)?;
        if !call.visibility.allows(call.spec, &object) {
            return Err(call_forbidden(call));
        }
        let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
        let warnings = validation.check(call.spec, &object)?;
        let uid = new_uid()?;
        let mut object = meta::prepare_create(
            call.spec,
            object,
            call.request.namespace,
            SystemTime::now(),
            &uid,
        )?;
        apply::record(call, None, &mut object, false)?;
        self.insert(call, object)
            .await
            .map(|reply| reply.with_warnings(warnings))
    }

    /// Stores an object prepared for create (201), or under `?dryRun` only answers with it.
    async fn insert(&self, call: &Call<'_>, mut object: Value) -> Result<Reply, StatusError> {
        prune_unknown_fields(call.spec, &mut object);
        let name = meta::object_name(&object).to_string();
        let key = super::keys::object_key(call.spec, call.request.namespace, &name);
        let encoded = self.sized(call, &name, &object)?;
        if dry_run(call)? {
            return Ok(Reply::json(StatusCode::CREATED, object));
        }
        self.spend(call, encoded.len())?;
        let stored = self
            .store
            .create(&key, encoded)
            .await
            .map_err(|error| self.write_failed(call, &name, error))?;
        if call.spec.kind == super::tokens::TOKEN_KIND {
            self.add_created_token(&stored);
        }
        Ok(Reply::json(StatusCode::CREATED, decode(&stored)?))
    }

    /// PUT: the object's resourceVersion is the precondition (409 when stale).
    pub(crate) async fn update(
        &self,
        call: &Call<'_>,
        body: Incoming,
        status: bool,
    ) -> Result<Reply, StatusError> {
        let body = self.read_body(call, body).await?;
        let new = parse_object(&body)?;
        let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
        let warnings = validation.check(call.spec, &new)?;
        let old = self.read(call.spec, &call.key(), call.name()).await?;
        if !call.visibility.allows(call.spec, &old) {
            return Err(call_forbidden(call));
        }
        let mut updated = if status {
            meta::prepare_status_update(call.spec, &old, new)?
        } else {
            meta::prepare_update(call.spec, &old, new)?
        };
        apply::record(call, Some(&old), &mut updated, status)?;
        self.store_update(call, &old, updated)
            .await
            .map(|reply| reply.with_warnings(warnings))
    }

    /// PATCH (merge or JSON patch): applied to the object as stored now; retried on a
    /// conflict with another writer unless the patch itself names a resourceVersion. An apply
    /// patch is server-side apply (`apply.rs`).
    pub(crate) async fn patch(
        &self,
        call: &Call<'_>,
        body: Incoming,
        status: bool,
    ) -> Result<Reply, StatusError> {
        let content_type = call
            .header(http::header::CONTENT_TYPE)
            .unwrap_or("")
            .to_string();
        if patch::is_apply(&content_type) {
            return self.apply(call, body, status).await;
        }
        sluice_apimachinery::apply::force(call.query.get("force"), false)?;
        let body = self.read_body(call, body).await?;
        let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
        let mut attempt = 0;
        loop {
            let old = self.read(call.spec, &call.key(), call.name()).await?;
            if !call.visibility.allows(call.spec, &old) {
                return Err(call_forbidden(call));
            }
            let mut updated = if status {
                patch::patch_status(call.spec, &old, &content_type, &body)?
            } else {
                patch::patch_object(call.spec, &old, &content_type, &body)?
            };
            apply::record(call, Some(&old), &mut updated, status)?;
            let warnings = validation.check(call.spec, &updated)?;
            match self.store_update(call, &old, updated).await {
                Err(error) if is_conflict(&error) && attempt < CONFLICT_RETRIES => attempt += 1,
                outcome => return outcome.map(|reply| reply.with_warnings(warnings)),
            }
        }
    }

    /// Writes `updated` over `old` if nothing changed in between. An object whose last
    /// finalizer was removed while it was being deleted is deleted instead.
    async fn store_update(
        &self,
        call: &Call<'_>,
        old: &Value,
        mut updated: Value,
    ) -> Result<Reply, StatusError> {
        prune_unknown_fields(call.spec, &mut updated);
        self.check_status_entries(call, old, &updated)?;
        let revision = revision_of(old);
        let encoded = self.sized(call, call.name(), &updated)?;
        if dry_run(call)? {
            return Ok(Reply::ok(updated));
        }
        if meta::finalized(&updated) {
            self.spend(call, 0)?;
            self.store
                .delete(&call.key(), Some(revision))
                .await
                .map_err(|error| self.write_failed(call, call.name(), error))?;
            return Ok(Reply::ok(updated));
        }
        // Unchanged objects are not written: `kubectl apply` twice must not bump the version.
        if without_version(old) == without_version(&updated) {
            return Ok(Reply::ok(old.clone()));
        }
        self.spend(call, encoded.len())?;
        let stored = self
            .store
            .update(&call.key(), encoded, Some(revision))
            .await
            .map_err(|error| self.write_failed(call, call.name(), error))?;
        Ok(Reply::ok(decode(&stored)?))
    }

    /// Replaces the status of the stored object `old` (as read, with its resourceVersion) by
    /// `status`, as a PUT of its `/status` would: same metadata rules and validation, written
    /// only if nothing changed since `old` (409 `Conflict` otherwise: read again and retry).
    /// The control plane's own controllers (the VMManager) write through here.
    pub async fn write_status(
        &self,
        spec: &sluice_apimachinery::KindSpec,
        old: &Value,
        status: Value,
    ) -> Result<Value, StatusError> {
        let mut new = old.clone();
        if let Some(map) = new.as_object_mut() {
            map.insert("status".into(), status);
        }
        let mut updated = meta::prepare_status_update(spec, old, new)?;
        prune_unknown_fields(spec, &mut updated);
        if without_version(old) == without_version(&updated) {
            return Ok(old.clone());
        }
        let name = meta::object_name(old).to_string();
        let key = super::keys::object_key(spec, None, &name);
        let stored = self
            .store
            .update(&key, encode(&updated), Some(revision_of(old)))
            .await
            .map_err(|error| store_status(spec, &name, error))?;
        decode(&stored)
    }

    pub(crate) async fn delete(&self, call: &Call<'_>) -> Result<Reply, StatusError> {
        let mut attempt = 0;
        loop {
            let old = self.read(call.spec, &call.key(), call.name()).await?;
            if !call.visibility.allows(call.spec, &old) {
                return Err(call_forbidden(call));
            }
            match self.delete_one(call, &call.key(), old).await {
                Err(error) if is_conflict(&error) && attempt < CONFLICT_RETRIES => attempt += 1,
                outcome => return outcome,
            }
        }
    }

    async fn delete_one(
        &self,
        call: &Call<'_>,
        key: &str,
        old: Value,
    ) -> Result<Reply, StatusError> {
        let name = meta::object_name(&old).to_string();
        let dry = dry_run(call)?;
        match begin_delete(&old, SystemTime::now()) {
            DeleteOutcome::DeleteNow => {
                if !dry {
                    self.spend(call, 0)?;
                    self.store
                        .delete(key, Some(revision_of(&old)))
                        .await
                        .map_err(|error| self.write_failed(call, &name, error))?;
                }
                Ok(Reply::ok(old))
            }
            DeleteOutcome::AlreadyDeleting => Ok(Reply::ok(old)),
            DeleteOutcome::MarkDeleting(marked) if dry => Ok(Reply::ok(marked)),
            DeleteOutcome::MarkDeleting(marked) => {
                let encoded = encode(&marked);
                self.spend(call, encoded.len())?;
                let stored = self
                    .store
                    .update(key, encoded, Some(revision_of(&old)))
                    .await
                    .map_err(|error| self.write_failed(call, &name, error))?;
                Ok(Reply::json(StatusCode::ACCEPTED, decode(&stored)?))
            }
        }
    }

    /// DELETE on a collection: every selected object the caller may see, one by one. Each is
    /// read again before its delete and retried on a conflict, as a single DELETE is: an object
    /// written between the list and its delete (a controller's status, say) is still deleted,
    /// unless it no longer matches the selectors.
    pub(crate) async fn delete_collection(&self, call: &Call<'_>) -> Result<Reply, StatusError> {
        let options = ListOptions::parse(call.query.pairs())?;
        let (items, page) = self.list_items(call, &options).await?;
        let mut deleted = Vec::with_capacity(items.len());
        for listed in items {
            let name = meta::object_name(&listed).to_string();
            let namespace = Some(meta::object_namespace(&listed)).filter(|ns| !ns.is_empty());
            let key = super::keys::object_key(call.spec, namespace, &name);
            if let Some(body) = self.delete_selected(call, &options, &key, &name).await? {
                deleted.push(body);
            }
        }
        Ok(Reply::ok(sluice_apimachinery::list::list_document(
            call.spec, deleted, &page,
        )))
    }

    /// Deletes the stored object at `key` if it still matches the collection's selection; `None`
    /// when it is gone or no longer selected.
    async fn delete_selected(
        &self,
        call: &Call<'_>,
        options: &ListOptions,
        key: &str,
        name: &str,
    ) -> Result<Option<Value>, StatusError> {
        let mut attempt = 0;
        loop {
            let current = match self.read(call.spec, key, name).await {
                Ok(current) => current,
                Err(error) if error.reason == StatusReason::NotFound => return Ok(None),
                Err(error) => return Err(error),
            };
            if !matches_selection(call.spec, &call.visibility, options, &current) {
                return Ok(None);
            }
            match self.delete_one(call, key, current).await {
                Ok(Reply::Json { body, .. }) => return Ok(Some(body)),
                Ok(_) => return Ok(None),
                Err(error) if error.reason == StatusReason::NotFound => return Ok(None),
                Err(error) if is_conflict(&error) && attempt < CONFLICT_RETRIES => attempt += 1,
                Err(error) => return Err(error),
            }
        }
    }

    /// The object as it would be stored, or 413 when it is larger than an object may be.
    fn sized(&self, call: &Call<'_>, name: &str, object: &Value) -> Result<Bytes, StatusError> {
        let encoded = encode(object);
        match object_size_error(call.spec, name, encoded.len(), MAX_OBJECT_BYTES) {
            None => Ok(encoded),
            Some(error) => {
                self.write_metrics
                    .refused(call.identity.role, "object_size");
                Err(error)
            }
        }
    }

    /// Spends one write of `bytes` from the caller's write budget, or answers 429 (507 for a
    /// vm-agent's write into the store's reserve).
    fn spend(&self, call: &Call<'_>, bytes: usize) -> Result<(), StatusError> {
        let role = call.identity.role;
        if bytes > 0 {
            if let Some(refused) = reserve_refusal(role, self.store.usage(), bytes) {
                self.write_metrics.refused(role, "storage_reserve");
                return Err(refused);
            }
        }
        let now = Instant::now();
        self.writes
            .admit(&call.identity, bytes, now)
            .map_err(|over| {
                self.write_metrics
                    .refused(call.identity.role, over.scope.as_str());
                over.status(&call.user)
            })
    }

    /// The `Status` of a failed store write; a full store is counted.
    fn write_failed(&self, call: &Call<'_>, name: &str, error: StoreError) -> StatusError {
        if matches!(error, StoreError::QuotaExceeded { .. }) {
            self.write_metrics
                .refused(call.identity.role, "storage_quota");
        }
        store_status(call.spec, name, error)
    }

    /// 403 when a node or gateway changed another's entry of a status map (or anything else
    /// in the status), naming the field; see `kinds::foreign_status_change`.
    fn check_status_entries(
        &self,
        call: &Call<'_>,
        old: &Value,
        new: &Value,
    ) -> Result<(), StatusError> {
        let identity = &call.identity;
        let Some(field) = crate::kinds::foreign_status_change(identity, call.spec, old, new) else {
            return Ok(());
        };
        let mut error = call_forbidden(call);
        error.message = format!(
            "{}: a {} may change only its own entry ({:?}) of the status; this write changed \
             {field} outside it",
            error.message, identity.role, identity.subject
        );
        Err(error)
    }

    async fn read_body(&self, call: &Call<'_>, body: Incoming) -> Result<Bytes, StatusError> {
        let max = self.limits.max_body_bytes;
        match Limited::new(body, max).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(StatusError::new(
                StatusReason::RequestEntityTooLarge,
                format!("the request body is larger than {max} bytes"),
            )),
            Err(error) => Err(StatusError::bad_request(format!(
                "reading the body of the {} request failed: {error}",
                call.request.verb
            ))),
        }
    }
}

fn parse_object(body: &[u8]) -> Result<Value, StatusError> {
    let object: Value = serde_json::from_slice(body).map_err(|error| {
        StatusError::bad_request(format!("the request body is not a JSON object: {error}"))
    })?;
    if !object.is_object() {
        return Err(StatusError::bad_request(
            "the request body is not a JSON object",
        ));
    }
    Ok(object)
}

/// `?dryRun=All` validates and answers without writing (`kubectl --dry-run=server`).
fn dry_run(call: &Call<'_>) -> Result<bool, StatusError> {
    match call.query.get("dryRun") {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(StatusError::bad_request(format!(
            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
        ))),
    }
}

fn revision_of(object: &Value) -> u64 {
    meta::object_resource_version(object).parse().unwrap_or(0)
}

fn is_conflict(error: &StatusError) -> bool {
    error.reason == StatusReason::Conflict
}

/// A random (version 4) UUID, as kube gives every object.
fn new_uid() -> Result<String, StatusError> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes)
        .map_err(|error| StatusError::internal(format!("no random bytes for a uid: {error}")))?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}
