//! `h2::set_huffman_encoding` (the h2 patch, vendor/README.md): off, as the `sluice` binary
//! runs, header strings cross the wire as raw literals; on, as upstream, Huffman-coded. Either
//! way both ends decode what was sent. Its own test binary: the switch is process-wide.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::block_on;
use common::echo::{echo, start_echo_server};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sluice_grpc::transport::{connect, H2Settings};

/// Bytes that crossed a relay, each direction apart.
#[derive(Default)]
struct Tapped {
    to_server: Mutex<Vec<u8>>,
    to_client: Mutex<Vec<u8>>,
}

/// Copies `from` into `to`, recording what passes before it passes.
fn pump(mut from: TcpStream, mut to: TcpStream, tapped: Arc<Tapped>, to_server: bool) {
    let mut buffer = [0u8; 16 * 1024];
    let record = if to_server {
        &tapped.to_server
    } else {
        &tapped.to_client
    };
    while let Ok(read) = from.read(&mut buffer) {
        if read == 0 {
            break;
        }
        // Recorded before forwarding: once the peer has the bytes, the test may look at them.
        record.lock().unwrap().extend_from_slice(&buffer[..read]);
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// A relay in front of `server` for one connection, and what it saw.
fn tap(server: SocketAddr) -> (SocketAddr, Arc<Tapped>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let tapped = Arc::new(Tapped::default());
    let record = tapped.clone();
    std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let upstream = TcpStream::connect(server).unwrap();
        let (client_read, upstream_read) =
            (client.try_clone().unwrap(), upstream.try_clone().unwrap());
        let back = record.clone();
        std::thread::spawn(move || pump(upstream_read, client, back, false));
        pump(client_read, upstream, record, true);
    });
    (address, tapped)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// One request through a tap with the switch at `huffman`, both ends on the driver `legacy`
/// names; returns what the tap saw.
fn request_through_tap(legacy: bool, huffman: bool, authority: &str, path: &str) -> Arc<Tapped> {
    h2::set_huffman_encoding(huffman);
    let server = start_echo_server(legacy, None);
    let (relay, tapped) = tap(server);
    block_on(legacy, async {
        let connection = connect(relay, None, &H2Settings::default()).await.unwrap();
        let decoded = echo(&connection, authority, path).await;
        assert_eq!(decoded, (authority.to_string(), path.to_string()));
    });
    tapped
}

#[test]
fn header_strings_go_raw_when_huffman_is_off_and_decode_either_way() {
    let authority = "raw-literal-probe.example:8443";
    let path = "/api/v1/namespaces/raw-literal-probe/pods";

    // The encoder does not depend on the I/O driver; both run so neither path can bypass it.
    for legacy in [false, true] {
        let tapped = request_through_tap(legacy, false, authority, path);
        assert!(
            contains(&tapped.to_server.lock().unwrap(), path),
            "the request's path, raw"
        );
        // The echo server answers with the decoded path as a header value, raw as well.
        assert!(
            contains(&tapped.to_client.lock().unwrap(), path),
            "the answer's header, raw"
        );

        let tapped = request_through_tap(legacy, true, authority, path);
        assert!(
            !contains(&tapped.to_server.lock().unwrap(), path),
            "Huffman-coded"
        );
        assert!(
            !contains(&tapped.to_client.lock().unwrap(), path),
            "Huffman-coded"
        );
    }
}
