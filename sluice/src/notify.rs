//! systemd's readiness protocol (sd_notify(3)) for the `Type=notify` units in
//! `deploy/systemd/`: `READY=1` once a role serves (when its `/readyz` would first answer 200),
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
