//! HTTP/1.1 upgrades (exec, attach, port-forward) to an agent server: the request head goes as
//! one `MakeRequest` call (Head and the empty body's End together, as for any upgrade), and
//! the agent's answer head is written to the client as HTTP/1.1. After a 101 the client's
//! bytes go as UpgradeData messages and the agent's UpgradeData come back as bytes, both ways
//! until either side ends; any other answer is passed on and the connection closed, the
//! client's bytes never sent (as `crate::upgrade` does for direct servers).
//!
//! Flow control: a client read waits until the call's window took the previous chunk, and the
//! next message is read from the call only once the last was written to the client.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::SendStream;
use http::header::HeaderValue;
use http::{HeaderMap, StatusCode};
use sluice_gateway::identity::UserInfo;
use sluice_kube_tunnel::{
    encode_request_end, encode_request_head, encode_request_upgrade_data, ResponseHead,
    ResponseMessage,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::call::{self, After, AnswerStream};
use crate::error::{AgentFailure, ProxyError};
use crate::handler::GatewayHandler;
use crate::head::RequestHead;
use crate::headers::upstream_headers;

/// How long a non-101 answer to an upgrade may keep streaming before the connection closes.
const REFUSAL_DRAIN: Duration = Duration::from_secs(2);
/// Most bytes read from the client at once (then cut to the exchange's Data bound).
const READ_CHUNK: usize = 16 * 1024;

impl GatewayHandler {
    /// An admitted upgrade to `agent`: the call, the answer's head to the client, and after a
    /// 101 the upgraded stream relayed; the agent's status once relayed.
    pub async fn upgrade_via_agent<C>(
        &self,
        stream: &mut C,
        (head, early): (RequestHead, Bytes),
        user: &UserInfo,
        agent: u64,
    ) -> Result<u16, ProxyError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let failed = |cause: AgentFailure| ProxyError::Agent { agent, cause };
        let path = self
            .gateway
            .agent_path()
            .ok_or(failed(AgentFailure::NoPath))?;
        let target = head
            .uri
            .path_and_query()
            .map_or("/", |target| target.as_str());
        let assertion = super::sign(path, user, agent, &head.method, target).map_err(failed)?;
        let headers = upgrade_headers(&head.headers, user)?;
        let encoded = encode_request_head(&head.method, target, &headers, &assertion);
        let send = self
            .agent_link(path)
            .await
            .map_err(|error| failed(AgentFailure::Link(error)))?;
        let (response, call) = call::start(send, agent, encoded, After::Upgrade)
            .await
            .map_err(failed)?;
        let (answer_head, answer) = call::answer(response, &path.limits).await.map_err(failed)?;
        let status = answer_head.status.as_u16();
        tracing::debug!(user = %user.name, path = target, agent, status, "upgrade through the tunnel");
        if !early.is_empty() && answer_head.status != StatusCode::SWITCHING_PROTOCOLS {
            // Bytes behind an upgrade the apiserver refused: dropped, never sent.
            self.gateway.metrics.upgrade_early_dropped.inc(self.worker);
        }
        let max_data = path.limits.max_data_bytes;
        let _ = relay(stream, (answer_head, answer), (call, early), max_data).await;
        Ok(status)
    }
}

/// The client's end-to-end headers without its credentials or impersonation (the agent sets
/// the user from the assertion alone), and the upgrade's own Connection and Upgrade.
fn upgrade_headers(client: &HeaderMap, user: &UserInfo) -> Result<HeaderMap, ProxyError> {
    let mut headers = upstream_headers(client, user, None)?;
    headers.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    if let Some(protocol) = client.get(http::header::UPGRADE) {
        headers.insert(http::header::UPGRADE, protocol.clone());
    }
    Ok(headers)
}

/// The agent's answer head as HTTP/1.1 bytes, every header as the apiserver sent it (a 101's
/// Connection, Upgrade and stream protocol are the client's to read).
fn http1_head(status: StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let reason = status.canonical_reason().unwrap_or("");
    out.extend_from_slice(format!("HTTP/1.1 {} {reason}\r\n", status.as_u16()).as_bytes());
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// `data` as UpgradeData messages of at most `max_data` bytes each, gRPC-framed.
fn upgrade_messages(mut data: Bytes, max_data: usize) -> Vec<Bytes> {
    let mut messages = Vec::with_capacity(data.len() / max_data.max(1) + 1);
    while !data.is_empty() {
        let piece = data.split_to(data.len().min(max_data.max(1)));
        let message = encode_request_upgrade_data(piece);
        messages.push(sluice_grpc::encode_message(false, &message));
    }
    messages
}

/// How the client's side of an upgraded stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientEnd {
    /// The client closed its side; the call's send side closed with End.
    Closed,
    /// A read from the client or the send on the call failed.
    Broken,
}

/// Writes the answer head to the client; after a 101 relays both ways until either side ends,
/// otherwise the answer's body (for at most [`REFUSAL_DRAIN`]). The client's side is shut down
/// and the call closed (or reset when broken) at the end.
async fn relay<C>(
    client: &mut C,
    (head, mut answer): (ResponseHead, AnswerStream),
    (mut call, early): (SendStream<Bytes>, Bytes),
    max_data: usize,
) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    client
        .write_all(&http1_head(head.status, &head.headers))
        .await?;
    client.flush().await?;
    if head.status != StatusCode::SWITCHING_PROTOCOLS {
        let _ = monoio::time::timeout(REFUSAL_DRAIN, pump_down(&mut answer, client)).await;
        // The request side already ended its body; only END_STREAM is left to send.
        let _ = call.send_data(Bytes::new(), true);
        return client.shutdown().await;
    }
    let (mut read, mut write) = tokio::io::split(client);
    let client_end = {
        let up = async {
            let end = pump_up(&mut read, &mut call, early, max_data).await;
            if end == ClientEnd::Closed {
                // Half-closed: the agent's side may still be answering.
                std::future::pending::<()>().await;
            }
            end
        };
        monoio::select! {
            end = up => Some(end),
            _ = pump_down(&mut answer, &mut write) => None,
        }
    };
    match client_end {
        Some(_broken) => call.send_reset(h2::Reason::CANCEL),
        // The agent ended first: close the call's send side as well (a no-op once closed).
        None => {
            let end = sluice_grpc::encode_message(false, &encode_request_end());
            let _ = call.send_data(end, true);
        }
    }
    write.shutdown().await
}

