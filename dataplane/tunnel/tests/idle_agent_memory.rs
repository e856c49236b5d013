//! What an idle agent holds on the node's heap (issue 36: 100,000 idle agents per node, 3 KiB
//! each, is the goal). A node on real sockets, agents each on an HTTP/2 connection of its own
//! with its own token, one Connect stream each (the Descriptor a kas agent sends), then quiet;
//! every block the node's worker threads allocated while they connected and still hold is
//! counted and charged to the crate and frame that allocated it (`--nocapture` prints the
//! largest).
//!
//! The bound asserted holds the agent connection task's claim (`node/endpoints/`,
//! `sluice_grpc::serve`): its future keeps no handshake, lingering or timer state beside the
//! serving loop's, and the h2 patch's (vendor/README.md): no codec buffer, no HPACK decoding
//! scratch and no spare stream or frame slots while quiet.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{agent_tokens, block_on, descriptor, start_node_marking, token_of};
use http::Request;
use sluice_grpc::transport::{connect, H2Settings};
use sluice_runtime::Driver;
use sluice_tunnel::protocol::CONNECT_PATH;
use test_support::heap_profile::{self, LiveBlocks};

#[global_allocator]
static GLOBAL: LiveBlocks = LiveBlocks;

/// Agents connected first, so that what every connection shares has grown before tracking.
const WARM: i64 = 20;
/// Agents tracked.
const IDLE: i64 = 200;
/// Live heap per idle agent asserted, by driver: 9,976-10,102 B on io_uring after the 3 s wait
/// (2026-12-01; 9.9-10.6 KB, once 10,515 B in CI, with the 1.5 s wait before, when some
/// agents had not reached their quiet moment yet) and 12.4-17.7 KB on the legacy driver, by
/// how many agents keep their read buffer. The io_uring bound, 11,000 B, is still crossed by
/// any codec buffer (8 or 16 KiB) or the handshake's state (1.9 KB) held again; 13.2 and 20.4 KB while h2 kept the frame slots and the stream
/// slot room its Connect stream grew; 17.1 and 21.6 KB while h2 kept its 4 KiB HPACK decoding
/// scratch too; 23.8 KB on io_uring while the connection's task kept its handshake's,
/// lingering's and timers' states inline. On the legacy driver about half the connections
/// still hold their 8 KiB read buffer: a frame split from it was alive at their last read,
/// and nothing reads again until the next keepalive (not analysed further).
fn bound(driver: Driver) -> f64 {
    match driver {
        Driver::Legacy => 23_000.0,
        _ => 11_000.0,
    }
}

/// Connects [`WARM`] and then, tracked, [`IDLE`] agents; what the tracked ones hold each once
/// quiet, and by site.
fn idle_agents(driver: Driver) -> (f64, Vec<(String, f64, f64)>) {
    let ids: Vec<i64> = (1..=WARM + IDLE).collect();
    let node = start_node_marking(driver, agent_tokens(&ids), heap_profile::mark_this_thread);
    let agent_endpoint = node.agent;
    let blocks = block_on(async move {
        let mut kept = Vec::new();
        for id in 1..=WARM + IDLE {
            if id == WARM + 1 {
                monoio::time::sleep(Duration::from_millis(300)).await;
                heap_profile::start();
            }
            let connection = connect(agent_endpoint, None, &H2Settings::default())
                .await
                .unwrap();
            let mut ready = connection.send_request.clone().ready().await.unwrap();
            let request = Request::post(format!("http://node{CONNECT_PATH}"))
                .header("content-type", "application/grpc")
                .header("authorization", format!("Bearer {}", token_of(id)))
                .body(())
                .unwrap();
            let (response, mut send) = ready.send_request(request, false).unwrap();
            send.send_data(descriptor(), false).unwrap();
            kept.push((connection, response, send));
        }
        // Every tunnel is parked once its Descriptor is read; the node answers nothing more.
        // 3 s is past two idle checks (every 1.25 s here) after the last agent's handshake, the
        // quiet moment at which h2 hands back a connection's spare room: at 1.5 s only the
        // agents connected first had reached it, and the figure moved by 650 B between runs.
        monoio::time::sleep(Duration::from_millis(3_000)).await;
        let blocks = heap_profile::stop();
        drop(kept);
        blocks
    });
    drop(node);
    heap_profile::per_thing(&blocks, IDLE as usize)
}

#[test]
fn an_idle_agent_holds_no_codec_buffer_or_finished_state_on_either_driver() {
    for driver in [Driver::IoUring, Driver::Legacy] {
        let (per_agent, sites) = idle_agents(driver);
        heap_profile::print(&driver.to_string(), "idle agent", per_agent, &sites);
        assert!(
            per_agent < bound(driver),
            "{driver}: {per_agent:.0} bytes of heap per idle agent: a codec buffer or a finished state held again?"
        );
    }
}
