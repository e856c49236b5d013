//! The per-request phases (host lookup, request info, dispatch, flow control, including a
//! rejection) allocate nothing: counted by a global allocator around them.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Instant;

use sluice_gateway::cluster::{parse_clusters, GatewaySnapshot};
use sluice_gateway::flow_control::{CoreFlowControl, CoreShare};
use sluice_gateway::identity::UserInfo;
use sluice_gateway::request_info::RequestInfo;
use test_support::thread_allocations::{counted, HookedAllocator, THREAD_ALLOCATIONS};

// Counts this test's thread only: a count of every thread's allocations also took the test
// harness's own (4 of them failed a clean-clone CI run, 2026-12-01).
#[global_allocator]
static GLOBAL: HookedAllocator = THREAD_ALLOCATIONS;

#[test]
fn per_request_phases_do_not_allocate() {
    let text = include_str!("fixtures/cluster.yaml");
    let snapshot =
        GatewaySnapshot::compile(parse_clusters(text, Path::new("cluster.yaml")).unwrap()).unwrap();
    let flow = CoreFlowControl::new(
        &snapshot.clusters()[0].schemas,
        sluice_gateway::fair_share::LongRunningLimits {
            per_user: 100,
            upgrades: 100,
        },
        CoreShare::SINGLE,
        None,
    );
    let alice = std::rc::Rc::new(UserInfo::new("alice", &["dev", "system:authenticated"]));
    let controller = std::rc::Rc::new(UserInfo::new("kcm", &["system:controllers"]));
    let requests = [
        (
            "GET",
            "/api/v1/namespaces/default/pods",
            "watch=true&resourceVersion=10",
            &alice,
            "reads",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web/log",
            "follow=true",
            &alice,
            "reads",
        ),
        (
            "GET",
            "/api/v1/pods",
            "fieldSelector=metadata.name=web&limit=500",
            &alice,
            "reads",
        ),
        (
            "POST",
            "/apis/apps/v1/namespaces/a/deployments",
            "",
            &alice,
            "writes",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/a/configmaps",
            "",
            &alice,
            "writes",
        ),
        ("GET", "/healthz/etcd", "", &alice, "writes"),
        (
            "PUT",
            "/api/v1/namespaces/a/pods/x/status",
            "",
            &controller,
            "controllers",
        ),
    ];
    let now = Instant::now();
    let mut admitted = 0;
    let mut rejected = 0;
    // A user's first long-running request makes the user's entry in the per-user long-running
    // budget; it stays while the user is idle (see `fair_share.rs`), so later ones allocate
    // nothing.
    drop(flow.admit(None, true, &alice, now));
    let ((), allocations) = counted(|| {
        for _ in 0..10 {
            for (method, path, query, user, expected) in &requests {
                let (_, cluster) = snapshot
                    .cluster_for_host("Cluster-A.example.com:443")
                    .unwrap();
                let info = RequestInfo::parse(method, path, query).unwrap();
                let policy = cluster.dispatch.dispatch(&info, user).unwrap();
                assert_eq!(&*policy.name, *expected);
                match flow.admit(
                    policy.flow_control_schema,
                    info.is_long_running(),
                    user,
                    now,
                ) {
                    Ok(permit) => {
                        admitted += 1;
                        drop(permit);
                    }
                    Err(error) => {
                        rejected += 1;
                        assert_eq!(error.http_status(), 429);
                    }
                }
            }
        }
    });
    assert_eq!(allocations, 0);
    // the token bucket (burst 5, no time passing) rejected some reads: the rejection path is
    // covered too
    assert!(
        rejected > 0 && admitted > 0,
        "{admitted} admitted, {rejected} rejected"
    );
}
