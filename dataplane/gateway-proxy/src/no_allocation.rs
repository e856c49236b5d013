//! The gateway's own phases allocate nothing per request in steady state (config loaded, token
//! cached, counters and cursors seen once): every phase `GatewayHandler::serve` runs between
//! the request head and the response head, re-enacted here without sockets and counted by a
//! global allocator around them, so a regression shows which phase it is in. Outside this
//! count: h2's own work (stream state, HPACK, the response head map it decodes) and the request
//! head it takes by value, counted apart with a stated bound in
//! `the_upstream_request_head_allocates_only_what_h2_takes`. The whole path as it runs (the
//! listener, TLS, hyper, `serve`, `forward`, h2 both ways) is counted per request by
//! `tests/request_allocations.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use http::{HeaderMap, HeaderValue, Request};
use sluice_gateway::flow_control::CoreShare;
use sluice_gateway::identity::UserInfo;
use test_support::thread_allocations::{counted, uncounted, HookedAllocator, THREAD_ALLOCATIONS};

use crate::handler::{
    decoded_path, request_info, request_labels, resource_label, ClientConnection, GatewayHandler,
};
use crate::headers::{response_headers, upstream_headers, upstream_request};
use crate::metrics::GatewayMetrics;
use crate::state::Gateway;

#[global_allocator]
static GLOBAL: HookedAllocator = THREAD_ALLOCATIONS;

/// Runs a future that must not wait (every answer it needs is cached).
fn ready<T>(future: impl Future<Output = T>) -> T {
    let mut context = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut context) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the request waited: something was not cached"),
    }
}

const CLUSTER: &str = "cluster-a.example.com";

