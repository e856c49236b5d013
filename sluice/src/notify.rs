//! systemd's readiness protocol (sd_notify(3)) for the `Type=notify` units in
//! `deploy/systemd/`: `READY=1` once a role serves (when its `/readyz` would first answer 200),
//! `RELOADING=1` then `READY=1` around a configuration reload (SIGHUP, `systemctl reload`),
//! `STOPPING=1` when it starts to drain. Without `NOTIFY_SOCKET` (not under systemd) every call
//! is a no-op. A failed notification is logged, never fatal: the role serves either way.

use sd_notify::NotifyState;

/// The role serves: systemd may start the units that wait for it.
pub fn ready(role: &str) {
    send(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("{role} serving")),
    ]);
}

/// A configuration reload starts. `MONOTONIC_USEC` with it, as systemd wants for reloads
/// (required by `Type=notify-reload`, harmless with `Type=notify` and `ExecReload=`).
pub fn reloading(role: &str) {
    let status = format!("{role} reloading its configuration");
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status(&status)]),
        Err(_) => send(&[NotifyState::Reloading, NotifyState::Status(&status)]),
    }
}

/// The reload is over (applied or refused): the role serves again; `status` says how it went.
pub fn reloaded(role: &str, status: &str) {
    send(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("{role} serving; last reload: {status}")),
    ]);
}

/// The role drains and stops.
pub fn stopping(role: &str) {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status(&format!("{role} draining")),
    ]);
}

fn send(states: &[NotifyState<'_>]) {
    // `false`: keep NOTIFY_SOCKET, so STOPPING=1 can follow READY=1.
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "systemd notification not sent");
    }
}
