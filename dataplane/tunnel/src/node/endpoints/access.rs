//! The tunnel's access log line for one call: built only for a call the access log wants (see
//! `sluice_access_log::wanted`), kept out of line so a call's future stays small.

use std::time::Instant;

use sluice_access_log::{bounded, GrpcRecord, Record, Role, MAX_PATH_BYTES};
use sluice_grpc::Code;
use sluice_runtime::ConnectionContext;

use crate::metrics::CallRoute;
use crate::registry::AgentId;

/// What a finished call's line says, gathered by its endpoint.
pub(super) struct CallLine<'a> {
    pub endpoint: &'static str,
    pub method: &'a str,
    pub authenticated: bool,
    /// The agent asked for, once the caller was authenticated.
    pub agent: Option<AgentId>,
    pub route: CallRoute,
    pub code: Code,
    pub started: Instant,
}

/// Logs `line` when the tunnel's access log wants it (a failed call counts as an error).
pub(super) fn log(conn: &ConnectionContext, line: CallLine<'_>) {
    if sluice_access_log::wanted(Role::Tunnel, line.code != Code::Ok) {
        submit(conn, &line);
    }
}

#[cold]
#[inline(never)]
fn submit(conn: &ConnectionContext, line: &CallLine<'_>) {
    sluice_access_log::submit(Record::Grpc(GrpcRecord {
        client: Some(conn.peer.ip()),
        endpoint: line.endpoint,
        authenticated: line.authenticated,
        grpc_method: bounded(line.method.as_bytes(), MAX_PATH_BYTES),
        agent_id: line.agent,
        route: line.route.label(),
        grpc_code: line.code.name(),
        grpc_status: line.code.as_u32(),
        duration: line.started.elapsed(),
    }));
}