/// A gateway serving one cluster with two servers, two dispatch policies (one with a subset) and
/// anonymous access, plus the temporary directory its files live in.
fn gateway() -> (Arc<Gateway>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
    let (cert, key) = (cert.display(), key.display());
    let yaml = format!(
        "apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata:
  name: {CLUSTER}
spec:
  servers:
  - endpoint: https://10.0.0.1:6443
  - endpoint: https://10.0.0.2:6443
  clientConfig: {{caFile: {cert}, certFile: {cert}, keyFile: {key}}}
  secureServing: {{certFile: {cert}, keyFile: {key}}}
  authentication: {{allowAnonymous: true}}
  flowControl:
    schemas:
    - name: writes
      maxRequestsInflight: {{max: 100}}
  dispatchPolicies:
  - name: controllers
    upstreamSubset: [https://10.0.0.2:6443]
    rules:
    - verbs: [\"*\"]
      apiGroups: [\"*\"]
      resources: [\"*\"]
      userGroups: [system:controllers]
  - name: everyone
    flowControlSchemaName: writes
    rules:
    - verbs: [\"*\"]
      apiGroups: [\"*\"]
      resources: [\"*\"]
    - verbs: [get]
      nonResourceURLs: [/healthz, /version]
"
    );
    std::fs::write(dir.path().join("cluster.yaml"), yaml).unwrap();
    let metrics =
        GatewayMetrics::register(&mut prometheus_client::registry::Registry::default(), 1);
    (Gateway::load(dir.path(), metrics).unwrap(), dir)
}

fn client(certificate_user: Option<std::rc::Rc<UserInfo>>) -> ClientConnection {
    ClientConnection {
        cluster: CLUSTER.into(),
        peer: IpAddr::V4(Ipv4Addr::LOCALHOST),
        certificate_user,
    }
}

/// What an apiserver answers: a few end-to-end headers and one hop-by-hop header.
fn upstream_response_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("audit-id", HeaderValue::from_static("0c5e1b6e"));
    headers.insert("connection", HeaderValue::from_static("keep-alive"));
    headers
}

/// Every phase `serve` runs for one request, in its order, without the h2 exchange: request
/// info, authentication, dispatch, flow control, upstream pick, the response head's headers and
/// the request counter. Returns the response status the counter was labelled with.
fn one_request(
    handler: &GatewayHandler,
    client: &ClientConnection,
    request: &Request<()>,
    upstream: &HeaderMap,
) -> u16 {
    let started = Instant::now();
    let generation = handler.gateway.current();
    let (method, path) = (request.method(), request.uri().path());
    let decoded = decoded_path(path);
    let info = request_info(
        method.as_str(),
        &decoded,
        request.uri().query().unwrap_or(""),
    );
    let (verb, resource) = request_labels(&info);
    let info = info.unwrap();
    let note = crate::access::AccessNote::default();
    let admitted = ready(handler.admit(client, &generation, &info, (request.headers(), &note)));
    let resource = resource_label(resource, admitted.as_ref().err());
    let admitted = admitted.unwrap();
    // h2 decodes the upstream's head into a map it hands over: made outside the count.
    let headers = response_headers(uncounted(|| upstream.clone()));
    assert!(!headers.contains_key("connection"));
    drop((admitted, headers));
    handler.finish(&client.cluster, (verb, resource), 200, started);
    200
}

fn requests() -> Vec<Request<()>> {
    let get = |uri: &str, authorization: Option<&'static str>| {
        let mut builder = Request::get(uri);
        if let Some(authorization) = authorization {
            builder = builder.header("authorization", authorization);
        }
        builder.body(()).unwrap()
    };
    vec![
        get("/api/v1/namespaces/default/pods?limit=500", None),
        get("/api/v1/namespaces/default/pods/web/log?follow=true", None),
        get(
            "/apis/apps/v1/namespaces/a/deployments",
            Some("Bearer cached-token"),
        ),
        get("/healthz", Some("Bearer cached-token")),
        Request::post("/apis/apps/v1/namespaces/a/deployments?dryRun=All")
            .body(())
            .unwrap(),
    ]
}

#[test]
fn the_request_path_allocates_nothing_in_steady_state() {
    let (gateway, _dir) = gateway();
    let handler = GatewayHandler::new(gateway, 0, CoreShare::SINGLE);
    let generation = handler.gateway.current();
    handler.auth.remember_token(
        &generation,
        0,
        "cached-token",
        UserInfo::new("alice", &["dev", "system:authenticated"]),
    );
    let clients = [
        client(None),
        client(Some(UserInfo::new("kcm", &["system:controllers"]).into())),
    ];
    let requests = requests();
    let upstream = upstream_response_headers();
    let run = |rounds: usize| {
        for _ in 0..rounds {
            for client in &clients {
                for request in &requests {
                    one_request(&handler, client, request, &upstream);
                }
            }
        }
    };
    // Warm-up: each label set's counter, each (cluster, policy) cursor and the flow-control
    // state are made once per core.
    run(2);
    let rounds = 50;
    let ((), allocations) = counted(|| run(rounds));
    let per_request = allocations as f64 / (rounds * clients.len() * requests.len()) as f64;
    println!("allocations per request: {per_request}");
    assert_eq!(allocations, 0, "{per_request} allocations per request");

    // The one stated exception: a path with percent-escapes is decoded into its own string
    // (the copy the apiserver's view of the path needs; kubectl escapes nothing in ordinary
    // names, so it is rare), which allocates and grows once.
    let escaped = Request::get("/api/v1/namespaces/a/config%6Daps")
        .body(())
        .unwrap();
    one_request(&handler, &clients[0], &escaped, &upstream);
    let (_, allocations) = counted(|| one_request(&handler, &clients[0], &escaped, &upstream));
    assert!(
        allocations <= 2,
        "{allocations} allocations for an escaped path"
    );
}

/// The upstream pool's lookup of a server's connections (the part of `CorePool::stream` that
/// runs before a connection is chosen) once the server has been seen on this core.
#[test]
fn the_upstream_pool_lookup_allocates_nothing_once_the_server_is_known() {
    let (gateway, _dir) = gateway();
    let handler = GatewayHandler::new(gateway, 0, CoreShare::SINGLE);
    let generation = handler.gateway.current();
    let cluster = &generation.snapshot.clusters()[0];
    let tls = &generation.clusters[0].client_tls;
    for server in &cluster.servers {
        handler.pool.server(&cluster.name, server, tls);
    }
    let rounds = 100;
    let ((), allocations) = counted(|| {
        for _ in 0..rounds {
            for server in &cluster.servers {
                drop(handler.pool.server(&cluster.name, server, tls));
            }
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {rounds} rounds"
    );
}

/// The request head handed to h2 (`send_request` takes it by value, so it is built per request):
/// counted apart from the rest of the path and held to a stated bound.
#[test]
fn the_upstream_request_head_allocates_only_what_h2_takes() {
    let (gateway, _dir) = gateway();
    let generation = gateway.current();
    let server = &generation.snapshot.clusters()[0].servers[0];
    let user = UserInfo::new("alice", &["dev", "system:authenticated"]);
    let (parts, ()) = Request::get("/api/v1/namespaces/default/pods?limit=500")
        .header("accept", "application/json")
        .header("authorization", "Bearer client-token")
        .body(())
        .unwrap()
        .into_parts();
    let head = || {
        let headers = upstream_headers(&parts.headers, &user, None).unwrap();
        upstream_request(&parts, server, headers).unwrap()
    };
    drop(head());
    let rounds = 100;
    let ((), allocations) = counted(|| {
        for _ in 0..rounds {
            drop(head());
        }
    });
    let per_request = allocations as f64 / rounds as f64;
    println!("upstream head allocations per request: {per_request}");
    // What remains is the head h2 takes by value: the new header map (its index and entry
    // tables, grown once for this head's size: 3) and the Impersonate-* values copied out of the
    // user (the user and its two groups here: 1 + groups). The URI shares the client's parsed
    // path and the server's parsed authority.
    assert!(
        per_request <= 6.0,
        "{per_request} allocations per upstream head"
    );
}

/// A client request's fair turn for a stream (`turns.rs`) when a stream is free, and its
/// release when the response ends: only a request that must wait allocates (its turn, a timer).
#[test]
fn an_uncontended_fair_turn_allocates_nothing() {
    let (gateway, _dir) = gateway();
    let handler = GatewayHandler::new(gateway, 0, CoreShare::SINGLE);
    let generation = handler.gateway.current();
    let cluster = &generation.snapshot.clusters()[0];
    let tls = &generation.clusters[0].client_tls;
    let server = handler.pool.server(&cluster.name, &cluster.servers[0], tls);
    let limits = sluice_gateway::fair_share::StreamLimits {
        capacity: 4,
        long_running_percent: 50,
        max_queued_per_user: 4,
        max_queued: 8,
    };
    server
        .streams
        .borrow_mut()
        .set_limits(limits, crate::turns::grant);
    let turn = |long_running| crate::turns::ClientTurn {
        user: "alice",
        long_running,
        level: None,
    };
    let rounds = 100;
    let ((), allocations) = counted(|| {
        for round in 0..rounds {
            let asked = crate::turns::ask_turn(&server.streams, turn(round % 2 == 0));
            assert!(matches!(asked, Ok(crate::turns::Asked::Held(_))));
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {rounds} rounds"
    );
    assert_eq!(
        server.streams.borrow().in_use(),
        0,
        "every turn was released"
    );
}
