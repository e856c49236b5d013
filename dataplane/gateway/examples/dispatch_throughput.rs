//! Time of the per-request pure phases (host lookup, request info, dispatch, flow-control
//! admission) on one core, each alone and all together:
//! `cargo run --release -p sluice-gateway --example dispatch_throughput`.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use sluice_gateway::cluster::{parse_clusters, GatewaySnapshot};
use sluice_gateway::flow_control::{CoreFlowControl, CoreShare};
use sluice_gateway::identity::UserInfo;
use sluice_gateway::request_info::RequestInfo;

const ROUNDS: usize = 2_000_000;

fn measure(label: &str, mut step: impl FnMut(usize) -> bool) {
    let start = Instant::now();
    let mut hits = 0usize;
    for round in 0..ROUNDS {
        hits += usize::from(black_box(step(round)));
    }
    let nanos = start.elapsed().as_nanos() as f64 / ROUNDS as f64;
    println!("{label:<40} {nanos:>7.1} ns/request ({hits} of {ROUNDS} matched/admitted)");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let text = include_str!("../tests/fixtures/cluster.yaml");
    let snapshot = GatewaySnapshot::compile(parse_clusters(text, Path::new("cluster.yaml"))?)?;
    let cluster = &snapshot.clusters()[0];
    let flow = CoreFlowControl::new(
        &cluster.schemas,
        sluice_gateway::fair_share::LongRunningLimits {
            per_user: 100,
            upgrades: 100,
        },
        CoreShare::SINGLE,
        None,
    );
    let user = std::rc::Rc::new(UserInfo::new("alice", &["dev", "system:authenticated"]));
    let requests = [
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            "watch=true&resourceVersion=10",
        ),
        ("GET", "/api/v1/namespaces/default/pods/web", ""),
        ("POST", "/apis/apps/v1/namespaces/a/deployments", ""),
        ("GET", "/healthz", ""),
    ];
    let parsed: Vec<RequestInfo> = requests
        .iter()
        .filter_map(|(method, path, query)| RequestInfo::parse(method, path, query).ok())
        .collect();
    let now = Instant::now();

    measure("host lookup", |_| {
        snapshot
            .cluster_for_host(black_box("cluster-a.example.com"))
            .is_some()
    });
    measure("request info", |round| {
        let (method, path, query) = requests[round % requests.len()];
        RequestInfo::parse(black_box(method), black_box(path), black_box(query)).is_ok()
    });
    measure("dispatch", |round| {
        cluster
            .dispatch
            .dispatch(black_box(&parsed[round % parsed.len()]), &user)
            .is_some()
    });
    measure("flow control (inflight admit + release)", |_| {
        flow.admit(Some(0), false, &user, now).is_ok()
    });
    measure("all phases", |round| {
        let (method, path, query) = requests[round % requests.len()];
        let Some((_, cluster)) = snapshot.cluster_for_host("cluster-a.example.com") else {
            return false;
        };
        let Ok(info) = RequestInfo::parse(method, path, query) else {
            return false;
        };
        cluster
            .dispatch
            .dispatch(&info, &user)
            .is_some_and(|policy| {
                flow.admit(
                    policy.flow_control_schema,
                    info.is_long_running(),
                    &user,
                    now,
                )
                .is_ok()
            })
    });
    Ok(())
}
