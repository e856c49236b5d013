//! A demo gRPC backend for `sluice up`: answers any method by streaming each request message
//! back unchanged (so unary, client-, server- and bidi-streaming calls all work with a bytes
//! payload), returns request metadata starting with `x-` as response headers, and ends with
//! `grpc-status: 0`. It is a demo upstream, not a test double: tests use Python grpcio servers.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use http::{HeaderMap, HeaderValue, Response};
use sluice_grpc::transport::{compat, recv_data, send_data, serve, H2Settings};
use sluice_runtime::{
    ConnectionContext, ConnectionHandler, HandlerFactory, TcpStream, WorkerContext,
};

#[derive(Debug, Clone, Default)]
pub struct EchoBackend;

impl HandlerFactory for EchoBackend {
    fn create(&self, _worker: &WorkerContext) -> Rc<dyn ConnectionHandler> {
        Rc::new(Self)
    }
}

impl ConnectionHandler for EchoBackend {
    fn handle(
        self: Rc<Self>,
        stream: TcpStream,
        conn: ConnectionContext,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async move {
            let settings = H2Settings::default();
            let Ok(io) = compat(stream) else { return };
            let served = serve(
                io,
                &settings,
                conn.draining(),
                |request, mut respond| async move {
                    let (parts, mut body) = request.into_parts();
                    let mut response = Response::new(());
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/grpc"),
                    );
                    for (name, value) in parts.headers.iter() {
                        if name.as_str().starts_with("x-") {
                            response.headers_mut().append(name.clone(), value.clone());
                        }
                    }
                    let Ok(mut send) = respond.send_response(response, false) else {
                        return;
                    };
                    while let Some(chunk) = recv_data(&mut body).await {
                        let Ok(chunk) = chunk else {
                            return;
                        };
                        if send_data(&mut send, chunk, false).await.is_err() {
                            return;
                        }
                    }
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("0"));
                    let _ = send.send_trailers(trailers);
                },
            );
            if let Err(error) = served.await {
                tracing::debug!(%error, "echo backend connection ended with an error");
            }
        })
    }
}
