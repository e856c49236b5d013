//! The I/O every HTTP/2 connection (h2, and hyper's HTTP/2 server) runs on: the TLS or TCP
//! stream, declared not vectored.
//!
//! Why: h2's frame writer keeps a DATA payload of 256 bytes or more out of its buffer when the
//! I/O is vectored, and it then flushes the whole connection (frames, TLS, socket) before it
//! buffers the next frame. So a response of HEADERS + DATA + trailers, or DATA frames of
//! several streams, left as one flush each: one TLS flush, one socket write and one TCP
//! segment per DATA frame (a small GET through the gateway: two segments where one does, the
//! second carrying only END_STREAM). Declared not vectored, h2 copies payloads up to 1 KiB
//! into its buffer and flushes once per batch. The copy costs nothing extra here: below this,
//! rustls and [`crate::gather::GatherStream`] copy every byte into their own buffers anyway.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `T` with scalar writes only; see the module comment.
#[derive(Debug)]
pub struct FrameIo<T>(pub T);

impl<T: AsyncRead + Unpin> AsyncRead for FrameIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        into: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, into)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FrameIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    // `is_write_vectored` keeps its default (false): that is the point of this type.

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use std::cell::Cell;
    use std::rc::Rc;

    use bytes::Bytes;
    use http::{HeaderMap, Request, Response};
    use monoio::net::TcpStream;

    use super::*;
    use crate::gather::GatherStream;

    /// Counts write batches: flushes that had bytes written before them. Vectored, as a TLS
    /// stream is.
    struct Batches {
        inner: GatherStream,
        written: bool,
        batches: Rc<Cell<usize>>,
    }

    impl AsyncRead for Batches {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            into: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, into)
        }
    }

    impl AsyncWrite for Batches {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            this.written = true;
            Pin::new(&mut this.inner).poll_write(cx, buf)
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            this.written = true;
            Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if std::mem::take(&mut this.written) {
                this.batches.set(this.batches.get() + 1);
            }
            Pin::new(&mut this.inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    /// Write batches the server needs for one answer of HEADERS, a 300-byte DATA frame and
    /// trailers (a small gRPC response), with or without [`FrameIo`] under h2.
    async fn batches_for_one_answer(frame_io: bool) -> usize {
        let listener = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (accepted, connected) = monoio::join!(listener.accept(), TcpStream::connect(address));
        let batches = Rc::new(Cell::new(0));
        let server_io = Batches {
            inner: GatherStream::new(accepted.unwrap().0),
            written: false,
            batches: batches.clone(),
        };
        let at_request = Rc::new(Cell::new(0));
        let seen = at_request.clone();
        let counted = batches.clone();
        let server = monoio::spawn(async move {
            if frame_io {
                let connection = h2::server::handshake(FrameIo(server_io)).await.unwrap();
                answer(connection, &seen, &counted).await;
            } else {
                let connection = h2::server::handshake(server_io).await.unwrap();
                answer(connection, &seen, &counted).await;
            }
        });
        let (mut client, connection) = h2::client::handshake(GatherStream::new(connected.unwrap()))
            .await
            .unwrap();
        let driver = monoio::spawn(connection);
        let request = Request::get("http://localhost/").body(()).unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        let mut body = response.await.unwrap().into_body();
        while let Some(data) = body.data().await {
            data.unwrap();
        }
        body.trailers().await.unwrap();
        let answer_batches = batches.get() - at_request.get();
        drop((client, body));
        let _ = driver.await;
        server.await;
        answer_batches
    }

    /// Answers the first request with HEADERS, 300 bytes of DATA and trailers, noting the
    /// batches written before it; then drives the connection until the client goes.
    async fn answer<T: AsyncRead + AsyncWrite + Unpin>(
        mut connection: h2::server::Connection<T, Bytes>,
        at_request: &Cell<usize>,
        batches: &Cell<usize>,
    ) {
        let (_request, mut respond) = connection.accept().await.unwrap().unwrap();
        at_request.set(batches.get());
        let mut send = respond.send_response(Response::new(()), false).unwrap();
        send.send_data(Bytes::from(vec![7u8; 300]), false).unwrap();
        send.send_trailers(HeaderMap::new()).unwrap();
        while connection.accept().await.is_some() {}
    }

    #[monoio::test_all(timer_enabled = true)]
    async fn a_small_answer_leaves_in_one_write() {
        assert_eq!(batches_for_one_answer(true).await, 1);
    }

    /// Why [`FrameIo`] exists: over a vectored stream h2 flushes after the DATA frame.
    #[monoio::test_all(timer_enabled = true)]
    async fn over_a_vectored_stream_h2_flushes_after_the_data_frame() {
        assert_eq!(batches_for_one_answer(false).await, 2);
    }
}
