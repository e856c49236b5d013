//! The partition fixture itself: a cut link is a silent black hole, a slowed link adds its delay.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use test_support::Network;

fn listen(network: &Network, host: &str) -> SocketAddr {
    let ip = network.host(host).ip;
    network.host(host).run(move || {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let address = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut copy = stream.try_clone().unwrap();
                    let _ = std::io::copy(&mut stream, &mut copy);
                });
            }
        });
        address
    })
}

/// Connect time (or the error) from `host` to `address`, within `timeout`.
fn connect(
    network: &Network,
    host: &str,
    address: SocketAddr,
    timeout: Duration,
) -> Result<Duration, String> {
    network.host(host).run(move || {
        let started = Instant::now();
        TcpStream::connect_timeout(&address, timeout)
            .map(|_| started.elapsed())
            .map_err(|error| format!("{:?}", error.kind()))
    })
}

#[test]
fn a_cut_link_swallows_packets_and_a_slowed_one_delays_them() {
    let mut network = Network::new(&["left", "right", "other"]).unwrap();
    let echo = listen(&network, "right");
    let fast = connect(&network, "left", echo, Duration::from_secs(5)).unwrap();
    assert!(fast < Duration::from_millis(100), "{fast:?}");

    network.cut("left", "right").unwrap();
    // A black hole: no RST, no ICMP; the connect times out. Other links are untouched.
    assert_eq!(
        connect(&network, "left", echo, Duration::from_millis(700)),
        Err("TimedOut".into())
    );
    assert!(connect(&network, "other", echo, Duration::from_secs(5)).is_ok());
    network.heal("left", "right").unwrap();
    assert!(connect(&network, "left", echo, Duration::from_secs(5)).is_ok());

    network
        .slow("left", "right", Duration::from_millis(100), 0.0)
        .unwrap();
    // SYN there and SYN-ACK back: two delayed packets.
    let slow = connect(&network, "left", echo, Duration::from_secs(5)).unwrap();
    assert!(slow >= Duration::from_millis(200), "{slow:?}");
    let unslowed = connect(&network, "other", echo, Duration::from_secs(5)).unwrap();
    assert!(unslowed < Duration::from_millis(150), "{unslowed:?}");
    let (forwarded, dropped) = network.relay().unwrap().counts();
    assert!(forwarded >= 2 && dropped == 0, "{forwarded} {dropped}");
}
