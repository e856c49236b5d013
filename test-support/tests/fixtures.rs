//! The fixtures themselves work against the real things.

use std::time::Duration;

use test_support::{wait_until, Certificates, RedisServer};

#[test]
fn redis_server_answers_over_tcp_and_unix_socket_and_stops_on_drop() {
    let redis = RedisServer::start().expect("redis-server starts (scripts/test.sh installs it)");
    redis.ping().expect("PING over the unix socket");
    assert_eq!(redis.command(&["SET", "k", "v"]).unwrap(), "+OK\r\n");
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$1\r\nv\r\n");
    // The TCP port answers too.
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(redis.address).expect("tcp connect");
    tcp.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = [0u8; 7];
    tcp.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
    // No persistence configured.
    assert!(redis
        .command(&["CONFIG", "GET", "save"])
        .unwrap()
        .contains("$0\r\n"));
    let address = redis.address;
    drop(redis);
    assert!(wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(address).is_err()
    }));
}

#[test]
fn certificates_chain_to_their_ca() {
    let certs = Certificates::generate(&["api.example.test"]).expect("certificates");
    let client = certs.client("alice", &["dev", "ops"]).expect("client cert");
    for path in [
        &certs.ca_cert,
        &certs.server_cert,
        &certs.server_key,
        &client.cert,
        &client.key,
    ] {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.starts_with("-----BEGIN"), "{}", path.display());
    }
    // openssl, a verifier nobody here wrote, accepts both leaf certificates against the CA.
    for leaf in [&certs.server_cert, &client.cert] {
        let output = std::process::Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(&certs.ca_cert)
            .arg(leaf)
            .output()
            .expect("openssl is installed");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    let subject = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&client.cert)
        .output()
        .unwrap();
    let subject = String::from_utf8_lossy(&subject.stdout);
    assert!(
        subject.contains("CN = alice")
            && subject.contains("O = dev")
            && subject.contains("O = ops"),
        "{subject}"
    );
}
