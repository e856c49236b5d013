//! The gateway's access log line: what a request noted on its way (who it ran as, which
//! apiserver it went to) and the line built from it, only for a request that is logged.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Response};
use sluice_access_log::{bounded, HttpRecord, Record, MAX_PATH_BYTES, MAX_TEXT_BYTES};
use sluice_gateway::identity::UserInfo;

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

/// What a line says of the exchange itself (the request as the client sent it, the answer).
pub struct Exchange<'a> {
    pub method: &'a http::Method,
    /// The path with its query, as sent.
    pub target: &'a str,
    pub request_id: Option<&'a HeaderValue>,
    pub request_bytes: Option<u64>,
    pub status: u16,
    pub response_bytes: Option<u64>,
}

impl<'a> Exchange<'a> {
    /// A proxied request and its response head.
    pub fn of<B>(parts: &'a Parts, response: &Response<B>) -> Self {
        Self {
            method: &parts.method,
            target: parts.uri.path_and_query().map_or("", |path| path.as_str()),
            request_id: request_id(&parts.headers),
            request_bytes: content_length(&parts.headers),
            status: response.status().as_u16(),
            response_bytes: content_length(response.headers()),
        }
    }
}

/// Builds and hands over the line of a request the access log wants (see
/// `sluice_access_log::wanted`); kept out of line so the request's path stays small.
#[cold]
#[inline(never)]
pub fn log(
    // The client's address and cluster (not `handler::ClientConnection`: this module sits
    // below the handler).
    (peer, cluster): (std::net::IpAddr, &str),
    generation: &Generation,
    exchange: &Exchange<'_>,
    (note, started): (&AccessNote, Instant),
) {
    let upstream = note.upstream.get().and_then(|(cluster, server)| {
        let cluster = generation.snapshot.clusters().get(cluster)?;
        Some(cluster.servers.get(server)?.endpoint.to_string())
    });
    sluice_access_log::submit(Record::Http(HttpRecord {
        client: Some(peer),
        cluster: bounded(cluster.as_bytes(), MAX_TEXT_BYTES),
        principal: note
            .user
            .borrow()
            .as_ref()
            .map(|user| bounded(user.name.as_bytes(), MAX_TEXT_BYTES)),
        method: bounded(exchange.method.as_str().as_bytes(), MAX_TEXT_BYTES),
        path: bounded(exchange.target.as_bytes(), MAX_PATH_BYTES),
        upstream,
        status: exchange.status,
        request_bytes: exchange.request_bytes,
        response_bytes: exchange.response_bytes,
        duration: started.elapsed(),
        request_id: exchange
            .request_id
            .map(|id| bounded(id.as_bytes(), MAX_TEXT_BYTES)),
    }));
}

/// The client's `X-Request-Id`.
pub fn request_id(headers: &HeaderMap) -> Option<&HeaderValue> {
    headers.get("x-request-id")
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
