//! The fault proxy's dice: toxicity rolls, latency jitter and slice sizes.
//!
//! ChaCha8 (the workspace's one generator, from `rand`), seeded afresh for each toxic link:
//! nothing here needs to be repeatable, only to look random to a learner, and two links created
//! in the same nanosecond still differ.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::rngs::ChaCha8Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};

pub(crate) struct Rng(ChaCha8Rng);

impl Rng {
    /// A generator with a fresh seed: the clock, and a process-wide sequence number.
    pub(crate) fn new() -> Self {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0);
        let mut rng = ChaCha8Rng::seed_from_u64(nanos);
        rng.set_stream(SEQUENCE.fetch_add(1, Ordering::Relaxed));
        Rng(rng)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`: so `roll() < 1.0` always holds (toxicity 1.0 = always)
    /// and `roll() < 0.0` never does (toxicity 0.0 = never).
    pub(crate) fn roll(&mut self) -> f32 {
        self.0.random_range(0.0..1.0)
    }

    /// Uniform in `[-spread, +spread]`.
    pub(crate) fn spread(&mut self, spread: u64) -> i128 {
        let spread = i128::from(spread);
        self.0.random_range(-spread..=spread)
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn roll_stays_in_unit_interval_and_spread_in_bounds() {
        let mut rng = Rng::new();
        for _ in 0..10_000 {
            let roll = rng.roll();
            assert!((0.0..1.0).contains(&roll));
            assert!((-3..=3).contains(&rng.spread(3)));
        }
        assert_eq!(rng.spread(0), 0);
    }
}
