//! Headers that HPACK sends by reference still arrive intact after a connection went quiet.
//!
//! The h2 patch (vendor/README.md) hands a quiet connection's HPACK decoding scratch back to a
//! per-thread pool, after copying the dynamic table's newest pseudo-header values (which are
//! slices of that scratch or of the frame they came in) into allocations of their own. Here two
//! connections on one server thread take turns, with a pause after every request so that each
//! read waits (a quiet moment) and the scratch moves between them; every `:authority` after the
//! first of its kind is sent as a dynamic-table index, so the server decodes it from the table
//! entry that was copied. Both drivers.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};
use sluice_grpc::transport::{compat, connect, serve, ClientConnection, H2Settings};

/// Requests per connection; authorities repeat so that most are sent by index.
const REQUESTS: usize = 24;
const AUTHORITIES: usize = 3;

fn block_on<F: std::future::Future>(legacy: bool, future: F) -> F::Output {
    if legacy {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    } else {
        RuntimeBuilder::<IoUringDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
            .block_on(future)
    }
}

/// Serves every connection with [`echo_head`], on one thread.
fn start_echo_server(legacy: bool) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        block_on(legacy, async move {
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                monoio::spawn(async move {
                    let io = compat(stream).unwrap();
                    let never = std::future::pending();
                    let _ = serve(io, &H2Settings::default(), never, echo_head).await;
                });
            }
        })
    });
    address
}

/// Answers with the authority and path the server decoded, as response headers.
async fn echo_head(request: Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let authority = request.uri().authority().unwrap().to_string();
    let response = Response::builder()
        .header("x-authority", authority)
        .header("x-path", request.uri().path())
        .body(())
        .unwrap();
    let _ = respond.send_response(response, true);
}

/// A long authority, so that its Huffman code is several bytes and differs between names.
fn authority(index: usize, address: SocketAddr) -> String {
    format!(
        "service-{index}.namespace-with-a-long-name.svc.cluster.local:{}",
        address.port()
    )
}

/// One request; returns what the server decoded.
async fn echo(connection: &ClientConnection, authority: &str, path: &str) -> (String, String) {
    let mut client = connection.send_request.clone().ready().await.unwrap();
    let request = Request::get(format!("http://{authority}{path}"))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_string();
    (header("x-authority"), header("x-path"))
}

fn run(legacy: bool) {
    let address = start_echo_server(legacy);
    block_on(legacy, async move {
        let settings = H2Settings::default();
        let connections = [
            connect(address, None, &settings).await.unwrap(),
            connect(address, None, &settings).await.unwrap(),
        ];
        for request in 0..REQUESTS {
            for (side, connection) in connections.iter().enumerate() {
                let authority = authority((request + side) % AUTHORITIES, address);
                let path = format!("/connection-{side}/request-{request}");
                let decoded = echo(connection, &authority, &path).await;
                assert_eq!(
                    decoded,
                    (authority, path),
                    "request {request} on connection {side}, legacy driver: {legacy}"
                );
                // Long enough for the server's read to wait: a quiet moment on each request.
                monoio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    });
}

#[test]
fn indexed_authorities_survive_quiet_moments_on_io_uring() {
    run(false);
}

#[test]
fn indexed_authorities_survive_quiet_moments_on_the_legacy_driver() {
    run(true);
}
