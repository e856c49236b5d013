//! The agent endpoint: agents authenticate, open `Connect` streams, send their Descriptor, and
//! each stream waits in the registry as an idle tunnel.

use std::cell::RefCell;
use std::collections::HashSet;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use sluice_proto::tunnel::v1::{connect_request, Descriptor};
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

use super::super::answer::{grpc_headers, Responder};
use super::super::disconnects::Disconnect;
use super::super::tunnel::{
    drop_parked, hold_idle, unpark_stale, OpenTunnel, ParkedSignal, TunnelStreams,
};
use super::super::{quota, NodeShared};
use super::{refused, serve_connection, settle};
use crate::error::{ErrorKind, TunnelError};
use crate::metrics::AgentRefusal;
use crate::protocol::CONNECT_PATH;
use crate::registry::AgentId;
use crate::wire::{ReadError, TunnelReader};

/// How long an agent has to send its Descriptor after opening a tunnel.
const DESCRIPTOR_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent connections (agent id, connection id) one TCP connection announced.
type Announced = Rc<RefCell<HashSet<(AgentId, i64)>>>;

/// The agent endpoint's handler factory.
#[derive(Debug, Clone)]
pub struct AgentEndpoint {
    pub node: Arc<NodeShared>,
}

impl HandlerFactory for AgentEndpoint {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(self.clone())
    }
}

impl ConnectionHandler for AgentEndpoint {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            let announced: Announced = Rc::default();
            let parked = ParkedSignal::default();
            let node = self.node.clone();
            let handler_conn = conn.clone();
            let handler_announced = announced.clone();
            let handler_parked = parked.clone();
            let serving = serve_connection(
                stream,
                self.node.agent_tls.clone(),
                &self.node.settings,
                &conn,
                move |request, respond| {
                    accept_tunnel(
                        node.clone(),
                        handler_conn.clone(),
                        handler_announced.clone(),
                        handler_parked.clone(),
                        request,
                        respond,
                    )
                },
            );
            let closing = conn.closing();
            let agents = || announced_agents(&announced);
            let clean = monoio::select! {
                clean = serving => clean,
                () = unpark_stale(&self.node, &closing, &parked, agents) => true,
            };
            drop_parked(&self.node, &closing, &announced_agents(&announced));
            for key in announced.borrow().iter() {
                let why = disconnect_reason(&self.node, &conn, key.0, clean);
                self.node.forget_connection(*key, why);
            }
        })
    }
}

/// Why an agent's connection ended, for the node's log: the node's own reasons (revocation,
/// drain) first, since the connection then ends whichever way the agent took it.
fn disconnect_reason(
    node: &NodeShared,
    conn: &ConnectionContext,
    agent: AgentId,
    clean: bool,
) -> Disconnect {
    if !node.tokens.load().knows(agent) {
        Disconnect::Revoked
    } else if conn.is_draining() {
        Disconnect::Drained
    } else if clean {
        Disconnect::Closed
    } else {
        Disconnect::Reset
    }
}

/// The agents a connection announced, each once.
fn announced_agents(announced: &Announced) -> Vec<AgentId> {
    let mut agents: Vec<AgentId> = announced.borrow().iter().map(|(agent, _)| *agent).collect();
    agents.sort_unstable();
    agents.dedup();
    agents
}

/// One `Connect` stream: authenticate the agent, read its Descriptor, accept the stream, and
/// hold it idle.
async fn accept_tunnel(
    node: Arc<NodeShared>,
    conn: ConnectionContext,
    announced: Announced,
    parked: ParkedSignal,
    request: Request<RecvStream>,
    respond: SendResponse<Bytes>,
) {
    let mut responder = Responder::new(respond);
    // Boxed: opening (the Descriptor read under a timer) is over once the tunnel is parked,
    // and inline it would stay in this task for the tunnel's whole idle life, one per tunnel.
    let opened = Box::pin(open_tunnel(
        &node,
        &conn,
        &announced,
        parked,
        request,
        &mut responder,
    ))
    .await;
    match opened {
        // Closed when the agent's connection closes (drain, or retired by age: the agent then
        // opens its tunnels on a new connection).
        Ok(streams) => hold_idle(node, streams).await,
        Err(error) => {
            settle(Err(error), &mut responder, &node, conn.worker());
        }
    }
}

