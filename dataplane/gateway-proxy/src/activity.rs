//! Whether a client connection has requests in flight, for its idle timeout. hyper does not say
//! when an HTTP/2 connection is idle, and a request is in flight until its response body ends
//! (a watch streams for minutes after the handler returned), so the guard rides on the body.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;

use crate::body::ProxyBody;

/// One connection's requests in flight, and whether one arrived since the last look.
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: Cell<usize>,
    arrived: Cell<bool>,
}

impl Activity {
    /// Counts a request in flight until the returned guard (moved into its body) is dropped.
    pub fn enter(self: &Rc<Self>) -> ActiveGuard {
        self.in_flight.set(self.in_flight.get() + 1);
        self.arrived.set(true);
        ActiveGuard(self.clone())
    }

    pub fn busy(&self) -> bool {
        self.in_flight.get() > 0
    }

    /// Whether a request arrived since the last call.
    pub fn take_arrived(&self) -> bool {
        self.arrived.replace(false)
    }
}

#[derive(Debug)]
pub struct ActiveGuard(Rc<Activity>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let activity = &self.0;
        activity
            .in_flight
            .set(activity.in_flight.get().saturating_sub(1));
    }
}

/// A response body that keeps its request counted as in flight until it ends or is dropped.
#[derive(Debug)]
pub struct ActiveBody {
    body: ProxyBody,
    _active: ActiveGuard,
}

impl ActiveBody {
    pub fn new(body: ProxyBody, active: ActiveGuard) -> Self {
        Self {
            body,
            _active: active,
        }
    }
}

impl http_body::Body for ActiveBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    #[test]
    fn a_request_is_in_flight_until_its_body_is_gone() {
        let activity = Rc::new(Activity::default());
        assert!(!activity.busy());
        let body = ActiveBody::new(ProxyBody::full("x"), activity.enter());
        assert!(activity.busy());
        assert!(activity.take_arrived());
        assert!(!activity.take_arrived(), "taken once");
        assert!(!body.is_end_stream());
        drop(body);
        assert!(!activity.busy());
    }
}
