//! What `sluice up` prints once everything is listening: the listeners and how to try each part.

use std::ffi::OsStr;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::daemon::VERSION;
use crate::demo::{UpDemo, DEMO_AGENT_ID};

/// The method the banner's `sluice call` names (the echo backend answers any).
const DEMO_METHOD: &str = "sluice.demo.Echo/Say";

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
            "  {} call --endpoint {external} --agent {} --jwt-secret-file {} {DEMO_METHOD} --data hello",
            this_program(),
            DEMO_AGENT_ID,
            demo.jwt_secret_file.display()
        );
        let _ = writeln!(
            out,
            "    (a gRPC call through the tunnel of agent {DEMO_AGENT_ID} to the echo backend, which answers hello)"
        );
    }
    if let Some(gateway) = &demo.gateway {
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} get pods\n    (the Kubernetes API gateway in front of an apiserver simulator at {}; the user is\n    demo-user in group demo-team, forwarded upstream as Impersonate-User/Group)",
            gateway.kubeconfig.display(),
            gateway.simulator.address()
        );
        let path = match &demo.cluster {
            None => "gateway -> this node's tunnel -> the demo agent".to_string(),
            Some(cluster) => format!(
                "gateway -> Redis -> node-{} -> the demo agent",
                cluster.nodes.len() + 1
            ),
        };
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} --context {} get pods\n    (cluster {}: the same simulator, which the gateway reaches only through\n    agent {DEMO_AGENT_ID}'s reverse tunnel: {path} -> simulator)",
            gateway.kubeconfig.display(),
            crate::demo::gateway::BEHIND_NAT_CONTEXT,
            crate::demo::gateway::BEHIND_NAT_HOST,
        );
    }
    if let Some(controlplane) = &demo.controlplane {
        let _ = writeln!(
            out,
            "  kubectl --kubeconfig {} get upstreamclusters\n    (the control plane at {}, embedded; it pushes the clusters above to the gateway:\n    edit it with kubectl and the gateway follows)",
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

/// How to run this binary from a shell: `sluice` when that name on `PATH` is this executable,
/// else its full path (`cargo run` leaves it in target/, not on `PATH`), so the printed
/// commands work as printed.
fn this_program() -> String {
    match std::env::current_exe() {
        Ok(exe) => program_name(&exe, std::env::var_os("PATH").as_deref()),
        Err(_) => "sluice".to_string(),
    }
}

fn program_name(exe: &Path, path: Option<&OsStr>) -> String {
    let canonical = |file: &Path| std::fs::canonicalize(file).ok();
    let exe_real = canonical(exe);
    let on_path = path
        .map(|path| std::env::split_paths(path).collect::<Vec<PathBuf>>())
        .unwrap_or_default()
        .into_iter()
        .find_map(|dir| canonical(&dir.join("sluice")));
    match (on_path, exe_real) {
        (Some(found), Some(real)) if found == real => "sluice".to_string(),
        _ => exe.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_named_by_its_path_unless_path_finds_it_first() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let exe = bin.join("sluice");
        std::fs::write(&exe, b"").unwrap();
        std::fs::write(other.join("sluice"), b"").unwrap();
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        assert_eq!(program_name(&exe, Some(&path(&[&bin]))), "sluice");
        // Another `sluice` first on PATH, none at all, or no PATH: the full path.
        let full = exe.display().to_string();
        assert_eq!(program_name(&exe, Some(&path(&[&other, &bin]))), full);
        assert_eq!(program_name(&exe, Some(&path(&[&other]))), full);
        assert_eq!(program_name(&exe, None), full);
        // A symlink on PATH to this executable is this executable.
        let link_dir = dir.path().join("link");
        std::fs::create_dir_all(&link_dir).unwrap();
        std::os::unix::fs::symlink(&exe, link_dir.join("sluice")).unwrap();
        assert_eq!(program_name(&exe, Some(&path(&[&link_dir]))), "sluice");
    }
}
