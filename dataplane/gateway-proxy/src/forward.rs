//! Forwarding an admitted request on a shared HTTP/2 upstream connection, as the gateway with
//! the user in Impersonate-* headers, and streaming the response back frame by frame (see
//! `body.rs`).

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_gateway::request_info::RequestInfo;
use sluice_gateway::status::GatewayError;

use crate::admit::Admitted;
use crate::body::{Held, InFlight, ProxyBody};
use crate::error::{ProxyError, UpstreamFailure};
use crate::handler::GatewayHandler;
use crate::headers::{response_headers, upstream_headers, upstream_request};
use crate::pool::ClientStreamError;
use crate::state::Generation;
use crate::turns::ClientTurn;

impl GatewayHandler {
    pub async fn forward(
        &self,
        generation: &Arc<Generation>,
        admitted: Admitted,
        info: &RequestInfo<'_>,
        parts: &Parts,
        body: Incoming,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let compiled = &generation.snapshot.clusters()[admitted.cluster];
        if let Some(agent) = compiled.servers[admitted.server].agent {
            // Boxed: inline, the tunnel path's state made every request's future larger
            // (`a_request_future_stays_small`), direct ones included.
            let via_agent = self.forward_via_agent(generation, admitted, info, parts, body, agent);
            return Box::pin(via_agent).await;
        }
        let Admitted {
            cluster,
            server,
            user,
            permit,
        } = admitted;
        let runtime = &generation.clusters[cluster];
        let server = &compiled.servers[server];
        let upstream_failed = |cause: UpstreamFailure| ProxyError::Upstream {
            server: server.endpoint.clone(),
            cause,
        };

        let turn = ClientTurn {
            user: &user.name,
            long_running: info.is_long_running(),
            level: permit.level(),
        };
        let (send, slot) = self
            .pool
            .client_stream(
                (&compiled.name, server),
                &runtime.client_tls,
                &compiled.connection_pool,
                turn,
            )
            .await
            .map_err(|error| match error {
                ClientStreamError::Refused(refusal) => ProxyError::from(GatewayError::FairShare {
                    level: permit.level().cloned(),
                    refusal,
                }),
                ClientStreamError::Upstream(cause) => upstream_failed(cause),
            })?;
        let headers = upstream_headers(&parts.headers, &user, runtime.bearer.as_ref())?;
        let upstream = upstream_request(parts, server, headers)?;
        let mut send = send
            .ready()
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::Ready(error)))?;
        let empty = http_body::Body::is_end_stream(&body);
        let (response, stream) = send
            .send_request(upstream, empty)
            .map_err(|error| upstream_failed(UpstreamFailure::Send(error)))?;
        if !empty {
            sluice_runtime::spawn_contained("gateway-request-pump", pump_request(body, stream));
        }
        let response = response
            .await
            .map_err(|error| upstream_failed(UpstreamFailure::Response(error)))?;
        let (head, mut recv) = response.into_parts();
        let (first, data_done) = match first_data(&head, &mut recv).await {
            FirstData::NotAwaited => (None, false),
            FirstData::Read(first) => (Some(first), false),
            FirstData::NoData => (None, true),
        };
        let mut answer = Response::new(ProxyBody::Upstream {
            recv,
            first,
            data_done,
            finished: false,
            _held: Held {
                _slot: slot,
                _permit: permit,
                _in_flight: InFlight::new(&self.gateway.metrics, self.worker),
            },
        });
        *answer.status_mut() = head.status;
        *answer.headers_mut() = response_headers(head.headers);
        tracing::debug!(cluster = %compiled.name, user = %user.name, verb = info.verb.as_str(), path = info.path, server = %server.endpoint, status = head.status.as_u16(), "forwarded");
        Ok(answer)
    }
}

/// What [`first_data`] found.
enum FirstData {
    NotAwaited,
    Read(Result<Bytes, h2::Error>),
    NoData,
}

/// Waits for the first body bytes of an answer whose length is known and not zero, so its
/// head and those bytes leave in one write.
///
/// Why: an apiserver (and the simulator) may send the HEADERS of a burst of answers before
/// their DATA. Relaying each head at once, with its body not there yet, cost one more TLS
/// record, `send` and TCP segment per answer, and a pure ACK back from the client: at 512
/// HTTP/2 clients about 7 in 10 small answers left in two segments (docs/PERFORMANCE.md,
/// "Issue 17: a head that leaves alone"). A known, non-zero length means the bytes follow the
/// head; a streamed answer (a watch, no Content-Length) is relayed head first as before, since
/// its first bytes may be minutes away.
async fn first_data(head: &http::response::Parts, recv: &mut h2::RecvStream) -> FirstData {
    if !awaits_first_data(head, recv.is_end_stream()) {
        return FirstData::NotAwaited;
    }
    match std::future::poll_fn(|cx| recv.poll_data(cx)).await {
        Some(Ok(chunk)) => {
            let _ = recv.flow_control().release_capacity(chunk.len());
            FirstData::Read(Ok(chunk))
        }
        Some(Err(error)) => FirstData::Read(Err(error)),
        None => FirstData::NoData,
    }
}

/// Whether [`first_data`] waits: the answer has not ended and says it has bytes to come.
fn awaits_first_data(head: &http::response::Parts, ended: bool) -> bool {
    !ended
        && head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|length| length.as_bytes() != b"0")
}

/// Client request body -> upstream stream, frame by frame with HTTP/2 flow control.
async fn pump_request(mut body: Incoming, mut stream: h2::SendStream<Bytes>) {
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(_) => {
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if sluice_grpc::transport::send_data(&mut stream, data, false)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = stream.send_trailers(trailers);
                }
                return;
            }
        }
    }
    let _ = sluice_grpc::transport::send_data(&mut stream, Bytes::new(), true).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(content_length: Option<&str>) -> http::response::Parts {
        let mut response = Response::new(());
        if let Some(length) = content_length {
            response.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from_str(length).expect("a valid header value"),
            );
        }
        response.into_parts().0
    }

    #[test]
    fn a_known_length_answer_waits_for_its_first_bytes() {
        assert!(awaits_first_data(&head(Some("267")), false));
    }

    #[test]
    fn a_streamed_answer_is_relayed_head_first() {
        // A watch has no Content-Length; its first event may be minutes away.
        assert!(!awaits_first_data(&head(None), false));
    }

    #[test]
    fn an_empty_or_ended_answer_does_not_wait() {
        assert!(!awaits_first_data(&head(Some("0")), false));
        assert!(!awaits_first_data(&head(Some("267")), true));
    }
}
