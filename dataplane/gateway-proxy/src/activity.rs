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
    /// A request ever arrived on the connection.
    any: Cell<bool>,
}

impl Activity {
    /// Counts a request in flight until the returned guard (moved into its body) is dropped.
    pub fn enter(self: &Rc<Self>) -> ActiveGuard {
        self.in_flight.set(self.in_flight.get() + 1);
        self.arrived.set(true);
        self.any.set(true);
        ActiveGuard(self.clone())
    }

    /// Whether any request arrived on the connection yet.
    pub fn seen_any(&self) -> bool {
        self.any.get()
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
pub struct ActiveBody {
    body: ProxyBody,
    _active: ActiveGuard,
    watch: Option<WatchEnd>,
}

impl std::fmt::Debug for ActiveBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveBody")
            .field("body", &self.body)
            .field("watch", &self.watch.is_some())
            .finish()
    }
}

/// A JSON watch ends cleanly when its connection closes (drain, or retired by age): after the
/// last whole event (a watch event is one JSON line), the body ends, so the client reads a
/// complete stream (last chunk on HTTP/1.1, END_STREAM on HTTP/2) and resumes from the last
/// resourceVersion it saw, on another gateway. Without it the watch would hold the drain until
/// its deadline and then be cut mid-stream.
struct WatchEnd {
    closing: sluice_runtime::Closing,
    /// Wakes the body when the connection starts closing while no event is in the works.
    waiting: Option<Pin<Box<dyn std::future::Future<Output = ()>>>>,
    /// What was relayed so far ends with a whole event.
    at_boundary: bool,
}

impl WatchEnd {
    /// Whether the body should end now: closing, and between two events.
    fn should_end(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.at_boundary {
            return false;
        }
        if self.closing.is_fired() {
            return true;
        }
        let closing = self.closing.clone();
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(async move { closing.wait().await }));
        waiting.as_mut().poll(cx).is_ready()
    }
}

impl ActiveBody {
    pub fn new(body: ProxyBody, active: ActiveGuard) -> Self {
        Self {
            body,
            _active: active,
            watch: None,
        }
    }

    /// The body of a JSON watch response, ended cleanly between events once `closing` fires.
    pub fn watch(body: ProxyBody, active: ActiveGuard, closing: sluice_runtime::Closing) -> Self {
        Self {
            body,
            _active: active,
            watch: Some(WatchEnd {
                closing,
                waiting: None,
                at_boundary: true,
            }),
        }
    }
}

/// Whether a request asks for a watch (`?watch=1|true`, or the old `/watch/` paths).
pub fn is_watch(uri: &http::Uri) -> bool {
    let by_query = uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=1" | "watch=true"))
    });
    by_query || uri.path().contains("/watch/")
}

/// Whether a response streams newline-delimited JSON events (what [`WatchEnd`] can split).
pub fn is_json(response: &http::Response<ProxyBody>) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

impl http_body::Body for ActiveBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if let Some(watch) = this.watch.as_mut() {
            if watch.should_end(cx) {
                return Poll::Ready(None);
            }
        }
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        if let (Some(watch), Some(Ok(frame))) = (this.watch.as_mut(), &frame) {
            if let Some(data) = frame.data_ref().filter(|data| !data.is_empty()) {
                watch.at_boundary = data.ends_with(b"\n");
            }
        }
        Poll::Ready(frame)
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

    fn poll(body: &mut ActiveBody) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(body).poll_frame(&mut cx)
    }

    #[test]
    fn a_watch_ends_at_a_drain_only_between_events() {
        let activity = Rc::new(Activity::default());
        let closing = sluice_runtime::Closing::default();
        let mut body = ActiveBody::watch(
            ProxyBody::full("{\"type\":\"ADDED\"}\n{\"type\":"),
            activity.enter(),
            closing.clone(),
        );
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        assert!(
            !body.watch.as_ref().unwrap().at_boundary,
            "half an event out"
        );
        assert!(
            matches!(poll(&mut body), Poll::Ready(None)),
            "the upstream ended"
        );
        let mut quiet = ActiveBody::watch(ProxyBody::full("x"), activity.enter(), closing.clone());
        closing.fire();
        assert!(
            matches!(poll(&mut quiet), Poll::Ready(None)),
            "between events a closing connection ends the watch"
        );
    }

    #[test]
    fn watches_are_told_by_query_or_path() {
        let watch = |uri: &str| is_watch(&uri.parse().unwrap());
        assert!(watch("/api/v1/pods?watch=1&resourceVersion=5"));
        assert!(watch(
            "/api/v1/namespaces/a/pods?labelSelector=x&watch=true"
        ));
        assert!(watch("/api/v1/watch/pods"));
        assert!(!watch("/api/v1/pods?watch=false"));
        assert!(!watch("/api/v1/pods?limit=5"));
    }
}
