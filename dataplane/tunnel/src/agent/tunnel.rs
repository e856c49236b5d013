//! One tunnel of the pool: open a `Connect` stream, send the Descriptor, then serve calls one at
//! a time until the tunnel idles out, the node ends it, or something breaks.

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{RecvStream, SendStream};
use http::Request;
use sluice_grpc::status::decode_message;
use sluice_grpc::transport::send_data;
use sluice_grpc::Code;
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, Descriptor, RequestInfo,
};
use sluice_runtime::StopSignal;

use super::forward::forward;
use super::metrics::AgentMetrics;
use super::pool::{tunnels_to_open, Pool};
use super::AgentShared;
use crate::error::{ErrorKind, TunnelError};
use crate::protocol::{AGENT_VERSION_HEADER, CONNECTION_ID_HEADER, CONNECT_PATH};
use crate::wire::{frame, ReadError, TunnelReader};
use sluice_config::PoolConfig;

/// How a tunnel ended.
#[derive(Debug)]
pub(super) enum TunnelEnd {
    /// The node refused the tunnel (bad token...): no point retrying at once.
    Refused(TunnelError),
    /// The connection or stream failed.
    Broken(TunnelError),
    /// Idle timeout, or the node closed it: normal.
    Closed,
    /// The node closed it with UNAVAILABLE because its connection is going away (the node
    /// drains, or retires the connection by age): the pool moves to a new connection.
    Moved,
}

/// What an idle tunnel does with what came from the node.
#[derive(Debug)]
pub(super) enum IdleNext {
    /// A call: forward it.
    Call(RequestInfo),
    /// Idle too long, or stopping: reset the stream (the pool keeps its minimum).
    Expire,
    /// The node ended the tunnel (a node that does not reuse tunnels, or draining): end ours.
    End,
    /// Anything else breaks the tunnel.
    Break(TunnelError),
}

/// Classifies what an idle tunnel received; `None`: the idle timeout or a stop came first.
pub(super) fn classify_idle(
    next: Option<Result<Option<connect_response::Msg>, ReadError>>,
) -> IdleNext {
    match next {
        None => IdleNext::Expire,
        Some(Ok(Some(connect_response::Msg::RequestInfo(info)))) => IdleNext::Call(info),
        Some(Ok(None)) => IdleNext::End,
        Some(Ok(Some(_))) => IdleNext::Break(TunnelError::new(
            ErrorKind::NodeProtocol,
            "the node sent a message before RequestInfo",
        )),
        Some(Err(ReadError::Protocol(error))) => {
            IdleNext::Break(TunnelError::new(ErrorKind::NodeProtocol, error.to_string()))
        }
        Some(Err(ReadError::Gone(why) | ReadError::Refused(why))) => {
            IdleNext::Break(TunnelError::new(ErrorKind::NodeGone, why))
        }
    }
}

/// Runs one tunnel and keeps the pool's counts.
pub(super) async fn tunnel(
    agent: Rc<AgentShared>,
    pool: Rc<Pool>,
    send_request: SendRequest<Bytes>,
    connection_id: i64,
    stop: Arc<StopSignal>,
) {
    let metrics = agent.task.metrics.clone();
    metrics.tunnels_open.inc(0);
    let end = run_tunnel(&agent, &pool, send_request, connection_id, &stop).await;
    metrics.tunnels_open.dec(0);
    pool.open.set(pool.open.get().saturating_sub(1));
    match end {
        TunnelEnd::Refused(why) => {
            *pool.refused.borrow_mut() = Some(why);
        }
        TunnelEnd::Broken(why) => tracing::debug!(%why, "tunnel ended"),
        TunnelEnd::Closed => {}
        TunnelEnd::Moved => pool.moving.set(true),
    }
    pool.changed.notify(usize::MAX);
}

/// Marks a tunnel idle for as long as it lives. The pool (`run_pool`) is woken only while it is
/// short of idle tunnels and may open more (`tunnels_to_open`): otherwise a call taken or
/// finished changes nothing it would act on, and used to cost it two wake-ups per call, each
/// with a new listener.
struct IdleMark<'a> {
    pool: &'a Pool,
    metrics: &'a AgentMetrics,
    config: &'a PoolConfig,
}

impl<'a> IdleMark<'a> {
    fn new(pool: &'a Pool, metrics: &'a AgentMetrics, config: &'a PoolConfig) -> Self {
        pool.idle.set(pool.idle.get() + 1);
        metrics.tunnels_idle.inc(0);
        let mark = Self {
            pool,
            metrics,
            config,
        };
        mark.wake_pool_if_short();
        mark
    }

