//! Large streaming bodies through HTTP/2 on monoio, cleartext and TLS, on both drivers: the
//! combination NOTES.md warns about (h2 + TLS + monoio-compat) must move 32 MiB each way with
//! flow control and arrive intact.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use rustls::pki_types::ServerName;
use sluice_grpc::tls;
use sluice_grpc::transport::{compat, connect, recv_data, send_data, serve, H2Settings};
use test_support::Certificates;

const TOTAL: usize = 32 * 1024 * 1024;
const CHUNK: usize = 256 * 1024;

/// A byte pattern that catches reordered, dropped or duplicated chunks.
fn chunk(index: usize) -> Bytes {
    let mut data = vec![0u8; CHUNK];
    for (offset, byte) in data.iter_mut().enumerate() {
        *byte = ((index * 31 + offset * 7) % 251) as u8;
    }
    Bytes::from(data)
}

fn run_case(legacy: bool, use_tls: bool) {
    let certs = Certificates::generate(&[]).expect("certificates");
    let server_tls =
        tls::server_config(&certs.server_cert, &certs.server_key, None).expect("server TLS");
    let client_tls = tls::client_config(Some(&certs.ca_cert), None).expect("client TLS");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();

    let server = std::thread::spawn(move || {
        block_on(legacy, async move {
            let listener = monoio::net::TcpListener::from_std(listener).unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let io = compat(stream).unwrap();
            // Echo: stream every received chunk straight back.
            let handler = |request: Request<h2::RecvStream>,
                           mut respond: h2::server::SendResponse<Bytes>| async move {
                let mut body = request.into_body();
                let mut send = respond.send_response(Response::new(()), false).unwrap();
                while let Some(chunk) = recv_data(&mut body).await {
                    send_data(&mut send, chunk.unwrap(), false).await.unwrap();
                }
                send_data(&mut send, Bytes::new(), true).await.unwrap();
            };
            let never = std::future::pending::<()>();
            if use_tls {
                let io = tokio_rustls::TlsAcceptor::from(server_tls)
                    .accept(io)
                    .await
                    .unwrap();
                serve(io, &H2Settings::default(), never, handler)
                    .await
                    .unwrap();
            } else {
                serve(io, &H2Settings::default(), never, handler)
                    .await
                    .unwrap();
            }
        })
    });

    let received = block_on(legacy, async move {
        let tls = use_tls.then(|| (client_tls, ServerName::try_from("localhost").unwrap()));
        let connection = connect(address, tls, &H2Settings::default()).await.unwrap();
        let mut client = connection.send_request.ready().await.unwrap();
        let request = Request::post(format!("http://{address}/echo"))
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        let sender = monoio::spawn(async move {
            for index in 0..TOTAL / CHUNK {
                send_data(&mut send, chunk(index), index + 1 == TOTAL / CHUNK)
                    .await
                    .unwrap();
            }
        });
        let mut body = response.await.unwrap().into_body();
        let mut expected = Vec::new();
        for index in 0..TOTAL / CHUNK {
            expected.extend_from_slice(&chunk(index));
        }
        let mut received = 0usize;
        while let Some(data) = recv_data(&mut body).await {
            let data = data.unwrap();
            assert_eq!(
                &data[..],
                &expected[received..received + data.len()],
                "bytes at offset {received}"
            );
            received += data.len();
        }
        sender.await;
        drop((client, body));
        // Dropping every handle ends the connection; wait for its driver so the socket closes
        // before this runtime goes away (monoio does not cancel tasks of a dropped runtime).
        connection.driver.await;
        received
    });
    assert_eq!(received, TOTAL, "legacy={legacy} tls={use_tls}");
    // The server's connection ends when the client's does.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(server.is_finished(), "server connection did not end");
    server.join().expect("server thread");
}

#[test]
fn thirty_two_mebibytes_echo_over_tls_on_io_uring() {
    run_case(false, true);
}

#[test]
fn thirty_two_mebibytes_echo_over_tls_on_legacy() {
    run_case(true, true);
}

#[test]
fn thirty_two_mebibytes_echo_over_h2c_on_both_drivers() {
    run_case(false, false);
    run_case(true, false);
}
