//! Which assertions an agent has accepted, so each is accepted once, in memory that does not
//! grow with the request rate.
//!
//! A gateway numbers its assertions: the `jti` is the signer's random 64-bit sender id and a
//! sequence number it increments per assertion. Per sender the agent keeps the newest sequence
//! it accepted and a window of bits for the ones just before it, as IPsec's anti-replay window
//! does (RFC 4303, 3.4.3): a sequence in the window is accepted if its bit is clear; one older
//! than the window is refused (only an assertion overtaken by `window` newer ones from the same
//! gateway is). A sender is forgotten once all its assertions have expired; when `max_senders`
//! are remembered and none has, a new sender is refused (a refusal costs one request, a cache
//! that grows costs the agent its memory). A cache of every `jti` instead held each for its 35 s
//! and so bounded an agent to its capacity / 35 s (65,536 entries: about 1,870 requests/s).

use std::collections::HashMap;

use super::AssertionError;

#[derive(Debug)]
pub(super) struct ReplayWindows {
    /// Sequences per sender, a multiple of 64.
    window: u64,
    max_senders: usize,
    senders: HashMap<u64, SenderWindow>,
}

#[derive(Debug)]
struct SenderWindow {
    newest: u64,
    /// Bit `sequence % window` is set once `sequence` (within the window) was accepted.
    accepted: Box<[u64]>,
    /// The second after which every assertion accepted from this sender has expired.
    forget_after: u64,
}

impl ReplayWindows {
    /// `window` is rounded up to a multiple of 64 (at least 64).
    pub(super) fn new(window: u64, max_senders: usize) -> Self {
        Self {
            window: window.max(1).div_ceil(64) * 64,
            max_senders,
            senders: HashMap::new(),
        }
    }

    /// Accepts `sequence` from `sender` once, remembering it until `forget_after` (Unix
    /// seconds), or refuses it as a replay, as too old for the window, or because the cache is
    /// full of senders with unexpired assertions.
    pub(super) fn accept(
        &mut self,
        sender: u64,
        sequence: u64,
        forget_after: u64,
        now: u64,
    ) -> Result<(), AssertionError> {
        if !self.senders.contains_key(&sender) && self.senders.len() >= self.max_senders {
            self.senders.retain(|_, known| known.forget_after >= now);
            if self.senders.len() >= self.max_senders {
                return Err(AssertionError::ReplayCacheFull {
                    capacity: self.max_senders,
                });
            }
        }
        let window = self.window;
        let known = self.senders.entry(sender).or_insert_with(|| SenderWindow {
            newest: 0,
            accepted: vec![0; (window / 64) as usize].into_boxed_slice(),
            forget_after,
        });
        known.accept(sequence, window)?;
        known.forget_after = known.forget_after.max(forget_after);
        Ok(())
    }

    /// Senders remembered now.
    pub(super) fn senders(&self) -> usize {
        self.senders.len()
    }
}

impl SenderWindow {
    fn accept(&mut self, sequence: u64, window: u64) -> Result<(), AssertionError> {
        if sequence > self.newest {
            self.advance_to(sequence, window);
        } else if self.newest - sequence >= window {
            return Err(AssertionError::OutsideReplayWindow {
                sequence,
                newest: self.newest,
                window,
            });
        }
        let (word, bit) = slot(sequence, window);
        if self.accepted[word] & bit != 0 {
            return Err(AssertionError::Replayed);
        }
        self.accepted[word] |= bit;
        Ok(())
    }

    /// Clears the bits of the sequences after `newest` up to `sequence`: their slots held
    /// sequences that now fall out of the window.
    fn advance_to(&mut self, sequence: u64, window: u64) {
        if sequence - self.newest >= window {
            self.accepted.fill(0);
        } else {
            for cleared in self.newest + 1..=sequence {
                let (word, bit) = slot(cleared, window);
                self.accepted[word] &= !bit;
            }
        }
        self.newest = sequence;
    }
}

fn slot(sequence: u64, window: u64) -> (usize, u64) {
    let index = sequence % window;
    ((index / 64) as usize, 1 << (index % 64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LATER: u64 = 100;

    #[test]
    fn each_sequence_is_accepted_once_in_any_order_within_the_window() {
        let mut windows = ReplayWindows::new(128, 4);
        for sequence in [5, 3, 130, 4, 129, 6] {
            windows.accept(7, sequence, LATER, 0).unwrap();
        }
        for sequence in [5, 3, 130, 4, 129, 6] {
            assert_eq!(
                windows.accept(7, sequence, LATER, 0),
                Err(AssertionError::Replayed),
                "{sequence}"
            );
        }
        // 130 - 2 = 128: older than a 128-wide window, refused though never seen.
        assert_eq!(
            windows.accept(7, 2, LATER, 0),
            Err(AssertionError::OutsideReplayWindow {
                sequence: 2,
                newest: 130,
                window: 128
            })
        );
        // Never seen and still in the window: accepted.
        windows.accept(7, 7, LATER, 0).unwrap();
        // Another sender's numbers are its own.
        windows.accept(8, 5, LATER, 0).unwrap();
        assert_eq!(windows.senders(), 2);
    }

    #[test]
    fn a_jump_beyond_the_window_forgets_the_old_bits() {
        let mut windows = ReplayWindows::new(64, 1);
        windows.accept(1, 10, LATER, 0).unwrap();
        windows.accept(1, 10 + 64 + 5, LATER, 0).unwrap();
        // Slot 10 % 64 was cleared: sequence 74 (same slot) is new, not a replay of 10.
        windows.accept(1, 74, LATER, 0).unwrap();
        assert_eq!(
            windows.accept(1, 10, LATER, 0).unwrap_err().reason(),
            "outside_replay_window"
        );
        assert_eq!(
            windows.accept(1, 79, LATER, 0),
            Err(AssertionError::Replayed)
        );
    }

    #[test]
    fn a_full_cache_forgets_only_senders_whose_assertions_all_expired() {
        let mut windows = ReplayWindows::new(64, 2);
        windows.accept(1, 1, 50, 0).unwrap();
        windows.accept(2, 1, 40, 0).unwrap();
        windows.accept(2, 2, 60, 0).unwrap();
        assert_eq!(
            windows.accept(3, 1, 90, 45),
            Err(AssertionError::ReplayCacheFull { capacity: 2 })
        );
        // At 51 sender 1's only assertion has expired; sender 2's second has not.
        windows.accept(3, 1, 90, 51).unwrap();
        assert_eq!(windows.accept(2, 2, 90, 51), Err(AssertionError::Replayed));
        assert_eq!(windows.senders(), 2);
    }

    #[test]
    fn the_window_is_whole_words() {
        assert_eq!(ReplayWindows::new(0, 1).window, 64);
        assert_eq!(ReplayWindows::new(65, 1).window, 128);
        assert_eq!(ReplayWindows::new(8192, 1).window, 8192);
    }
}
