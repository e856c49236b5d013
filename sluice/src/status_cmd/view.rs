//! A node's state from its `/metrics`, as `sluice status` prints it: pure (text in, lines out),
//! so every section is unit-tested without a node.

use std::collections::BTreeMap;

use prometheus_parse::{Sample, Scrape, Value};

/// Parses a Prometheus text exposition.
pub fn parse(text: &str) -> std::io::Result<Scrape> {
    Scrape::parse(text.lines().map(|line| Ok(line.to_string())))
}

/// The samples of one metric family.
fn samples<'a>(scrape: &'a Scrape, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
    scrape
        .samples
        .iter()
        .filter(move |sample| sample.metric == name)
}

fn number(sample: &Sample) -> f64 {
    match &sample.value {
        Value::Counter(value) | Value::Gauge(value) | Value::Untyped(value) => *value,
        Value::Histogram(_) | Value::Summary(_) => 0.0,
    }
}

/// The sum of a family's samples; `None` when the node does not export it.
fn sum(scrape: &Scrape, name: &str) -> Option<f64> {
    let mut found = false;
    let total = samples(scrape, name)
        .inspect(|_| found = true)
        .map(number)
        .sum();
    found.then_some(total)
}

/// The sum of a family's samples grouped by one label.
fn by_label(scrape: &Scrape, name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut groups = BTreeMap::new();
    for sample in samples(scrape, name) {
        let key = sample.labels.get(label).unwrap_or("").to_string();
        *groups.entry(key).or_insert(0.0) += number(sample);
    }
    groups
}

/// The lines `sluice status` prints: a header, then one section per pillar the node runs.
pub fn render(scrape: &Scrape, ready: Option<u16>) -> Vec<String> {
    let mut lines = vec![header(scrape, ready)];
    let row = |lines: &mut Vec<String>, key: &str, value: String| {
        lines.push(format!("  {key:<22} {value}"));
    };
    if let Some(active) = sum(scrape, "sluice_connections_active") {
        let accepted = sum(scrape, "sluice_connections_accepted_total").unwrap_or(0.0);
        row(
            &mut lines,
            "connections",
            format!("{active} open, {accepted} accepted"),
        );
    }
    if let Some(agents) = sum(scrape, "sluice_tunnel_connected_agents") {
        let tunnels = sum(scrape, "sluice_tunnel_connected_tunnels").unwrap_or(0.0);
        let idle = sum(scrape, "sluice_tunnel_idle_tunnels").unwrap_or(0.0);
        row(
            &mut lines,
            "tunnel",
            format!("{agents} agents, {tunnels} tunnels ({idle} idle)"),
        );
        let requests = by_label(scrape, "sluice_tunnel_requests_total", "code");
        if !requests.is_empty() {
            row(&mut lines, "tunnel requests", counts(&requests));
        }
    }
    let health = samples(scrape, "sluice_gateway_upstream_healthy").fold(
        BTreeMap::<String, (u32, u32)>::new(),
        |mut clusters, sample| {
            let cluster = sample.labels.get("cluster").unwrap_or("?").to_string();
            let entry = clusters.entry(cluster).or_default();
            entry.1 += 1;
            entry.0 += u32::from(number(sample) > 0.0);
            clusters
        },
    );
    for (cluster, (healthy, all)) in health {
        row(
            &mut lines,
            &format!("gateway {cluster}"),
            format!("{healthy}/{all} apiservers healthy"),
        );
    }
    if let Some(requests) = sum(scrape, "sluice_gateway_requests_total") {
        let rejected = sum(scrape, "sluice_gateway_rejected_total").unwrap_or(0.0);
        row(
            &mut lines,
            "gateway requests",
            format!("{requests} ({rejected} answered by the gateway itself)"),
        );
    }
    let watches = by_label(scrape, "sluice_controlplane_watch_connected", "resource");
    if !watches.is_empty() {
        let states: Vec<String> = watches
            .iter()
            .map(|(resource, up)| {
                let state = if *up > 0.0 {
                    "connected"
                } else {
                    "DISCONNECTED"
                };
                format!("{resource} {state}")
            })
            .collect();
        row(&mut lines, "control plane", states.join(", "));
    }
    controlplane_rows(scrape, &mut |key, value| row(&mut lines, key, value));
    if let Some(enabled) = sum(scrape, "sluice_ebpf_enabled") {
        let attached = sum(scrape, "sluice_ebpf_attached_interfaces").unwrap_or(0.0);
        let state = if enabled > 0.0 {
            format!("on {attached} interface(s)")
        } else {
            "off (the kernel refused the programs)".to_string()
        };
        row(&mut lines, "ebpf counters", state);
    }
    let panics = by_label(
        scrape,
        "sluice_task_panics_total",
        sluice_runtime::TASK_PANICS_LABEL,
    );
    let total: f64 = panics.values().sum();
    row(
        &mut lines,
        "panics",
        if total > 0.0 {
            counts(&panics)
        } else {
            "none".to_string()
        },
    );
    lines
}

