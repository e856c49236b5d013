//! An HTTP/2 server that echoes, as response headers, the authority and path it decoded, and
//! its client: what the h2 patches' tests check decoding with.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use sluice_grpc::transport::{compat, serve, ClientConnection, H2Settings};

use super::block_on;

/// Answers with the authority and path the server decoded, as response headers, and each
/// `authorization` or `x-probe-*` header as `x-echo-<name>`.
async fn echo_head(request: Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let authority = request.uri().authority().unwrap().to_string();
    let mut response = Response::builder()
        .header("x-authority", authority)
        .header("x-path", request.uri().path());
    for (name, value) in request.headers() {
        if name == "authorization" || name.as_str().starts_with("x-probe-") {
            response = response.header(format!("x-echo-{name}"), value);
        }
    }
    let _ = respond.send_response(response.body(()).unwrap(), true);
}

/// Serves every connection with [`echo_head`], on one thread, over TLS when given a config.
pub fn start_echo_server(legacy: bool, tls: Option<Arc<rustls::ServerConfig>>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        block_on(legacy, async move {
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let tls = tls.clone();
                monoio::spawn(async move {
                    let io = compat(stream).unwrap();
                    let never = std::future::pending();
                    let settings = H2Settings::default();
                    let _ = match tls {
                        Some(tls) => {
                            let io = tokio_rustls::TlsAcceptor::from(tls).accept(io).await;
                            serve(io.unwrap(), &settings, never, echo_head).await
                        }
                        None => serve(io, &settings, never, echo_head).await,
                    };
                });
            }
        })
    });
    address
}

/// One request; returns what the server decoded.
pub async fn echo(connection: &ClientConnection, authority: &str, path: &str) -> (String, String) {
    let response = echo_headers(connection, authority, path, http::HeaderMap::new()).await;
    let header = |name: &str| response[name].to_str().unwrap().to_string();
    (header("x-authority"), header("x-path"))
}

/// One request carrying `headers`; returns the answer's headers (`x-echo-<name>` for each
/// `authorization` or `x-probe-*` header the server decoded).
pub async fn echo_headers(
    connection: &ClientConnection,
    authority: &str,
    path: &str,
    headers: http::HeaderMap,
) -> http::HeaderMap {
    let mut client = connection.send_request.clone().ready().await.unwrap();
    let mut request = Request::get(format!("http://{authority}{path}"))
        .body(())
        .unwrap();
    *request.headers_mut() = headers;
    let (response, _) = client.send_request(request, true).unwrap();
    response.await.unwrap().into_parts().0.headers
}
