//! A tiny pseudo-random generator for toxicity rolls, latency jitter and slice sizes.
//!
//! None of these need cryptographic quality, only "looks random to a learner", so a
//! dozen lines of SplitMix64 replace a dependency on `rand`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// SplitMix64 (Steele, Lea, Flood 2014): one 64-bit state, good statistical quality.
pub(crate) struct Rng {
    state: u64,
}

/// The golden-ratio increment of SplitMix64; also used to spread seeds apart.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    /// A generator with a fresh seed. Two generators created in the same nanosecond
    /// still differ, thanks to a process-wide sequence number.
    pub(crate) fn new() -> Self {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0);
        let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        Rng {
            state: nanos ^ sequence.wrapping_mul(GOLDEN_GAMMA),
        }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`: so `roll() < 1.0` always holds (toxicity 1.0 = always)
    /// and `roll() < 0.0` never does (toxicity 0.0 = never).
    pub(crate) fn roll(&mut self) -> f32 {
        // 24 random bits is exactly the precision of an f32 mantissa.
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[-spread, +spread]`.
    pub(crate) fn spread(&mut self, spread: u64) -> i128 {
        if spread == 0 {
            return 0;
        }
        let width = 2 * spread as u128 + 1;
        (self.next_u64() as u128 % width) as i128 - spread as i128
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