async fn open_tunnel(
    node: &NodeShared,
    conn: &ConnectionContext,
    announced: &Announced,
    parked: ParkedSignal,
    request: Request<RecvStream>,
    responder: &mut Responder,
) -> Result<TunnelStreams, TunnelError> {
    if request.uri().path() != CONNECT_PATH {
        return Err(TunnelError::new(
            ErrorKind::Unimplemented,
            format!("the agent endpoint serves only {CONNECT_PATH}"),
        ));
    }
    let (agent, token) = node
        .tokens
        .load()
        .authenticate_digest(request.headers())
        .map_err(|error| {
            tracing::info!(peer = %conn.peer, reason = error.reason(), "agent refused");
            refused(&node.metrics, "agent", &error)
        })?;
    // Every check that the agent's own choices pass comes before the tunnel is accepted and
    // before anything is recorded (here or, through the locator, in Redis).
    let (connection_id, version) = quota::announcement(request.headers(), &node.agent_limits)
        .map_err(|error| node.agent_refused(agent, AgentRefusal::Descriptor, error))?;
    let version = version.to_string();
    let slot = node
        .tunnel_counts
        .acquire(agent, node.agent_limits.tunnels)
        .map_err(|error| node.agent_refused(agent, AgentRefusal::Tunnels, error))?;
    let mut recv = request.into_body();
    // The Descriptor is read under its own size limit (what the per-agent limits allow), not
    // the call message limit: a Connect cannot pin megabytes of the node-wide buffer budget.
    let mut opening = TunnelReader::with_budget(
        quota::descriptor_bytes(&node.agent_limits),
        node.buffer_budget.clone(),
    );
    let descriptor = read_descriptor(&mut opening, &mut recv)
        .await
        .and_then(|descriptor| {
            quota::check_descriptor(&descriptor, &node.agent_limits)?;
            // An agent waits for a call after its Descriptor; bytes after it are not a tunnel.
            match opening.buffered() {
                0 => Ok(descriptor),
                _ => Err(TunnelError::new(
                    ErrorKind::ClientProtocol,
                    "data after the Descriptor before any call",
                )),
            }
        })
        .map_err(|error| match error.kind() {
            ErrorKind::ClientProtocol | ErrorKind::BadRequest => {
                node.agent_refused(agent, AgentRefusal::Descriptor, error)
            }
            _ => error,
        })?;
    drop(opening);
    let reader = TunnelReader::with_budget(node.max_message_bytes, node.buffer_budget.clone());
    let key = (agent, connection_id);
    if !announced.borrow().contains(&key) {
        node.admit_connection(agent, connection_id, &version)
            .map_err(|error| node.agent_refused(agent, AgentRefusal::Connections, error))?;
        announced.borrow_mut().insert(key);
        tracing::info!(agent, connection_id, %version, peer = %conn.peer, "agent connected");
    }
    let send = responder
        .respond
        .send_response(grpc_headers(), false)
        .map_err(|_| TunnelError::client_gone())?;
    Ok(TunnelStreams {
        agent,
        token,
        connection_id,
        recv,
        send,
        reader,
        reusable: descriptor.reusable,
        closing: conn.closing(),
        parked,
        _open: OpenTunnel::new(&node.metrics.tunnels_connected, conn.worker()),
        _slot: slot,
    })
}

/// The agent's Descriptor, which must open every tunnel. An agent that went away is
/// `ClientGone` (the agent is this endpoint's client).
async fn read_descriptor(
    reader: &mut TunnelReader,
    recv: &mut RecvStream,
) -> Result<Descriptor, TunnelError> {
    let first = monoio::time::timeout(DESCRIPTOR_TIMEOUT, reader.read_request(recv)).await;
    match first {
        Ok(Ok(Some(connect_request::Msg::Descriptor(descriptor)))) => Ok(descriptor),
        Ok(Ok(Some(_))) => Err(TunnelError::new(
            ErrorKind::ClientProtocol,
            "a tunnel must start with a Descriptor",
        )),
        Ok(Ok(None)) | Ok(Err(ReadError::Gone(_) | ReadError::Refused(_))) => {
            Err(TunnelError::client_gone())
        }
        Ok(Err(ReadError::Protocol(error))) => Err(TunnelError::new(
            ErrorKind::ClientProtocol,
            error.to_string(),
        )),
        Err(_) => Err(TunnelError::new(
            ErrorKind::DeadlineExceeded,
            "no Descriptor within 10s",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node holds one such task per idle tunnel (ten thousand in the idle benchmark). Opening
    /// is boxed out of it: inline it made each task 2,432 bytes.
    #[test]
    fn an_idle_tunnel_task_stays_small() {
        let size = crate::future_size::of_six(accept_tunnel);
        assert!(size <= 1536, "an idle tunnel's task is {size} bytes");
    }
}
