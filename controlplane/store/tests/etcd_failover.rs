//! A write whose answer is lost is checked, not repeated: the store's first member is reached
//! through a relay that can swallow etcd's answers (the request lands, the answer never comes),
//! the second directly. Each write's first attempt lands through the relay and times out; its
//! next attempt, on the other member, finds the write applied and reports it done, applied
//! once; a create that finds someone else's value is still refused.
//! Built with the `etcd` feature only (scripts/test.sh enables it).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_store::{EtcdConfig, EtcdOp, EtcdStore, Store, StoreError};
use test_support::{etcd_or_skip, EtcdServer};

/// A TCP relay to `target` that drops everything the target sends while `mute` is set.
struct Relay {
    address: SocketAddr,
    mute: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let mute = Arc::new(AtomicBool::new(false));
        let muted = mute.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let (client_in, server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(client_in, server_out, None));
                let muted = muted.clone();
                std::thread::spawn(move || pipe(server, client, Some(muted)));
            }
        });
        Relay { address, mute }
    }
}

/// Copies `from` to `to` until either closes; while `mute` is set what is read is dropped.
fn pipe(mut from: TcpStream, mut to: TcpStream, mute: Option<Arc<AtomicBool>>) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if mute
            .as_ref()
            .is_some_and(|mute| mute.load(Ordering::Acquire))
        {
            continue;
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn value(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// A store whose first member is the relay (preferred first) and second the member itself,
/// with a connection through the relay already open; then the relay goes mute.
async fn store_through(relay: &Relay, direct: &str) -> EtcdStore {
    relay.mute.store(false, Ordering::Release);
    let store = EtcdStore::connect(EtcdConfig {
        endpoints: vec![format!("http://{}", relay.address), direct.to_owned()],
        request_timeout: Duration::from_secs(5),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    store.get("/warm").await.unwrap();
    relay.mute.store(true, Ordering::Release);
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_is_found_applied_not_repeated() {
    if !etcd_or_skip("a_write_whose_answer_was_lost_is_found_applied_not_repeated") {
        return;
    }
    let etcd = EtcdServer::start().unwrap();
    let direct = etcd.endpoint();
    let target: SocketAddr = direct.trim_start_matches("http://").parse().unwrap();
    let relay = Relay::start(target);
    let check = EtcdStore::connect(EtcdConfig {
        endpoints: vec![direct.clone()],
        ..EtcdConfig::default()
    })
    .await
    .unwrap();

    // A create: applied by the lost attempt, reported done by the next, written once.
    let store = store_through(&relay, &direct).await;
    let before = check.current_revision().await.unwrap();
    let started = Instant::now();
    let created = store.create("/k", value("one")).await.unwrap();
    eprintln!("create with a lost answer took {:?}", started.elapsed());
    assert_eq!((created.value.clone(), created.version), (value("one"), 1));
    assert_eq!(
        check.current_revision().await.unwrap(),
        before + 1,
        "written once"
    );
    let stats = store.stats();
    assert_eq!(stats.found_applied(), 1);
    assert_eq!(stats.failovers(), 1);
    assert_eq!(stats.retries(EtcdOp::Write), 1);

    // An update at the created revision: the same.
    let store = store_through(&relay, &direct).await;
    let updated = store
        .update("/k", value("two"), Some(created.mod_revision))
        .await
        .unwrap();
    assert_eq!((updated.value.clone(), updated.version), (value("two"), 2));
    assert!(updated.mod_revision > created.mod_revision);
    assert_eq!(check.get("/k").await.unwrap().unwrap(), updated);
    assert_eq!(store.stats().found_applied(), 1);

    // A delete at the updated revision: reported with the state it deleted.
    let store = store_through(&relay, &direct).await;
    let deleted = store
        .delete("/k", Some(updated.mod_revision))
        .await
        .unwrap();
    assert_eq!(deleted, updated);
    assert_eq!(check.get("/k").await.unwrap(), None);
    assert_eq!(store.stats().found_applied(), 1);

    // A create of a key someone else holds is refused even after a lost answer: the key has
    // another value, so the lost attempt cannot have written it.
    check.create("/theirs", value("theirs")).await.unwrap();
    let store = store_through(&relay, &direct).await;
    match store.create("/theirs", value("ours")).await {
        Err(StoreError::AlreadyExists { key }) => assert_eq!(key, "/theirs"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(store.stats().found_applied(), 0);
    assert_eq!(store.stats().failovers(), 1);
    assert_eq!(
        check.get("/theirs").await.unwrap().unwrap().value,
        value("theirs")
    );
}
