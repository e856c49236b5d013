//! The gateway's access log line: what a request noted on its way (who it ran as, which
//! apiserver it went to) and the line built from it, only for a request that is logged.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{HeaderMap, Response};
use sluice_access_log::{bounded, HttpRecord, Record, MAX_PATH_BYTES, MAX_TEXT_BYTES};
use sluice_gateway::identity::UserInfo;

use crate::handler::ClientConnection;
use crate::state::Generation;

/// What the phases of one request learnt that its line names; filled whether or not the
/// request is logged (a reference count and two words: no allocation).
#[derive(Default)]
pub struct AccessNote {
    /// Who the request runs as: set once authentication (then impersonation) passed, so a
    /// refused client's own text never becomes the principal.
    user: RefCell<Option<Rc<UserInfo>>>,
    /// (cluster, server) indexes in the request's generation, once an upstream was picked.
    upstream: Cell<Option<(usize, usize)>>,
}

impl AccessNote {
    pub fn authenticated(&self, user: &Rc<UserInfo>) {
        *self.user.borrow_mut() = Some(user.clone());
    }

    pub fn upstream(&self, cluster: usize, server: usize) {
        self.upstream.set(Some((cluster, server)));
    }
}

/// Builds and hands over the line of a request the access log wants (see
/// `sluice_access_log::wanted`); kept out of line so the request's path stays small.
#[cold]
#[inline(never)]
pub fn log<B>(
    client: &ClientConnection,
    generation: &Generation,
    parts: &Parts,
    response: &Response<B>,
    (note, started): (&AccessNote, Instant),
) {
    let upstream = note.upstream.get().and_then(|(cluster, server)| {
        let cluster = generation.snapshot.clusters().get(cluster)?;
        Some(cluster.servers.get(server)?.endpoint.to_string())
    });
    let path = parts.uri.path_and_query().map_or("", |path| path.as_str());
    sluice_access_log::submit(Record::Http(HttpRecord {
        client: Some(client.peer),
        cluster: bounded(client.cluster.as_bytes(), MAX_TEXT_BYTES),
        principal: note
            .user
            .borrow()
            .as_ref()
            .map(|user| bounded(user.name.as_bytes(), MAX_TEXT_BYTES)),
        method: bounded(parts.method.as_str().as_bytes(), MAX_TEXT_BYTES),
        path: bounded(path.as_bytes(), MAX_PATH_BYTES),
        upstream,
        status: response.status().as_u16(),
        request_bytes: content_length(&parts.headers),
        response_bytes: content_length(response.headers()),
        duration: started.elapsed(),
        request_id: parts
            .headers
            .get("x-request-id")
            .map(|id| bounded(id.as_bytes(), MAX_TEXT_BYTES)),
    }));
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
