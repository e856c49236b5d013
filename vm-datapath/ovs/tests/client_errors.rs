//! Failure paths of the OpenFlow client: timeouts with clear errors, and a switch that does not
//! speak OpenFlow at all.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sluice_ovs::{ClientConfig, ClientError, OpenFlowClient, OvsdbClient};
use test_support::{unique_name, OvsInstance};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_silent_peer_fails_the_handshake_with_a_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.mgmt");
    runtime().block_on(async {
        // Accepts and reads, never answers.
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let config = ClientConfig {
            connect_timeout: Duration::from_millis(300),
            ..ClientConfig::default()
        };
        let started = Instant::now();
        let error = OpenFlowClient::connect(&path, config).await.err().unwrap();
        assert!(
            matches!(error, ClientError::HandshakeTimeout { .. }),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(
            error.to_string(),
            format!(
                "no OpenFlow handshake with {} within 300ms (is it a bridge's .mgmt socket?)",
                path.display()
            )
        );
    });
}

#[test]
fn a_peer_speaking_garbage_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.mgmt");
    runtime().block_on(async {
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                // An OpenFlow 1.0-only hello: no common version.
                let _ = stream.write_all(&[1, 0, 0, 8, 0, 0, 0, 1]).await;
                // Not a synchronisation: the peer keeps the connection open, so the client
                // refuses on the hello's version, not on a closed socket.
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        let error = OpenFlowClient::connect(&path, ClientConfig::default())
            .await
            .err()
            .unwrap();
        assert!(matches!(error, ClientError::Incompatible { .. }), "{error}");
    });
}

#[test]
fn a_stopped_switch_times_out_requests_and_recovers_after() {
    let ovs = OvsInstance::start().unwrap();
    let pid = i32::try_from(ovs.vswitchd_pid().unwrap()).unwrap();
    runtime().block_on(async {
        let bridge = unique_name("br");
        OvsdbClient::connect(ovs.db_socket(), Duration::from_secs(20))
            .await
            .unwrap()
            .create_bridge(&bridge)
            .await
            .unwrap();
        let config = ClientConfig {
            request_timeout: Duration::from_millis(500),
            ..ClientConfig::default()
        };
        let client = OpenFlowClient::connect(ovs.mgmt_socket(&bridge), config)
            .await
            .unwrap();
        client.barrier().await.unwrap();

        // SAFETY: signals to the ovs-vswitchd child this test's fixture started.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let error = client.barrier().await.unwrap_err();
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        assert!(
            matches!(
                error,
                ClientError::Timeout {
                    request: "BARRIER_REQUEST",
                    ..
                }
            ),
            "{error}"
        );
        assert!(
            error.to_string().contains("got no reply within 500ms"),
            "{error}"
        );

        // The late reply to the abandoned barrier is dropped; new requests work.
        client.barrier().await.unwrap();
        assert!(client.flow_stats(0, 0).await.unwrap().is_empty());
    });
}

/// Reads one OpenFlow message from a raw socket.
async fn read_raw(stream: &mut tokio::net::UnixStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await.unwrap();
    let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let mut message = header.to_vec();
    message.resize(len, 0);
    stream.read_exact(&mut message[8..]).await.unwrap();
    message
}

/// OVS never sends echo requests on demand, so a scripted peer plays the switch's side of the
/// handshake and then asks for an echo.
#[test]
fn echo_requests_from_the_switch_are_answered() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scripted.mgmt");
    runtime().block_on(async {
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let switch = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let hello = read_raw(&mut stream).await;
            assert_eq!(hello[1], 0, "hello first");
            // Hello offering 1.3 and 1.4 through a version bitmap.
            stream
                .write_all(&[5, 0, 0, 16, 0, 0, 0, 1, 0, 1, 0, 8, 0, 0, 0, 0x30])
                .await
                .unwrap();
            loop {
                let request = read_raw(&mut stream).await;
                let xid = &request[4..8];
                match request[1] {
                    5 => {
                        let mut reply = vec![5, 6, 0, 32];
                        reply.extend_from_slice(xid);
                        reply.extend_from_slice(&[0; 24]);
                        stream.write_all(&reply).await.unwrap();
                    }
                    20 => {
                        let mut reply = vec![5, 21, 0, 8];
                        reply.extend_from_slice(xid);
                        stream.write_all(&reply).await.unwrap();
                        break;
                    }
                    _ => {} // packet-in format, async config
                }
            }
            stream
                .write_all(&[5, 2, 0, 12, 0xaa, 0xbb, 0xcc, 0xdd, 1, 2, 3, 4])
                .await
                .unwrap();
            // The stream goes back with the reply: closed here, it could end the client's
            // connection before the test reads the negotiated version.
            (read_raw(&mut stream).await, stream)
        });
        let client = OpenFlowClient::connect(&path, ClientConfig::default())
            .await
            .unwrap();
        assert_eq!(client.version().unwrap(), sluice_openflow::OFP14);
        let echo_reply = tokio::time::timeout(Duration::from_secs(5), switch)
            .await
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(
            echo_reply,
            [5, 3, 0, 12, 0xaa, 0xbb, 0xcc, 0xdd, 1, 2, 3, 4]
        );
    });
}
