//! How a service calls the next one in a chain: a bounded retry policy that keeps the client's
//! key.
//!
//! A call that gets no answer (a timeout, a dropped connection) has an unknown outcome: the
//! callee may have done the work. Retrying is safe only because the retry carries the same
//! Idempotency-Key, so the callee (or the service behind it) can recognise it. The policy bounds
//! the retries so a chain does not pile up load on a callee that is already struggling:
//!
//! - at most [`RetryPolicy::attempts`] calls, each with its own timeout
//!   ([`RetryPolicy::per_call`]), all within one overall deadline ([`RetryPolicy::deadline`]);
//! - between attempts, exponential backoff with jitter: the n-th wait is drawn between half and
//!   all of `base · 2ⁿ⁻¹` (capped), so retries from many clients spread out instead of arriving
//!   together;
//! - only outcomes that are unknown or temporary are retried (no answer, 502, 503, 504); an
//!   answer such as 409 or 422 is the callee's, and goes back to the caller unchanged.
//!
//! The jitter is drawn from a generator with a fixed seed, so the same run waits the same
//! milliseconds every time and the lab's narrative repeats byte for byte. A real service seeds it
//! from entropy.

use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};

/// The bounds of a caller's retries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Calls in all, the first included.
    pub attempts: u32,
    /// How long one call may take before it counts as unanswered.
    pub per_call: Duration,
    /// How long all the calls together may take; no attempt starts after it.
    pub deadline: Duration,
    /// The first backoff's upper bound; it doubles with every attempt.
    pub base: Duration,
    /// No backoff is longer than this.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            // A charge through the chain takes milliseconds here; two seconds is a slow callee.
            per_call: Duration::from_secs(2),
            deadline: Duration::from_secs(6),
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        }
    }
}

/// Backoff with jitter from a seeded generator (ChaCha8, the workspace's one generator: the
/// same sequence for the same seed, on every machine).
#[derive(Debug)]
pub struct Jitter {
    rng: Mutex<ChaCha8Rng>,
}

impl Jitter {
    /// A generator seeded from `seed`.
    pub fn seeded(seed: u64) -> Jitter {
        Jitter {
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
        }
    }

    /// A generator seeded from a name (its SHA-256), so every service has its own fixed
    /// sequence.
    pub fn from_name(name: &str) -> Jitter {
        Jitter {
            rng: Mutex::new(ChaCha8Rng::from_seed(Sha256::digest(name).into())),
        }
    }

    /// The wait before attempt `attempt + 1` (after `attempt` failed calls, counting from 1):
    /// between half and all of `base · 2^(attempt−1)`, capped, in whole milliseconds.
    pub fn backoff(&self, policy: &RetryPolicy, attempt: u32) -> Duration {
        let doubled = policy
            .base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let ceiling = u64::try_from(doubled.min(policy.cap).as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.rng.lock().random_range(ceiling / 2..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_waits_the_same_and_stays_within_bounds() {
        let policy = RetryPolicy::default();
        let (a, b) = (Jitter::from_name("orders"), Jitter::from_name("orders"));
        for attempt in 1..=6 {
            let (x, y) = (a.backoff(&policy, attempt), b.backoff(&policy, attempt));
            assert_eq!(x, y);
            let ceiling = (policy.base * (1 << (attempt - 1))).min(policy.cap);
            assert!(x >= ceiling / 2 && x <= ceiling, "attempt {attempt}: {x:?}");
        }
        assert_ne!(
            Jitter::from_name("orders").backoff(&policy, 1),
            Jitter::from_name("gateway").backoff(&policy, 1),
            "two services do not wait in step"
        );
    }
}
