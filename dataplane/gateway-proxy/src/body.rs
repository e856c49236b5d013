//! Response bodies: the gateway's own (a `Status` JSON) or an upstream HTTP/2 stream relayed
//! frame by frame, so watch events reach the client as the apiserver sends them. An upstream
//! body holds what the request holds (its stream slot, flow-control permit, in-flight count)
//! until its last byte is relayed or the client goes away.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use sluice_gateway::flow_control::FlowPermit;
use sluice_metrics::PerCoreGauge;

use crate::pool::StreamSlot;

/// Kept alive by a response body; counts the request as in flight until dropped. Holds the
/// gauge alone (a reference count): a copy of all the metrics cost an allocation per request.
#[derive(Debug)]
pub struct InFlight {
    gauge: PerCoreGauge,
    worker: usize,
}

impl InFlight {
    pub fn new(metrics: &crate::metrics::GatewayMetrics, worker: usize) -> Self {
        metrics.in_flight.inc(worker);
        Self {
            gauge: metrics.in_flight.clone(),
            worker,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec(self.worker);
    }
}

/// What an upstream response body keeps alive (only dropped, never read).
#[derive(Debug)]
pub struct Held {
    pub _slot: StreamSlot,
    pub _permit: FlowPermit,
    pub _in_flight: InFlight,
}

#[derive(Debug)]
pub enum ProxyBody {
    Full(Option<Bytes>),
    Upstream {
        recv: h2::RecvStream,
        /// Read before the head was handed on (see `forward::first_data`), relayed first.
        first: Option<Result<Bytes, h2::Error>>,
        data_done: bool,
        finished: bool,
        /// Inline, not boxed: a box was one allocation per proxied request, and the enum's
        /// size is paid only while a response is in flight (`a_request_future_stays_small`).
        _held: Held,
    },
    /// An agent server's answer through the tunnel (boxed: rarer than the others, and the
    /// enum's size is paid by every response in flight).
    Agent(BoxedBody),
}

/// A body made by a module above this one (`via_agent`), boxed as a trait object so that this
/// module names none of them.
pub struct BoxedBody(pub Pin<Box<dyn http_body::Body<Data = Bytes, Error = h2::Error>>>);

impl std::fmt::Debug for BoxedBody {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("BoxedBody")
    }
}

impl ProxyBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        ProxyBody::Full(Some(bytes.into()))
    }
}

impl http_body::Body for ProxyBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match self.get_mut() {
            ProxyBody::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            ProxyBody::Agent(answer) => answer.0.as_mut().poll_frame(cx),
            ProxyBody::Upstream {
                recv,
                first,
                data_done,
                finished,
                ..
            } => {
                if *finished {
                    return Poll::Ready(None);
                }
                if let Some(first) = first.take() {
                    *finished = first.is_err();
                    return Poll::Ready(Some(first.map(Frame::data)));
                }
                if !*data_done {
                    match ready!(recv.poll_data(cx)) {
                        Some(Ok(chunk)) => {
                            // The client side only asks for the next frame once it can take
                            // it, so releasing here keeps end-to-end back-pressure.
                            let _ = recv.flow_control().release_capacity(chunk.len());
                            return Poll::Ready(Some(Ok(Frame::data(chunk))));
                        }
                        Some(Err(error)) => {
                            *finished = true;
                            return Poll::Ready(Some(Err(error)));
                        }
                        None => *data_done = true,
                    }
                }
                let trailers = ready!(recv.poll_trailers(cx));
                *finished = true;
                match trailers {
                    Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                    Ok(None) => Poll::Ready(None),
                    Err(error) => Poll::Ready(Some(Err(error))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(bytes) => bytes.is_none(),
            ProxyBody::Agent(answer) => answer.0.is_end_stream(),
            // h2 knows the upstream stream ended once its END_STREAM is read: saying so lets
            // hyper flag the last DATA frame instead of sending an empty one after it.
            ProxyBody::Upstream {
                recv,
                first,
                finished,
                ..
            } => first.is_none() && (*finished || recv.is_end_stream()),
        }
    }
}