/// The control plane's own figures: its store, its clients, and any overload action on.
fn controlplane_rows(scrape: &Scrape, row: &mut dyn FnMut(&str, String)) {
    let Some(revision) = sum(scrape, "sluice_controlplane_store_revision") else {
        return;
    };
    let bytes = sum(scrape, "sluice_controlplane_store_bytes").unwrap_or(0.0);
    let quota = sum(scrape, "sluice_controlplane_store_quota_bytes").unwrap_or(0.0);
    let tokens = sum(scrape, "sluice_controlplane_tokens").unwrap_or(0.0);
    row(
        "store",
        format!("revision {revision}, {bytes} of {quota} bytes, {tokens} token(s)"),
    );
    let connections = sum(scrape, "sluice_controlplane_connections").unwrap_or(0.0);
    let anonymous = sum(scrape, "sluice_controlplane_unauthenticated_connections").unwrap_or(0.0);
    let watches = sum(scrape, "sluice_controlplane_watchers").unwrap_or(0.0);
    row(
        "clients",
        format!("{connections} connection(s) ({anonymous} unauthenticated), {watches} watch(es)"),
    );
    let overloaded: Vec<String> = by_label(scrape, "sluice_overload_state", "action")
        .into_iter()
        .filter(|(_, on)| *on > 0.0)
        .map(|(action, _)| action)
        .collect();
    if !overloaded.is_empty() {
        row("overload", overloaded.join(", "));
    }
}

fn header(scrape: &Scrape, ready: Option<u16>) -> String {
    let build = samples(scrape, "sluice_build_info").next();
    let label = |name| {
        build
            .and_then(|sample| sample.labels.get(name))
            .unwrap_or("?")
    };
    let version = match build.and_then(|sample| sample.labels.get("revision")) {
        Some(revision) => format!("{} ({revision})", label("version")),
        None => label("version").to_string(),
    };
    let driver = label("driver");
    // The control plane runs on tokio and exports no worker count.
    let runs = match sum(scrape, "sluice_workers") {
        Some(workers) => format!("{workers} worker(s) on {driver}"),
        None if sum(scrape, "sluice_controlplane_store_revision").is_some() => {
            format!("control plane on {driver}")
        }
        None => format!("0 worker(s) on {driver}"),
    };
    let readiness = match ready {
        Some(200) => "ready".to_string(),
        Some(code) => format!("NOT READY ({code})"),
        None => "readiness unknown".to_string(),
    };
    format!("Sluice {version}, {runs}: {readiness}")
}