    fn wake_pool_if_short(&self) {
        if tunnels_to_open(self.pool.idle.get(), self.pool.open.get(), self.config) > 0 {
            self.pool.changed.notify(usize::MAX);
        }
    }
}

impl Drop for IdleMark<'_> {
    fn drop(&mut self) {
        self.pool.idle.set(self.pool.idle.get().saturating_sub(1));
        self.metrics.tunnels_idle.dec(0);
        self.wake_pool_if_short();
    }
}

fn broken(error: impl ToString) -> TunnelEnd {
    TunnelEnd::Broken(TunnelError::new(ErrorKind::NodeGone, error.to_string()))
}

async fn run_tunnel(
    agent: &AgentShared,
    pool: &Pool,
    send_request: SendRequest<Bytes>,
    connection_id: i64,
    stop: &StopSignal,
) -> TunnelEnd {
    let config = &agent.task.config;
    let (mut recv, mut send) = match open(agent, send_request, connection_id).await {
        Ok(streams) => streams,
        Err(end) => return end,
    };
    let mut reader = TunnelReader::new(config.max_message_bytes);
    // When the tunnel's last call was answered (see the withdrawal below).
    let mut answered_at: Option<std::time::Instant> = None;
    // One timer and one stop listener for the tunnel's life, not one of each per call: the
    // timer is re-armed only when it fires early (a call came since it was set).
    let mut idle_timer = Box::pin(monoio::time::sleep(config.pool.idle_timeout));
    let stopping = stop.wait();
    let mut stopping = std::pin::pin!(stopping);
    // One call at a time; after a clean one the node puts this tunnel back in its registry and
    // the next RequestInfo comes down the same stream.
    loop {
        let next = {
            let _idle = IdleMark::new(pool, &agent.task.metrics, &config.pool);
            let idle_until = answered_at.map(|at| at + config.pool.idle_timeout);
            let read = reader.read_response(&mut recv);
            let mut read = std::pin::pin!(read);
            loop {
                monoio::select! {
                    message = &mut read => break Some(message),
                    _ = idle_timer.as_mut() => match idle_until {
                        Some(until) if until > std::time::Instant::now() => idle_timer
                            .as_mut()
                            .reset(monoio::time::Instant::from_std(until)),
                        _ => break None,
                    },
                    _ = &mut stopping => break None,
                }
            }
        };
        let info = match classify_idle(next) {
            IdleNext::Call(info) => info,
            IdleNext::Expire => {
                // REFUSED_STREAM, not CANCEL: the node may have sent a call down this tunnel at
                // the same moment, and this reason tells it the agent read none of it, so the
                // node routes the call again (another tunnel or replica) instead of failing it.
                // This is what lets an agent stop (SIGTERM) or shrink its pool under load
                // without failing a call.
                //
                // A reset drops what of the stream HTTP/2 has not written yet, and the answer to
                // the tunnel's last call may still be queued when the stop comes right after
                // it: the node would get REFUSED_STREAM instead, and fail the call (or, if it
                // had seen nothing of the answer, send it to the backend a second time). So a
                // tunnel that just answered waits for the connection to write the answer out
                // (a call the node sends down it meanwhile is unread, and refused).
                if let Some(at) = answered_at {
                    monoio::time::sleep_until(monoio::time::Instant::from_std(at + ANSWER_WRITTEN))
                        .await;
                }
                send.send_reset(h2::Reason::REFUSED_STREAM);
                return TunnelEnd::Closed;
            }
            IdleNext::End => {
                super::forward::end_tunnel(&mut send);
                return match closed_by_drain(&mut recv).await {
                    true => TunnelEnd::Moved,
                    false => TunnelEnd::Closed,
                };
            }
            IdleNext::Break(error) => return TunnelEnd::Broken(error),
        };
        agent.task.metrics.requests.inc(0);
        if !forward(agent, info, &mut recv, &mut reader, &mut send).await {
            return TunnelEnd::Closed;
        }
        answered_at = Some(std::time::Instant::now());
    }
}

/// How long after queueing an answer a stopping tunnel waits before its reset. HTTP/2 writes
/// the answer at the connection task's next turn, which may first wait for the write before it
/// (one socket operation: far less than this). Not covered: an answer held back by the node's
/// flow-control window, which a unary answer does not exhaust. Measured: without the wait,
/// tests/agent_stop.rs fails every run; with it, none.
const ANSWER_WRITTEN: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether the node ended an idle tunnel with UNAVAILABLE, which it does when the tunnel's
/// connection goes away (drain or retirement; see the node's `hold_idle`), as opposed to a
/// plain end. The trailers arrive with the end of the stream; the timeout only bounds a node
/// that ends the stream with an empty DATA frame and never sends trailers.
async fn closed_by_drain(recv: &mut RecvStream) -> bool {
    let trailers = monoio::time::timeout(std::time::Duration::from_secs(1), recv.trailers()).await;
    let Ok(Ok(Some(trailers))) = trailers else {
        return false;
    };
    is_drain_status(&trailers)
}