/// Client -> call: the early bytes, then every read, as UpgradeData; End once the client
/// closes its side.
async fn pump_up<R: AsyncRead + Unpin>(
    client: &mut R,
    call: &mut SendStream<Bytes>,
    early: Bytes,
    max_data: usize,
) -> ClientEnd {
    let mut chunk = early;
    let mut buffer = BytesMut::with_capacity(READ_CHUNK);
    loop {
        for message in upgrade_messages(chunk, max_data) {
            if sluice_grpc::transport::send_data(call, message, false)
                .await
                .is_err()
            {
                return ClientEnd::Broken;
            }
        }
        buffer.reserve(READ_CHUNK);
        match client.read_buf(&mut buffer).await {
            Ok(0) => break,
            Ok(_) => chunk = buffer.split().freeze(),
            Err(_) => return ClientEnd::Broken,
        }
    }
    let end = sluice_grpc::encode_message(false, &encode_request_end());
    match sluice_grpc::transport::send_data(call, end, true).await {
        Ok(()) => ClientEnd::Closed,
        Err(_) => ClientEnd::Broken,
    }
}

/// Call -> client: each Data or UpgradeData message's bytes (the exchange's order decides
/// which may come), until End, the call's end, or a failure.
async fn pump_down<W: AsyncWrite + Unpin>(answer: &mut AnswerStream, client: &mut W) {
    loop {
        let next = std::future::poll_fn(|cx| answer.poll_next(cx)).await;
        let data = match next {
            Ok(Some(ResponseMessage::Data(data) | ResponseMessage::UpgradeData(data))) => data,
            Ok(Some(ResponseMessage::End) | None) => return,
            Ok(Some(ResponseMessage::Head(_))) => return,
            Err(failure) => {
                tracing::debug!(%failure, "an upgrade through the tunnel broke off");
                return;
            }
        };
        if client.write_all(&data).await.is_err() || client.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sluice_kube_tunnel::{decode_request, ExchangeLimits, ExchangeOrder, RequestMessage};

    #[test]
    fn the_answer_head_keeps_the_upgrade_headers_for_the_client() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("Upgrade"));
        headers.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        headers.insert(
            "x-stream-protocol-version",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        let head = http1_head(StatusCode::SWITCHING_PROTOCOLS, &headers);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: SPDY/3.1\r\nx-stream-protocol-version: v4.channel.k8s.io\r\n\r\n"
        );
        let refused = http1_head(StatusCode::FORBIDDEN, &HeaderMap::new());
        assert_eq!(&refused[..], b"HTTP/1.1 403 Forbidden\r\n\r\n");
    }

    #[test]
    fn the_upgrade_asks_for_the_clients_protocol_without_its_credentials() {
        let mut client = HeaderMap::new();
        client.insert(
            "connection",
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        client.insert("upgrade", HeaderValue::from_static("websocket"));
        client.insert("authorization", HeaderValue::from_static("Bearer mine"));
        client.insert("impersonate-user", HeaderValue::from_static("root"));
        let user = UserInfo {
            name: "alice".into(),
            ..UserInfo::default()
        };
        let headers = upgrade_headers(&client, &user).unwrap();
        assert_eq!(headers["connection"], "Upgrade");
        assert_eq!(headers["upgrade"], "websocket");
        assert!(headers.get("authorization").is_none());
        let users: Vec<_> = headers.get_all("impersonate-user").iter().collect();
        assert_eq!(
            users,
            ["alice"],
            "the client's own Impersonate-User never passes"
        );
    }

    #[test]
    fn client_bytes_become_bounded_upgrade_data_in_the_order_the_agent_accepts() {
        let limits = ExchangeLimits::default();
        let messages = upgrade_messages(Bytes::from(vec![7u8; 10]), 4);
        assert_eq!(messages.len(), 3);
        let mut order = ExchangeOrder::new();
        // Head and End go first, before the 101 is known.
        order
            .request_kind(sluice_kube_tunnel::MessageKind::Head)
            .unwrap();
        order.on_request(&RequestMessage::End).unwrap();
        let head = sluice_kube_tunnel::ResponseMessage::Head(ResponseHead {
            status: StatusCode::SWITCHING_PROTOCOLS,
            headers: HeaderMap::new(),
        });
        order.on_response(&head).unwrap();
        let mut carried = Vec::new();
        for framed in messages {
            // The 5-byte gRPC prefix, then the message.
            let message = decode_request(&framed[5..], &limits).unwrap();
            order.on_request(&message).unwrap();
            let RequestMessage::UpgradeData(data) = message else {
                panic!("{message:?}")
            };
            assert!(data.len() <= 4);
            carried.extend_from_slice(&data);
        }
        assert_eq!(carried, vec![7u8; 10]);
        order.on_request(&RequestMessage::End).unwrap();
        assert!(upgrade_messages(Bytes::new(), 4).is_empty());
    }
}
