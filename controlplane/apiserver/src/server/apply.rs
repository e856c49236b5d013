//! Server-side apply (`PATCH` with `application/apply-patch+yaml`) and the `Update` ownership
//! every other write records; the merge, ownership and conflict rules are
//! `sluice_apimachinery::apply`'s. A child of `writes`: it stores through the same
//! conditional writes, budgets and dry-run.

use std::time::SystemTime;

use hyper::body::Incoming;
use serde_json::{json, Value};
use sluice_apimachinery::apply::{self as ssa, Scope};
use sluice_apimachinery::meta;
use sluice_apimachinery::schema::FieldValidation;
use sluice_apimachinery::{StatusError, StatusReason};

use super::super::objects::{call_forbidden, Call};
use super::super::reply::Reply;
use super::super::ApiServer;
use super::{is_conflict, new_uid, CONFLICT_RETRIES};

fn scope(status: bool) -> Scope {
    if status {
        Scope::Status
    } else {
        Scope::Main
    }
}

/// Records in `new` the `Update` ownership of a create, PUT or non-apply PATCH by the call's
/// manager (`?fieldManager=` or its User-Agent); 422 for a manager kube would refuse.
pub(super) fn record(
    call: &Call<'_>,
    old: Option<&Value>,
    new: &mut Value,
    status: bool,
) -> Result<(), StatusError> {
    let manager = ssa::field_manager(
        call.query.get("fieldManager"),
        call.header(http::header::USER_AGENT),
        false,
    )?;
    ssa::record_update(
        call.spec,
        old,
        new,
        &manager,
        scope(status),
        SystemTime::now(),
    );
    Ok(())
}

impl ApiServer {
    /// Applies the body's configuration as `?fieldManager=` (required) to the stored object,
    /// or creates it from the configuration when there is none (not for `/status`). Retried
    /// like a PATCH when another writer got in between; a field conflict is answered at once.
    pub(super) async fn apply(
        &self,
        call: &Call<'_>,
        body: Incoming,
        status: bool,
    ) -> Result<Reply, StatusError> {
        let manager = ssa::field_manager(
            call.query.get("fieldManager"),
            call.header(http::header::USER_AGENT),
            true,
        )?;
        let force = ssa::force(call.query.get("force"), true)?;
        let validation = FieldValidation::parse(call.query.get("fieldValidation"))?;
        let body = self.read_body(call, body).await?;
        let config = ssa::parse_config(&body)?;
        let named = meta::object_name(&config);
        if named != call.name() {
            return Err(StatusError::bad_request(format!(
                "the name of the object ({named}) does not match the name on the URL ({})",
                call.name()
            )));
        }
        let warnings = validation.check(call.spec, &config)?;
        let mut attempt = 0;
        loop {
            let outcome = match self.read(call.spec, &call.key(), call.name()).await {
                Ok(old) => {
                    if !call.visibility.allows(call.spec, &old) {
                        return Err(call_forbidden(call));
                    }
                    let now = SystemTime::now();
                    let merged = ssa::apply(
                        call.spec,
                        &old,
                        config.clone(),
                        &manager,
                        force,
                        scope(status),
                        now,
                    )?;
                    let updated = if status {
                        meta::prepare_status_update(call.spec, &old, merged)?
                    } else {
                        meta::prepare_update(call.spec, &old, merged)?
                    };
                    self.store_update(call, &old, updated).await
                }
                Err(error) if error.reason == StatusReason::NotFound && !status => {
                    self.create_applied(call, &config, &manager).await
                }
                Err(error) => return Err(error),
            };
            match outcome {
                Err(error)
                    if (is_conflict(&error) || error.reason == StatusReason::AlreadyExists)
                        && attempt < CONFLICT_RETRIES =>
                {
                    attempt += 1
                }
                outcome => return outcome.map(|reply| reply.with_warnings(warnings)),
            }
        }
    }

    /// An apply to an object that does not exist creates it, owned by the applier.
    async fn create_applied(
        &self,
        call: &Call<'_>,
        config: &Value,
        manager: &str,
    ) -> Result<Reply, StatusError> {
        let bare = json!({"apiVersion": call.spec.api_version(), "kind": call.spec.kind,
                          "metadata": {"name": call.name()}});
        let now = SystemTime::now();
        let merged = ssa::apply(
            call.spec,
            &bare,
            config.clone(),
            manager,
            false,
            Scope::Main,
            now,
        )?;
        if !call.visibility.allows(call.spec, &merged) {
            return Err(call_forbidden(call));
        }
        let uid = new_uid()?;
        let object = meta::prepare_create(call.spec, merged, call.request.namespace, now, &uid)?;
        self.insert(call, object).await
    }
}
