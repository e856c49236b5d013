//! What `sluice up` prints once everything is listening: the listeners and how to try each part.

use std::io::Write;
use std::net::SocketAddr;

use crate::daemon::VERSION;
use crate::demo::{UpDemo, DEMO_AGENT_ID};

pub fn print_banner(
    workers: usize,
    driver: &str,
    addresses: &[(String, SocketAddr)],
    demo: &UpDemo,
) {
    let find = |listener: &str| {
        addresses
            .iter()
            .find(|(name, _)| name == listener)
            .map(|(_, address)| *address)
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "Sluice {VERSION} is up: {workers} data-plane worker(s) on the {driver} driver.\n"
    );
    let describe = |name: &str| match name {
        "admin" => "/metrics /healthz /readyz",
        "agent" => "agents open reverse tunnels here",
        "external" => "clients call agents here (gRPC, JWT HS256, iss=gitlab aud=gitlab-kas)",
        "demo-backend" => "gRPC echo backend, reached through the tunnel of agent 1",
        "gateway" => "Kubernetes API gateway (TLS; the host name picks the cluster)",
        _ => "",
    };
    for (name, address) in addresses {
        let _ = writeln!(out, "  {name:<13} {address:<22} {}", describe(name));
    }
    describe_agent(&mut out, demo);
    if let Some(admin) = find("admin") {
        let _ = writeln!(out, "\nTry it:");
        let _ = writeln!(out, "  curl http://{admin}/metrics    # Prometheus metrics");
        let _ = writeln!(
            out,
            "  curl http://{admin}/readyz     # 200 when ready, 503 while draining"
        );
    }
    if let Some(external) = find("external") {
        let _ = writeln!(
            out,
            "  .venv/bin/python scripts/tunnel_client.py --node {external} --agent-id {} --jwt-secret-file {} hello",
            DEMO_AGENT_ID,
            demo.jwt_secret_file.display()
        );
        let _ = writeln!(out, "    (calls the echo backend through the tunnel; needs grpcio and PyJWT: scripts/test.sh creates .venv)");
    }
    if let Some(gateway) = &demo.gateway {
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} get pods\n    (the Kubernetes API gateway in front of an apiserver simulator at {}; the user is\n    demo-user in group demo-team, forwarded upstream as Impersonate-User/Group)",
            gateway.kubeconfig.display(),
            gateway.simulator.address()
        );
    }
    if let Some(controlplane) = &demo.controlplane {
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} get upstreamclusters\n    (the control plane at {}, embedded; it pushes the cluster above to the gateway:\n    edit it with kubectl and the gateway follows)",
            controlplane.kubeconfig.display(),
            controlplane.url
        );
        if let Some(vm) = &demo.vm {
            let _ = write!(out, "\n{}", vm.describe(&controlplane.kubeconfig));
        }
    }
    let _ = writeln!(out, "\nPress Ctrl-C to stop.");
    let _ = out.flush();
}

/// Where the demo agent keeps its tunnels: this node, or the last node of a cluster.
fn describe_agent(out: &mut impl Write, demo: &UpDemo) {
    match &demo.cluster {
        None => {
            let _ = writeln!(
                out,
                "\nA demo agent (id {}) is connected to this node through its own tunnels.",
                DEMO_AGENT_ID
            );
        }
        Some(cluster) => {
            let _ = writeln!(
                out,
                "\nThis process is node-1. The other nodes run as child processes, sharing redis-server on {}:",
                cluster.redis_socket.display()
            );
            for node in &cluster.nodes {
                let listed: Vec<String> = node
                    .addresses
                    .iter()
                    .map(|(name, address)| format!("{name} {address}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  {:<7} {}  (log: {})",
                    node.name,
                    listed.join(", "),
                    node.log.display()
                );
            }
            let holder = cluster.nodes.last().map_or("?", |node| node.name.as_str());
            let _ = writeln!(
                out,
                "\nThe demo agent (id {}) keeps its tunnels on {holder}; calls to node-1 below find it\nthrough Redis and go through {holder}'s private endpoint.",
                DEMO_AGENT_ID
            );
        }
    }
}
