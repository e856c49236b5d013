//! What a configuration reload (SIGHUP) may change in a running process, decided field by
//! field: the difference between the running config and a newly validated one, split into
//! fields applied live and fields that need a restart.
//!
//! Live: `logging.level`, `gateway.access_log`, `tunnel.access_log`, `tunnel.jwt` (the secret file is read again, so a rotated key takes
//! effect), `tunnel.agents` and `tunnel.max_wait`. Everything else is bound into sockets,
//! threads, TLS state or background tasks at start-up and needs a restart: such a change is
//! not applied, only reported, and the live part of the same reload still applies (a reload
//! never leaves the process half-way between two configs: live fields are swapped together,
//! the others stay as they were at start-up until a restart).

use crate::{Config, GatewayConfig, TunnelConfig};

/// Fields a reload applies to the running process.
pub const LIVE_FIELDS: [&str; 6] = [
    "logging.level",
    "gateway.access_log",
    "tunnel.access_log",
    "tunnel.jwt",
    "tunnel.agents",
    "tunnel.max_wait",
];

/// The difference between the running config and a new one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReloadPlan {
    /// Changed fields a reload applies (names from [`LIVE_FIELDS`]).
    pub live: Vec<&'static str>,
    /// Changed fields that need a restart, by path (`listeners.external`, `runtime.workers`).
    pub restart: Vec<String>,
}

impl ReloadPlan {
    pub fn is_empty(&self) -> bool {
        self.live.is_empty() && self.restart.is_empty()
    }
}

/// Which fields of `new` differ from `running`, and how each can be applied.
pub fn plan(running: &Config, new: &Config) -> ReloadPlan {
    let mut plan = ReloadPlan::default();
    if running.logging.level != new.logging.level {
        plan.live.push("logging.level");
    }
    let mut restart = |changed: bool, path: &str| {
        if changed {
            plan.restart.push(path.to_string());
        }
    };
    let (a, b) = (&running.runtime, &new.runtime);
    restart(a.workers != b.workers, "runtime.workers");
    restart(a.driver != b.driver, "runtime.driver");
    restart(a.uring_entries != b.uring_entries, "runtime.uring_entries");
    restart(a.drain_timeout != b.drain_timeout, "runtime.drain_timeout");
    // The monitor thread is started once with its thresholds.
    restart(a.overload != b.overload, "runtime.overload");
    restart(
        running.logging.format != new.logging.format,
        "logging.format",
    );
    let (a, b) = (&running.listeners, &new.listeners);
    restart(a.admin != b.admin, "listeners.admin");
    restart(a.agent != b.agent, "listeners.agent");
    restart(a.external != b.external, "listeners.external");
    restart(a.private != b.private, "listeners.private");
    restart(a.gateway != b.gateway, "listeners.gateway");
    restart(running.agent != new.agent, "agent");
    restart(running.redis != new.redis, "redis");
    restart(running.ebpf != new.ebpf, "ebpf");
    gateway_plan(running.gateway.as_ref(), new.gateway.as_ref(), &mut plan);
    match (&running.tunnel, &new.tunnel) {
        (Some(a), Some(b)) => tunnel_plan(a, b, &mut plan),
        (None, None) => {}
        _ => plan.restart.push("tunnel".to_string()),
    }
    // A field added to `Config` later and missed above must not be applied silently as live.
    if plan.restart.is_empty() && apply_live(running, new) != *new {
        plan.restart
            .push("(a field this version cannot name)".to_string());
    }
    plan
}

/// The access log is switched live; the rest of the section (where clusters come from) is
/// bound at start-up.
fn gateway_plan(a: Option<&GatewayConfig>, b: Option<&GatewayConfig>, plan: &mut ReloadPlan) {
    match (a, b) {
        (Some(a), Some(b)) => {
            if a.access_log != b.access_log {
                plan.live.push("gateway.access_log");
            }
            let b_with_a_log = GatewayConfig {
                access_log: a.access_log,
                ..b.clone()
            };
            if *a != b_with_a_log {
                plan.restart.push("gateway".to_string());
            }
        }
        (None, None) => {}
        _ => plan.restart.push("gateway".to_string()),
    }
}