/// The trailers of a tunnel the node closed because its connection goes away.
pub(super) fn is_drain_status(trailers: &http::HeaderMap) -> bool {
    trailers
        .get("grpc-status")
        .is_some_and(|status| Code::from_header(status.as_bytes()) == Code::Unavailable)
}

/// Opens the Connect stream and sends the Descriptor; the node accepts (headers) or refuses
/// (trailers-only with a status).
async fn open(
    agent: &AgentShared,
    send_request: SendRequest<Bytes>,
    connection_id: i64,
) -> Result<(RecvStream, SendStream<Bytes>), TunnelEnd> {
    let mut ready = send_request.ready().await.map_err(broken)?;
    let request = Request::post(format!("http://sluice{CONNECT_PATH}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", agent.task.config.token),
        )
        .header(CONNECTION_ID_HEADER, connection_id.to_string())
        .header(AGENT_VERSION_HEADER, env!("CARGO_PKG_VERSION"))
        .body(())
        .map_err(|_| {
            TunnelEnd::Refused(TunnelError::new(
                ErrorKind::Unauthenticated,
                "the agent token is not a valid header value",
            ))
        })?;
    let (response, mut send) = ready.send_request(request, false).map_err(broken)?;
    let descriptor = frame(&ConnectRequest {
        msg: Some(connect_request::Msg::Descriptor(Descriptor {
            services: Vec::new(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            reusable: true,
        })),
    });
    send_data(&mut send, descriptor, false)
        .await
        .map_err(broken)?;
    Ok((accepted(response).await?, send))
}

/// The node's answer to a Connect: the stream to read calls from, or why it refused.
async fn accepted(response: ResponseFuture) -> Result<RecvStream, TunnelEnd> {
    let response = response.await.map_err(broken)?;
    if let Some(status) = response.headers().get("grpc-status") {
        let code = Code::from_header(status.as_bytes());
        let message = response
            .headers()
            .get("grpc-message")
            .map(|value| decode_message(value.as_bytes()))
            .unwrap_or_default();
        let refusal = TunnelError::new(ErrorKind::Unauthenticated, format!("{code}: {message}"));
        return Err(TunnelEnd::Refused(refusal.with_code(code)));
    }
    Ok(response.into_body())
}

#[cfg(test)]
mod tests {
    use sluice_proto::tunnel::v1::CloseSend;

    use super::*;

    #[test]
    fn an_idle_tunnel_forwards_calls_and_ends_on_everything_else() {
        let info = RequestInfo {
            method_name: "/a.B/C".into(),
            metadata: Vec::new(),
        };
        let call = classify_idle(Some(Ok(Some(connect_response::Msg::RequestInfo(info)))));
        assert!(matches!(call, IdleNext::Call(info) if info.method_name == "/a.B/C"));
        assert!(matches!(classify_idle(None), IdleNext::Expire));
        assert!(matches!(classify_idle(Some(Ok(None))), IdleNext::End));
        let stray = classify_idle(Some(Ok(Some(connect_response::Msg::CloseSend(
            CloseSend {},
        )))));
        assert!(matches!(stray, IdleNext::Break(error) if error.kind() == ErrorKind::NodeProtocol));
        let gone = classify_idle(Some(Err(ReadError::Gone("reset".into()))));
        assert!(matches!(gone, IdleNext::Break(error) if error.kind() == ErrorKind::NodeGone));
    }

    #[test]
    fn only_unavailable_trailers_mean_the_node_moves_its_agents() {
        let trailers = |code: &'static str| {
            let mut map = http::HeaderMap::new();
            map.insert("grpc-status", http::HeaderValue::from_static(code));
            map
        };
        assert!(is_drain_status(&trailers("14")), "UNAVAILABLE");
        assert!(!is_drain_status(&trailers("0")), "a plain end");
        assert!(
            !is_drain_status(&trailers("7")),
            "PERMISSION_DENIED: a revoked token"
        );
        assert!(!is_drain_status(&http::HeaderMap::new()));
    }

    /// An agent holds one such task per tunnel (hundreds) for the tunnel's whole life. The
    /// dial to the backend, done once per agent, is boxed out of it: inline it made each task
    /// 5,760 bytes.
    #[test]
    fn a_tunnel_task_stays_small() {
        let size = crate::future_size::of_five(tunnel);
        assert!(size <= 3072, "a tunnel's task is {size} bytes");
    }
}
