//! A stream handler that panics ends that stream only: its task is contained (counted in
//! `sluice_task_panics_total{task="grpc-stream"}`), the connection and the runtime go on. Before,
//! the panic unwound through the runtime and took the worker thread with it.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use sluice_grpc::transport::{compat, connect, serve, H2Settings};

#[test]
fn a_panicking_stream_task_ends_its_stream_not_the_server() {
    for legacy in [false, true] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address: SocketAddr = listener.local_addr().unwrap();
        let before = sluice_runtime::task_panics_of("grpc-stream");
        let server = std::thread::spawn(move || {
            block_on(legacy, async move {
                let listener = monoio::net::TcpListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let _ = serve(
                    compat(stream).unwrap(),
                    &H2Settings::default(),
                    std::future::pending(),
                    |request: Request<h2::RecvStream>, mut respond| async move {
                        assert!(
                            request.uri().path() != "/panic",
                            "a bug in a stream handler"
                        );
                        let _ = respond.send_response(Response::new(()), true);
                    },
                )
                .await;
            })
        });
        block_on(legacy, async move {
            let connection = connect(address, None, &H2Settings::default())
                .await
                .unwrap();
            let send = |path: &'static str| {
                let connection = &connection;
                async move {
                    let mut ready = connection.ready().await.unwrap();
                    let request = Request::post(format!("http://node{path}"))
                        .body(())
                        .unwrap();
                    let (response, _) = ready.send_request(request, true).unwrap();
                    monoio::time::timeout(Duration::from_secs(5), response).await
                }
            };
            // The panicking stream is reset (its handle dropped without a response).
            let panicked = send("/panic").await.expect("answered, not hung");
            assert!(panicked.is_err(), "legacy={legacy}: {panicked:?}");
            let fine = send("/ok").await.expect("the server still answers");
            assert_eq!(fine.unwrap().status(), 200, "legacy={legacy}");
        });
        assert_eq!(
            sluice_runtime::task_panics_of("grpc-stream"),
            before + 1,
            "legacy={legacy}"
        );
        drop(server);
    }
}
