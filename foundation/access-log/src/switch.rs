//! Whether a request is logged (one relaxed load while off), and the bounded queue to the
//! writer thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;

use sluice_config::AccessLogConfig;

use crate::record::Record;

/// Records waiting for the writer: past this a record is dropped and counted. At a few hundred
/// bytes each, the queue holds at most a few MB.
const QUEUE_CAPACITY: usize = 8192;

/// The role whose requests are logged (the `role` field and label: a fixed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Gateway,
    Tunnel,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Gateway, Role::Tunnel];

    pub fn label(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Tunnel => "tunnel",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A role's switch and counts. `settings`: bit 63 enabled, bit 62 errors always, the low 32
/// bits one-in-N.
pub(crate) struct Switch {
    settings: AtomicU64,
    pub(crate) written: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

const ENABLED: u64 = 1 << 63;
const ERRORS_ALWAYS: u64 = 1 << 62;

impl Switch {
    const fn new() -> Self {
        Self {
            settings: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }
}

pub(crate) static SWITCHES: [Switch; 2] = [Switch::new(), Switch::new()];

static WRITER: OnceLock<SyncSender<Record>> = OnceLock::new();

thread_local! {
    /// Requests this thread has seen per role while its log was on: one in N is logged. Per
    /// thread, so sampling shares no cache line between workers.
    static SEEN: Cell<[u32; 2]> = const { Cell::new([0; 2]) };
}

fn pack(config: &AccessLogConfig) -> u64 {
    if !config.enabled {
        return 0;
    }
    let errors = if config.errors_always {
        ERRORS_ALWAYS
    } else {
        0
    };
    ENABLED | errors | u64::from(config.sample_every.max(1))
}

/// Applies a role's `access_log` section (at start and on every reload); the writer thread
/// starts the first time any role's log is enabled.
pub fn configure(role: Role, config: &AccessLogConfig) -> std::io::Result<()> {
    if config.enabled && WRITER.get().is_none() {
        let (sender, receiver) = sync_channel(QUEUE_CAPACITY);
        std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || write_lines(&receiver))?;
        // Two configure calls racing: the loser's thread sees its sender dropped and ends.
        let _ = WRITER.set(sender);
    }
    SWITCHES[role.index()]
        .settings
        .store(pack(config), Ordering::Relaxed);
    Ok(())
}

/// Whether this request is logged: its role's log is on, and it is an error logged always or
/// the one-in-N of this thread. While the log is off this is one relaxed load.
#[inline]
pub fn wanted(role: Role, error: bool) -> bool {
    let settings = SWITCHES[role.index()].settings.load(Ordering::Relaxed);
    decide(settings, error, role.index())
}

fn decide(settings: u64, error: bool, slot: usize) -> bool {
    if settings & ENABLED == 0 {
        return false;
    }
    if error && settings & ERRORS_ALWAYS != 0 {
        return true;
    }
    let every = (settings & u64::from(u32::MAX)) as u32;
    SEEN.with(|seen| {
        let mut counts = seen.get();
        counts[slot] = counts[slot].wrapping_add(1) % every.max(1);
        seen.set(counts);
        counts[slot] == 0
    })
}

/// Hands a record to the writer thread; when its queue is full (or no writer runs) the record
/// is dropped and counted, never waited for.
pub fn submit(record: Record) {
    let switch = &SWITCHES[record.role().index()];
    match WRITER.get() {
        Some(sender) => offer(sender, record, switch),
        None => {
            switch.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn offer(sender: &SyncSender<Record>, record: Record, switch: &Switch) {
    match sender.try_send(record) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            switch.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn write_lines(receiver: &Receiver<Record>) {
    while let Ok(record) = receiver.recv() {
        let role = record.role();
        record.emit();
        SWITCHES[role.index()]
            .written
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::HttpRecord;

    fn settings(enabled: bool, sample_every: u32, errors_always: bool) -> u64 {
        pack(&AccessLogConfig {
            enabled,
            sample_every,
            errors_always,
        })
    }

    #[test]
    fn off_logs_nothing_errors_included() {
        let off = settings(false, 1, true);
        assert!((0..100).all(|_| !decide(off, false, 0) && !decide(off, true, 0)));
    }

    #[test]
    fn one_in_n_is_logged_and_errors_always_when_asked() {
        // Each test runs on its own thread: the per-thread counts start at zero.
        let every_fourth = settings(true, 4, false);
        let logged = (0..100).filter(|_| decide(every_fourth, false, 1)).count();
        assert_eq!(logged, 25);
        let errors_sampled = (0..100).filter(|_| decide(every_fourth, true, 1)).count();
        assert_eq!(errors_sampled, 25);
        let errors_always = settings(true, 4, true);
        assert!((0..10).all(|_| decide(errors_always, true, 1)));
        let all = settings(true, 1, false);
        assert!((0..10).all(|_| decide(all, false, 0)));
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (sender, receiver) = sync_channel(2);
        let switch = Switch::new();
        for _ in 0..5 {
            offer(&sender, Record::Http(HttpRecord::default()), &switch);
        }
        assert_eq!(switch.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(receiver.try_iter().count(), 2);
        drop(receiver);
        offer(&sender, Record::Http(HttpRecord::default()), &switch);
        assert_eq!(switch.dropped.load(Ordering::Relaxed), 4);
    }
}
