//! Connections whose buffers went back to a pool when they went quiet still work right.
//!
//! The h2 and rustls patches (vendor/README.md) hand a quiet connection's read and write
//! buffers, HPACK decoding scratch and TLS read buffer back to per-thread pools; before the
//! scratch goes, the dynamic table's newest pseudo-header values (slices of it, or of the frame
//! they came in) are copied into allocations of their own. Here two connections on one server
//! thread take turns, with a pause after every request so that each read waits (a quiet
//! moment) and the pooled buffers move between them; every `:authority` after the first of its
//! kind is sent as a dynamic-table index, so the server decodes it from the table entry that
//! was copied, and the server echoes what it decoded. Cleartext and TLS, both drivers.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;
use common::echo::{echo, start_echo_server};

use std::net::SocketAddr;
use std::time::Duration;

use rustls::pki_types::ServerName;
use sluice_grpc::tls;
use sluice_grpc::transport::{connect, H2Settings};
use test_support::Certificates;

/// Requests per connection; authorities repeat so that most are sent by index.
const REQUESTS: usize = 24;
const AUTHORITIES: usize = 3;

/// A long authority, so that its Huffman code is several bytes and differs between names.
fn authority(index: usize, address: SocketAddr) -> String {
    format!(
        "service-{index}.namespace-with-a-long-name.svc.cluster.local:{}",
        address.port()
    )
}

fn run(legacy: bool, use_tls: bool) {
    let certs = Certificates::generate(&[]).unwrap();
    let server_tls =
        use_tls.then(|| tls::server_config(&certs.server_cert, &certs.server_key, None).unwrap());
    let client_tls = tls::client_config(Some(&certs.ca_cert), None).unwrap();
    let address = start_echo_server(legacy, server_tls);
    block_on(legacy, async move {
        let settings = H2Settings::default();
        let tls = || {
            use_tls.then(|| {
                let name = ServerName::try_from("localhost").unwrap();
                (client_tls.clone(), name)
            })
        };
        let connections = [
            connect(address, tls(), &settings).await.unwrap(),
            connect(address, tls(), &settings).await.unwrap(),
        ];
        for request in 0..REQUESTS {
            for (side, connection) in connections.iter().enumerate() {
                let authority = authority((request + side) % AUTHORITIES, address);
                let path = format!("/connection-{side}/request-{request}");
                let decoded = echo(connection, &authority, &path).await;
                assert_eq!(
                    decoded,
                    (authority, path),
                    "request {request} on connection {side}, legacy driver: {legacy}, TLS: {use_tls}"
                );
                // Long enough for the server's read to wait: a quiet moment on each request.
                monoio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    });
}

#[test]
fn indexed_authorities_survive_quiet_moments_on_io_uring() {
    run(false, false);
}

#[test]
fn indexed_authorities_survive_quiet_moments_on_the_legacy_driver() {
    run(true, false);
}

#[test]
fn tls_connections_survive_quiet_moments_on_io_uring() {
    run(false, true);
}

#[test]
fn tls_connections_survive_quiet_moments_on_the_legacy_driver() {
    run(true, true);
}
