//! A property test of `sluice status`'s reading of a node's `/metrics` (`view::parse`, then
//! `view::render`). Both live in the binary, which the fuzz workspace cannot link, so
//! fuzz/README.md points here: byte mutations of a real scrape (a seeded xorshift, so every run
//! is the same; proptest is not a dependency of this crate) are read without a panic, and
//! whatever parses renders as the header line, indented rows, and the panics row last.
#![allow(clippy::unwrap_used)]

use super::view::{parse, render};

const SCRAPE: &str = r#"# TYPE sluice_build_info gauge
sluice_build_info{version="0.1.0",driver="io_uring"} 1
# TYPE sluice_workers gauge
sluice_workers 2
sluice_connections_active{listener="agent"} 3
sluice_connections_accepted_total{listener="agent"} 10
sluice_tunnel_connected_agents 1
sluice_tunnel_connected_tunnels 4
sluice_tunnel_idle_tunnels 3
sluice_tunnel_requests_total{code="OK",method="m"} 7
sluice_gateway_upstream_healthy{cluster="prod",server="https://a"} 1
sluice_controlplane_watch_connected{resource="agents"} 0
sluice_ebpf_enabled 1
sluice_ebpf_attached_interfaces 2
# TYPE sluice_task_panics counter
sluice_task_panics_total{task="connection"} 0
# TYPE h histogram
h_bucket{le="0.5"} 1
h_sum 0.2
h_count 1
"#;

use crate::mutation::Rng;

/// Up to eight byte edits (replace, insert, delete) from the exposition format's alphabet.
fn mutate(rng: &mut Rng, text: &str) -> String {
    crate::mutation::mutate(rng, text, b"{}=\",# \n0123456789.-+eEaINfn_\\\xff", 8)
}

#[test]
fn mutated_scrapes_render_as_a_header_rows_and_the_panics_row() {
    let mut rng = Rng(0x0057_a705);
    let mut rendered = 0;
    for _ in 0..20_000 {
        let text = mutate(&mut rng, SCRAPE);
        let Ok(scrape) = parse(&text) else { continue };
        rendered += 1;
        let lines = render(&scrape, Some(200));
        assert!(lines[0].starts_with("Sluice "), "{text:?}: {lines:?}");
        assert!(
            lines[1..].iter().all(|line| line.starts_with("  ")),
            "{text:?}: {lines:?}"
        );
        assert!(
            lines.last().unwrap().starts_with("  panics "),
            "{text:?}: {lines:?}"
        );
    }
    // The mutations stay close enough to the format that most of them parse.
    assert!(rendered > 10_000, "only {rendered} of 20000 parsed");
}