fn tunnel_plan(a: &TunnelConfig, b: &TunnelConfig, plan: &mut ReloadPlan) {
    if a.access_log != b.access_log {
        plan.live.push("tunnel.access_log");
    }
    if a.jwt != b.jwt {
        plan.live.push("tunnel.jwt");
    }
    if a.agents != b.agents {
        plan.live.push("tunnel.agents");
    }
    if a.max_wait != b.max_wait {
        plan.live.push("tunnel.max_wait");
    }
    let mut restart = |changed: bool, path: &str| {
        if changed {
            plan.restart.push(format!("tunnel.{path}"));
        }
    };
    restart(a.node_name != b.node_name, "node_name");
    restart(
        a.max_message_bytes != b.max_message_bytes,
        "max_message_bytes",
    );
    restart(
        a.max_metadata_entries != b.max_metadata_entries,
        "max_metadata_entries",
    );
    restart(
        a.max_metadata_bytes != b.max_metadata_bytes,
        "max_metadata_bytes",
    );
    restart(
        a.max_buffered_bytes != b.max_buffered_bytes,
        "max_buffered_bytes",
    );
    restart(a.agents_from != b.agents_from, "agents_from");
    restart(a.private_jwt != b.private_jwt, "private_jwt");
    restart(
        a.advertise_address != b.advertise_address,
        "advertise_address",
    );
    restart(a.peer_tls != b.peer_tls, "peer_tls");
    restart(a.peer_allowlist != b.peer_allowlist, "peer_allowlist");
    restart(
        a.splice_private_hop != b.splice_private_hop,
        "splice_private_hop",
    );
    restart(
        a.agent_limits != b.agent_limits,
        "max_*_per_agent, max_agent_*, list_page_size",
    );
}

/// The config the process runs with after a reload: `running` with the live fields of `new`.
/// Fields that need a restart keep their running values.
pub fn apply_live(running: &Config, new: &Config) -> Config {
    let mut applied = running.clone();
    applied.logging.level = new.logging.level.clone();
    if let (Some(tunnel), Some(newer)) = (&mut applied.tunnel, &new.tunnel) {
        tunnel.jwt = newer.jwt.clone();
        tunnel.agents = newer.agents.clone();
        tunnel.max_wait = newer.max_wait;
        tunnel.access_log = newer.access_log;
    }
    if let (Some(gateway), Some(newer)) = (&mut applied.gateway, &new.gateway) {
        gateway.access_log = newer.access_log;
    }
    applied
}

/// The bounded `result` label of `sluice_config_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadResult {
    /// Every changed field was applied (or nothing changed).
    Applied,
    /// The live fields were applied; some changed fields need a restart.
    RestartRequired,
    /// The file did not validate: nothing applied, the last good config stays.
    Invalid,
}

