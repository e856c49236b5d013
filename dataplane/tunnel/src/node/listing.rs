//! ListConnectedAgents, one bounded page at a time: a page carries at most
//! `tunnel.list_page_size` connections, and `next_page_token` names where the next one starts
//! (as Kubernetes lists do with `limit` and `continue`). The token is the last listed key, so a
//! page is found again after connections come and go, without the node keeping any state.

use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use prost::Message as _;
use sluice_grpc::frame::FrameDecoder;
use sluice_locator::ConnectionKey;
use sluice_proto::agents::v1::{ListConnectedAgentsRequest, ListConnectedAgentsResponse};

use super::NodeShared;
use crate::error::{ErrorKind, TunnelError};

/// Largest ListConnectedAgents request read: a page size and a token naming one connection.
const MAX_REQUEST_BYTES: usize = 4096;

/// How long a client has to send its (tiny) request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn bad_request(message: impl Into<std::borrow::Cow<'static, str>>) -> TunnelError {
    TunnelError::new(ErrorKind::BadRequest, message)
}

/// The token naming `key`: `<agent>/<connection id>/<node>` (the node last, as it is the only
/// part that may hold a `/`).
pub fn page_token(key: &ConnectionKey) -> String {
    format!("{}/{}/{}", key.agent, key.connection_id, key.node)
}

/// The key a token names; `None` for the empty token (the first page).
pub fn parse_page_token(token: &str) -> Result<Option<ConnectionKey>, TunnelError> {
    if token.is_empty() {
        return Ok(None);
    }
    let mut parts = token.splitn(3, '/');
    let parsed = match (parts.next(), parts.next(), parts.next()) {
        (Some(agent), Some(connection), Some(node)) => agent
            .parse()
            .ok()
            .zip(connection.parse().ok())
            .map(|(agent, connection_id)| ConnectionKey {
                agent,
                node: node.to_string(),
                connection_id,
            }),
        _ => None,
    };
    parsed.map(Some).ok_or_else(|| {
        bad_request(
            "page_token is not a next_page_token this API issued; start again with an empty one",
        )
    })
}

/// Reads the request: one gRPC message of at most [`MAX_REQUEST_BYTES`]. A client that ends
/// its stream without one asks for the first page at the default size.
pub(super) async fn read_request(
    body: &mut RecvStream,
) -> Result<ListConnectedAgentsRequest, TunnelError> {
    let mut decoder = FrameDecoder::new(MAX_REQUEST_BYTES);
    let reading = async {
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => return Ok(Some(message.data)),
                Ok(None) => {}
                Err(error) => return Err(bad_request(format!("request: {error}"))),
            }
            match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    decoder.push(chunk);
                }
                Some(Err(_)) => return Err(TunnelError::client_gone()),
                None => return Ok(None),
            }
        }
    };
    let message: Option<Bytes> = monoio::time::timeout(REQUEST_TIMEOUT, reading)
        .await
        .map_err(|_| {
            TunnelError::new(
                ErrorKind::DeadlineExceeded,
                "no ListConnectedAgents request within 5s",
            )
        })??;
    match message {
        None => Ok(ListConnectedAgentsRequest::default()),
        Some(data) => ListConnectedAgentsRequest::decode(data)
            .map_err(|error| bad_request(format!("ListConnectedAgentsRequest: {error}"))),
    }
}

/// One page of the listing `request` asks for.
pub(super) async fn list_page(
    node: &NodeShared,
    request: &ListConnectedAgentsRequest,
) -> Result<ListConnectedAgentsResponse, TunnelError> {
    let most = node.agent_limits.list_page_size;
    let size = match request.page_size as usize {
        0 => most,
        asked => asked.min(most),
    };
    let after = parse_page_token(&request.page_token)?;
    // One more than the page, to know whether another page follows.
    let mut records = node.list_records(after, size + 1).await?;
    let next_page_token = if records.len() > size {
        records.truncate(size);
        records
            .last()
            .map(|last| page_token(&last.key()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    Ok(ListConnectedAgentsResponse {
        agents: node.with_idle_counts(records),
        next_page_token,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::test_node::{node, node_limited, run};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pages_are_bounded_and_cover_every_connection_once() {
        let node = node(None);
        for connection in 0..7 {
            node.admit_connection(4, connection, "v1").unwrap();
        }
        node.admit_connection(2, 99, "v1").unwrap();
        let mut seen = Vec::new();
        let mut request = ListConnectedAgentsRequest {
            page_size: 3,
            page_token: String::new(),
        };
        let mut pages = 0;
        loop {
            let page = run(list_page(&node, &request)).unwrap();
            assert!(page.agents.len() <= 3);
            seen.extend(page.agents.iter().map(|a| (a.agent_id, a.connection_id)));
            pages += 1;
            if page.next_page_token.is_empty() {
                break;
            }
            request.page_token = page.next_page_token;
        }
        assert_eq!(pages, 3);
        let mut expected: Vec<(i64, i64)> = (0..7).map(|c| (4, c)).collect();
        expected.insert(0, (2, 99));
        assert_eq!(seen, expected, "in order, each once");
    }

    #[test]
    fn the_page_size_is_capped_by_the_node() {
        let limits = sluice_config::AgentLimits {
            list_page_size: 4,
            ..Default::default()
        };
        let node = node_limited(None, None, limits);
        for connection in 0..10 {
            node.admit_connection(4, connection, "v1").unwrap();
        }
        for asked in [0, 5, u32::MAX] {
            let request = ListConnectedAgentsRequest {
                page_size: asked,
                page_token: String::new(),
            };
            let page = run(list_page(&node, &request)).unwrap();
            assert_eq!(page.agents.len(), 4, "asked {asked}");
            assert_eq!(page.next_page_token, "4/3/n");
        }
    }

    #[test]
    fn tokens_round_trip_and_foreign_ones_are_refused() {
        let key = ConnectionKey {
            agent: 7,
            node: "node/a".into(),
            connection_id: -3,
        };
        assert_eq!(parse_page_token(&page_token(&key)).unwrap(), Some(key));
        assert_eq!(parse_page_token("").unwrap(), None);
        for bad in ["x", "7/1", "a/1/n", "7/b/n"] {
            let error = parse_page_token(bad).unwrap_err();
            assert_eq!(error.code(), sluice_grpc::Code::InvalidArgument, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_tokens_never_panic(token in ".{0,200}") {
            let _ = parse_page_token(&token);
        }
    }
}
