//! The simulator's response body: a whole buffer or a channel of chunks (watch events), each
//! sent as its own frame so it is flushed at once. It holds the stream counter's guard, so a
//! stream counts as open until its body is done.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};

use super::Shared;

pub(crate) struct StreamGuard(Arc<Shared>);

impl StreamGuard {
    pub(crate) fn open(shared: &Arc<Shared>) -> Self {
        let open = shared.open_streams.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_open_streams.fetch_max(open, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.open_streams.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Content {
    Full(Option<Bytes>),
    Stream(tokio::sync::mpsc::UnboundedReceiver<Bytes>),
}

pub(crate) struct ResponseBody {
    content: Content,
    guard: Option<StreamGuard>,
}

impl ResponseBody {
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            content: Content::Full(Some(bytes.into())),
            guard: None,
        }
    }

    pub(crate) fn stream(receiver: tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Self {
        Self {
            content: Content::Stream(receiver),
            guard: None,
        }
    }

    pub(crate) fn with_guard(mut self, guard: StreamGuard) -> Self {
        self.guard = Some(guard);
        self
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let next = match &mut this.content {
            Content::Full(bytes) => Poll::Ready(bytes.take()),
            Content::Stream(receiver) => receiver.poll_recv(context),
        };
        match next {
            Poll::Ready(Some(bytes)) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(None) => {
                this.guard = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.content, Content::Full(None))
    }
}
