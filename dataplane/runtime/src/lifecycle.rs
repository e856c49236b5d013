use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use event_listener::Event;

/// Where the process is in its life; `/readyz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Listeners are being bound and workers started.
    Starting,
    /// Every listener is bound, config loaded, workers running.
    Ready,
    /// A stop was requested: no new connections, in-flight work finishing.
    Draining,
    /// Workers have exited.
    Stopped,
    /// A worker thread died: the process is stopping and must be restarted.
    Failed,
}

impl Phase {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => Phase::Starting,
            1 => Phase::Ready,
            2 => Phase::Draining,
            3 => Phase::Stopped,
            _ => Phase::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Draining => "draining",
            Phase::Stopped => "stopped",
            Phase::Failed => "failed",
        }
    }
}

/// A one-shot broadcast that any thread fires and any task on any runtime awaits. monoio's `sync`
/// feature makes wakers from other threads work, which is what the `event-listener` waker needs.
#[derive(Debug, Default)]
pub struct StopSignal {
    fired: AtomicBool,
    event: Event,
}

impl StopSignal {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal; idempotent.
    pub fn fire(&self) {
        if !self.fired.swap(true, Ordering::SeqCst) {
            self.event.notify(usize::MAX);
        }
    }

    pub fn is_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Blocks the calling (non-runtime) thread until the signal has fired.
    pub fn wait_blocking(&self) {
        use event_listener::Listener;
        while !self.is_fired() {
            let listener = self.event.listen();
            if self.is_fired() {
                return;
            }
            listener.wait();
        }
    }

    /// Resolves once the signal has fired.
    pub async fn wait(&self) {
        loop {
            if self.is_fired() {
                return;
            }
            let listener = self.event.listen();
            // Checked again after registering so a fire between the two checks is not lost.
            if self.is_fired() {
                return;
            }
            listener.await;
        }
    }
}

/// Process-wide lifecycle shared by the supervisor, the workers and the admin endpoint.
#[derive(Debug, Default)]
pub struct Lifecycle {
    phase: AtomicU8,
    /// Fired when draining starts: data-plane listeners close, idle connections end.
    pub drain: Arc<StopSignal>,
    /// Fired by a second stop signal: cut what is left without waiting for the drain deadline.
    pub abort: Arc<StopSignal>,
    /// Fired when a worker thread died ([`Lifecycle::fail`]): the process stops.
    pub failed: Arc<StopSignal>,
}

impl Lifecycle {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::SeqCst))
    }

    pub fn is_ready(&self) -> bool {
        self.phase() == Phase::Ready
    }

    /// Readiness answers 503 "draining" from now on, while everything still serves: a process
    /// that first takes itself out of rotation (load balancers, the tunnel tracker) and only
    /// then starts the drain ([`crate::RunningServer::shutdown`]).
    pub fn announce_drain(&self) {
        self.set_phase(Phase::Draining);
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        // A failed process stays failed: `/readyz` keeps answering 503 "failed" while it drains.
        if self.has_failed() {
            return;
        }
        self.phase.store(Self::phase_value(phase), Ordering::SeqCst);
    }

    fn phase_value(phase: Phase) -> u8 {
        match phase {
            Phase::Starting => 0,
            Phase::Ready => 1,
            Phase::Draining => 2,
            Phase::Stopped => 3,
            Phase::Failed => 4,
        }
    }

    /// A worker thread died (a panic outside any contained task): readiness flips to "failed"
    /// (503) and `failed` fires, which stops the process ([`crate::StopSignals::wait`] returns)
    /// so a supervisor restarts it; a half-dead process never keeps serving.
    pub fn fail(&self, reason: &str) {
        tracing::error!(reason, "worker failed; the process stops");
        self.phase
            .store(Self::phase_value(Phase::Failed), Ordering::SeqCst);
        self.failed.fire();
    }

    /// Whether a worker died ([`Lifecycle::fail`]).
    pub fn has_failed(&self) -> bool {
        self.failed.is_fired()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn phases_round_trip() {
        let lifecycle = Lifecycle::new();
        assert_eq!(lifecycle.phase(), Phase::Starting);
        for phase in [
            Phase::Ready,
            Phase::Draining,
            Phase::Stopped,
            Phase::Starting,
        ] {
            lifecycle.set_phase(phase);
            assert_eq!(lifecycle.phase(), phase);
        }
    }

    #[test]
    fn stop_signal_wakes_a_monoio_task_from_another_thread() {
        let signal = Arc::new(StopSignal::new());
        let remote = signal.clone();
        let firer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            remote.fire();
        });
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("legacy runtime");
        runtime.block_on(async {
            let waited =
                monoio::time::timeout(std::time::Duration::from_secs(5), signal.wait()).await;
            assert!(waited.is_ok(), "stop signal did not wake the runtime");
        });
        firer.join().expect("firer thread");
        assert!(signal.is_fired());
    }
}
