//! Exponential backoff with jitter, so that the nodes of a fleet do not reconnect in step
//! after an API server restart.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Delays that double from `min` to `max`; each is drawn from the upper half of the current
/// step ("equal jitter"): never less than half the step, so a storm is spread but still slows.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
    random: u64,
}

impl Backoff {
    /// A backoff from `min` to `max` (`max` below `min` is raised to `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        // RandomState is seeded per process by std: enough to decorrelate nodes, no new
        // dependency for a jitter source.
        let seed = RandomState::new().build_hasher().finish();
        Self::with_seed(min, max, seed)
    }

    fn with_seed(min: Duration, max: Duration, seed: u64) -> Self {
        let min = min.max(Duration::from_millis(1));
        Self {
            min,
            max: max.max(min),
            step: min,
            random: seed,
        }
    }

    /// The next delay; the step after it doubles (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.max);
        let half = step / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if spread == 0 {
            0
        } else {
            self.next_random() % (spread + 1)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Back to `min` after a success.
    pub fn reset(&mut self) {
        self.step = self.min;
    }

    /// SplitMix64: tiny, good enough for jitter.
    fn next_random(&mut self) -> u64 {
        self.random = self.random.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_jitter_up_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::with_seed(ms(100), ms(1000), 7);
        for step in [100, 200, 400, 800, 1000, 1000, 1000] {
            let delay = backoff.next_delay();
            assert!(
                delay >= ms(step / 2) && delay <= ms(step),
                "{delay:?} for step {step}"
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= ms(100));
    }

    #[test]
    fn jitter_spreads_and_bad_bounds_are_fixed() {
        let ms = Duration::from_millis;
        let delays: std::collections::BTreeSet<Duration> = (0..20)
            .map(|seed| Backoff::with_seed(ms(1000), ms(1000), seed).next_delay())
            .collect();
        assert!(delays.len() > 10, "{delays:?}");
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert!(zero.next_delay() <= ms(1));
    }
}
