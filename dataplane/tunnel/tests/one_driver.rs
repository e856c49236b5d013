//! The tunnel's routing state machine has one driver: only `src/node/router.rs` makes a call's
//! `RouteState` and feeds it events, so the endpoints cannot drift apart in how a call is
//! routed (they once each carried a copy of the set-up loop). The pure decision itself lives in
//! `route.rs` and is unit-tested there.

use std::path::{Path, PathBuf};

/// The driver, the state machine, and the unit tests of both.
const ALLOWED: [&str; 4] = [
    "node/router.rs",
    "node/router_tests.rs",
    "node/route.rs",
    "node/route_tests.rs",
];

/// What holding, making or feeding a `RouteState` looks like in code (comments aside).
const DRIVING: [&str; 2] = ["RouteState", "next_step("];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{dir:?}: {error}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_router_makes_and_feeds_the_routing_state() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut driving = Vec::new();
    let mut seen_in_router = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let relative = relative.to_string_lossy().replace('\\', "/");
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|error| panic!("{file:?}: {error}"));
        for pattern in DRIVING {
            let uses = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("//") && line.contains(pattern))
                .count();
            if uses == 0 {
                continue;
            }
            if relative == "node/router.rs" {
                seen_in_router.push(pattern);
            } else if !ALLOWED.contains(&relative.as_str()) {
                driving.push(format!("{relative}: {pattern} ({uses}x)"));
            }
        }
    }
    assert!(
        driving.is_empty(),
        "only node/router.rs may make or feed a RouteState; found: {driving:?}"
    );
    // The check above means something only while the driver is where it says it is.
    for pattern in DRIVING {
        assert!(
            seen_in_router.contains(&pattern),
            "node/router.rs no longer contains {pattern}: has the driver moved?"
        );
    }
}