/// `label value` pairs, largest first.
fn counts(groups: &BTreeMap<String, f64>) -> String {
    let mut pairs: Vec<(&String, &f64)> = groups.iter().collect();
    pairs.sort_by(|a, b| b.1.total_cmp(a.1));
    pairs
        .iter()
        .map(|(label, value)| format!("{label} {value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = r#"# TYPE sluice_build_info gauge
sluice_build_info{version="0.1.0",driver="io_uring"} 1
# TYPE sluice_workers gauge
sluice_workers 2
# TYPE sluice_connections_active gauge
sluice_connections_active{listener="agent"} 3
sluice_connections_active{listener="external"} 2
# TYPE sluice_connections_accepted counter
sluice_connections_accepted_total{listener="agent"} 10
# TYPE sluice_tunnel_connected_agents gauge
sluice_tunnel_connected_agents 1
# TYPE sluice_tunnel_connected_tunnels gauge
sluice_tunnel_connected_tunnels 4
# TYPE sluice_tunnel_idle_tunnels gauge
sluice_tunnel_idle_tunnels 3
# TYPE sluice_tunnel_requests counter
sluice_tunnel_requests_total{code="OK",method="m"} 7
sluice_tunnel_requests_total{code="UNAVAILABLE",method="m"} 2
# TYPE sluice_gateway_upstream_healthy gauge
sluice_gateway_upstream_healthy{cluster="prod",server="https://a"} 1
sluice_gateway_upstream_healthy{cluster="prod",server="https://b"} 0
# TYPE sluice_controlplane_watch_connected gauge
sluice_controlplane_watch_connected{resource="agents"} 0
# TYPE sluice_ebpf_enabled gauge
sluice_ebpf_enabled 1
# TYPE sluice_ebpf_attached_interfaces gauge
sluice_ebpf_attached_interfaces 2
# TYPE sluice_task_panics counter
sluice_task_panics_total{task="connection"} 0
"#;

    #[test]
    fn a_node_reads_as_one_line_per_part() {
        let lines = render(&parse(NODE).unwrap(), Some(200));
        assert_eq!(
            lines,
            [
                "Sluice 0.1.0, 2 worker(s) on io_uring: ready",
                "  connections            5 open, 10 accepted",
                "  tunnel                 1 agents, 4 tunnels (3 idle)",
                "  tunnel requests        OK 7, UNAVAILABLE 2",
                "  gateway prod           1/2 apiservers healthy",
                "  control plane          agents DISCONNECTED",
                "  ebpf counters          on 2 interface(s)",
                "  panics                 none",
            ]
        );
    }

    #[test]
    fn panics_are_read_by_the_label_the_runtime_exports() {
        let label = sluice_runtime::TASK_PANICS_LABEL;
        let scrape =
            format!("sluice_workers 1\nsluice_task_panics_total{{{label}=\"grpc-stream\"}} 2\n");
        let lines = render(&parse(&scrape).unwrap(), Some(200));
        assert_eq!(
            lines.last().unwrap(),
            "  panics                 grpc-stream 2"
        );
    }

    #[test]
    fn the_control_plane_reads_as_its_version_store_and_clients() {
        let scrape = r#"sluice_build_info{version="0.1.0",revision="41d1c0162586",driver="tokio"} 1
sluice_overload_state{action="stop_accepting"} 0
sluice_overload_state{action="shed_new_requests"} 1
sluice_controlplane_connections 3
sluice_controlplane_unauthenticated_connections 1
sluice_controlplane_watchers{resource="agents"} 2
sluice_controlplane_watchers{resource="upstreamclusters"} 1
sluice_controlplane_store_revision 12
sluice_controlplane_tokens 2
sluice_controlplane_store_bytes 400
sluice_controlplane_store_quota_bytes 2147483648
"#;
        let lines = render(&parse(scrape).unwrap(), Some(200));
        assert_eq!(
            lines,
            [
                "Sluice 0.1.0 (41d1c0162586), control plane on tokio: ready",
                "  store                  revision 12, 400 of 2147483648 bytes, 2 token(s)",
                "  clients                3 connection(s) (1 unauthenticated), 3 watch(es)",
                "  overload               shed_new_requests",
                "  panics                 none",
            ]
        );
    }

    #[test]
    fn what_a_role_does_not_export_is_left_out() {
        let lines = render(&parse("sluice_workers 1\n").unwrap(), Some(503));
        assert_eq!(
            lines,
            [
                "Sluice ?, 1 worker(s) on ?: NOT READY (503)",
                "  panics                 none"
            ]
        );
    }
}
