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

use crate::admit::Admitted;
use crate::body::{Held, InFlight, ProxyBody};
use crate::error::{ProxyError, UpstreamFailure};
use crate::handler::GatewayHandler;
use crate::headers::{response_headers, upstream_headers, upstream_request};
use crate::state::Generation;

impl GatewayHandler {
    pub async fn forward(
        &self,
        generation: &Arc<Generation>,
        admitted: Admitted,
        info: &RequestInfo<'_>,
        parts: &Parts,
        body: Incoming,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let Admitted {
            cluster,
            server,
            user,
            permit,
        } = admitted;
        let compiled = &generation.snapshot.clusters()[cluster];
        let runtime = &generation.clusters[cluster];
        let server = &compiled.servers[server];
        let upstream_failed = |cause: UpstreamFailure| ProxyError::Upstream {
            server: server.endpoint.clone(),
            cause,
        };

        let (send, slot) = self
            .pool
            .stream(
                &compiled.name,
                server,
                &runtime.client_tls,
                &compiled.connection_pool,
            )
            .await
            .map_err(upstream_failed)?;
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
        let (head, recv) = response.into_parts();
        let mut answer = Response::new(ProxyBody::Upstream {
            recv,
            data_done: false,
            finished: false,
            _held: Box::new(Held {
                _slot: slot,
                _permit: permit,
                _in_flight: InFlight::new(&self.gateway.metrics, self.worker),
            }),
        });
        *answer.status_mut() = head.status;
        *answer.headers_mut() = response_headers(head.headers);
        tracing::debug!(cluster = %compiled.name, user = %user.name, verb = info.verb.as_str(), path = info.path, server = %server.endpoint, status = head.status.as_u16(), "forwarded");
        Ok(answer)
    }
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