impl ReloadResult {
    pub const ALL: [ReloadResult; 3] = [
        ReloadResult::Applied,
        ReloadResult::RestartRequired,
        ReloadResult::Invalid,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::RestartRequired => "restart_required",
            ReloadResult::Invalid => "invalid",
        }
    }

    /// The result of a valid file with this plan.
    pub fn of(plan: &ReloadPlan) -> Self {
        if plan.restart.is_empty() {
            ReloadResult::Applied
        } else {
            ReloadResult::RestartRequired
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_str;
    use std::io::Write;

    /// A node config with its JWT secret in `secret`.
    fn node(secret: &tempfile::NamedTempFile, extra_tunnel: &str, listener_port: u16) -> Config {
        let text = format!(
            "logging: {{level: info}}\n\
             listeners:\n  admin: {{address: '127.0.0.1:0'}}\n  agent: {{address: '127.0.0.1:0'}}\n  \
             external: {{address: '127.0.0.1:{listener_port}'}}\n\
             tunnel:\n  node_name: n1\n  jwt: {{secret_file: '{}'}}\n{extra_tunnel}",
            secret.path().display()
        );
        load_str(&text, "node.yaml").expect("valid node config")
    }

    fn secret(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file
    }

    #[test]
    fn an_unchanged_config_plans_nothing() {
        let key = secret("0123456789abcdef0123456789abcdef");
        let config = node(&key, "", 0);
        let plan = plan(&config, &config.clone());
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(ReloadResult::of(&plan), ReloadResult::Applied);
    }

    #[test]
    fn live_fields_are_applied_and_nothing_else_changes() {
        let key = secret("0123456789abcdef0123456789abcdef");
        let running = node(&key, "", 0);
        let rotated = secret("fedcba9876543210fedcba9876543210");
        let mut new = node(
            &rotated,
            "  max_wait: 250ms\n  agents: [{id: 7, token_sha256: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'}]\n",
            0,
        );
        new.logging.level = "debug".into();
        let plan = plan(&running, &new);
        assert_eq!(
            plan.live,
            vec![
                "logging.level",
                "tunnel.jwt",
                "tunnel.agents",
                "tunnel.max_wait"
            ]
        );
        assert!(plan.restart.is_empty(), "{plan:?}");
        assert_eq!(apply_live(&running, &new), new);
    }

    #[test]
    fn restart_only_fields_are_named_and_not_applied() {
        let key = secret("0123456789abcdef0123456789abcdef");
        let running = node(&key, "", 0);
        let mut new = node(&key, "  max_wait: 3s\n  max_message_bytes: 4096\n", 45_678);
        new.runtime.workers = crate::Workers::Count(std::num::NonZeroUsize::new(7).unwrap());
        new.runtime.overload.stop_accepting_percent = 90;
        let plan = plan(&running, &new);
        assert_eq!(plan.live, vec!["tunnel.max_wait"]);
        assert_eq!(
            plan.restart,
            vec![
                "runtime.workers",
                "runtime.overload",
                "listeners.external",
                "tunnel.max_message_bytes"
            ]
        );
        assert_eq!(ReloadResult::of(&plan), ReloadResult::RestartRequired);
        let applied = apply_live(&running, &new);
        // The live field moved; the restart-only ones kept their running values.
        let tunnel = applied.tunnel.as_ref().unwrap();
        assert_eq!(tunnel.max_wait, std::time::Duration::from_secs(3));
        assert_eq!(
            tunnel.max_message_bytes,
            running.tunnel.as_ref().unwrap().max_message_bytes
        );
        assert_eq!(applied.listeners, running.listeners);
        assert_eq!(applied.runtime, running.runtime);
        // Reloading the same file again still reports the pending restart fields.
        assert_eq!(super::plan(&applied, &new).restart.len(), 4);
        assert!(super::plan(&applied, &new).live.is_empty());
    }

    #[test]
    fn adding_or_removing_a_section_needs_a_restart() {
        let key = secret("0123456789abcdef0123456789abcdef");
        let running = node(&key, "", 0);
        let bare = load_str("", "empty.yaml").unwrap();
        let plan = plan(&running, &bare);
        assert!(plan.restart.contains(&"tunnel".to_string()), "{plan:?}");
        assert!(plan.restart.contains(&"listeners.agent".to_string()));
        assert!(plan.live.is_empty());
        assert_eq!(apply_live(&bare, &running), bare);
    }

    #[test]
    fn access_logs_are_switched_live() {
        let key = secret("0123456789abcdef0123456789abcdef");
        let running = node(&key, "", 0);
        let new = node(
            &key,
            "  access_log: {enabled: true, sample: 0.25, errors_always: false}\n",
            0,
        );
        let plan = plan(&running, &new);
        assert_eq!(plan.live, vec!["tunnel.access_log"]);
        assert!(plan.restart.is_empty(), "{plan:?}");
        let applied = apply_live(&running, &new);
        let log = applied.tunnel.as_ref().unwrap().access_log;
        assert_eq!(
            (log.enabled, log.sample_every, log.errors_always),
            (true, 4, false)
        );

        let dir = tempfile::tempdir().unwrap();
        let gateway = |log: &str| {
            let text = format!(
                "gateway: {{clusters_dir: '{}'{log}}}\n",
                dir.path().display()
            );
            load_str(&text, "gw.yaml").expect("valid gateway config")
        };
        let (off, on) = (gateway(""), gateway(", access_log: {enabled: true}"));
        let plan = super::plan(&off, &on);
        assert_eq!(plan.live, vec!["gateway.access_log"]);
        assert!(plan.restart.is_empty(), "{plan:?}");
        assert_eq!(apply_live(&off, &on), on);
        let moved = gateway(", access_log: {enabled: true}, reload_interval: 5s");
        assert_eq!(super::plan(&on, &moved).restart, vec!["gateway"]);
    }

    #[test]
    fn result_labels_are_bounded() {
        let labels: Vec<_> = ReloadResult::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, ["applied", "restart_required", "invalid"]);
    }
}
