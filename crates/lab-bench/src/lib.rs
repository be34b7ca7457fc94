//! `lab bench` without the command line: how fast the protections are, measured against the
//! fastest thing that could do the same work, in the same run, on the same servers.
//!
//! ```text
//! coordinator   idem on Redis (new keys, replays; compatible, hardened policy)
//!               vs a bare Redis client sending the same round trips          coordinator.rs
//! report_api    POST /reports over HTTP (N requests, K keys, C clients)
//!               vs the same transaction sent directly through sqlx           report_api.rs
//! ```
//!
//! This crate measures and returns typed rows; it prints nothing. The `lab` binary
//! (`crates/lab-cli/src/commands/bench/`) starts the servers, draws the progress bar and prints
//! the rows as a table or as JSON lines. Keeping the two apart means a row is a value you can
//! read in a test or in another program, and the words people read live in one place (the
//! CLI's texts): an error here carries the [`lab_core::Msg`] to say, not the sentence.
//!
//! Both benches drive their calls the same way ([`measure`]): C callers in one task, each taking
//! the next call number from a shared counter until N calls are done (as the Python reference
//! bench does with asyncio workers), timing each call. A row reports calls per second over the
//! whole batch and the 50th and 99th percentile of the single calls' latencies ([`Sample`]).
//! Numbers vary with the machine and its load: they belong in the output, never in a test's
//! assertion.
//!
//! # Layout
//!
//! - this file: [`Sample`] (one timed batch), [`measure`] (the callers), [`warm_up`], [`tenth`],
//!   and [`Progress`], the hook through which a caller hears how far a bench has got.
//! - `error.rs`: [`BenchError`], what can stop a bench.
//! - [`coordinator`]: the `idem` coordinator beside a bare Redis client, and the Python
//!   reference bench (idempotency-kit) beside both.
//! - [`report_api`]: the report service over HTTP beside its own transaction sent through sqlx
//!   (and, if asked, through pgbench).

pub mod coordinator;
mod error;
pub mod report_api;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use error::BenchError;

/// Where a bench says how far it has got: the `lab` binary draws a progress bar with it, a test
/// passes [`NoProgress`]. Called from the callers themselves (on the http side, from a task per
/// connection), so it must be cheap and shareable between threads.
pub trait Progress: Send + Sync {
    /// `calls` more calls are done (warm-up calls included: they take time too).
    fn advance(&self, calls: u64);

    /// The side that runs from now on: `idem`, `idempotency-kit`, `http`, `sqlx`, `pgbench`.
    fn side(&self, name: &str) {
        let _ = name;
    }
}

/// A [`Progress`] that listens to nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn advance(&self, _calls: u64) {}
}

/// One measured batch: how many calls, how long the batch took, and each call's latency.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub ops: u64,
    pub elapsed: Duration,
    /// Sorted, shortest first.
    latencies: Vec<Duration>,
}

impl Sample {
    /// A batch whose calls took `latencies`, in `elapsed` as a whole.
    pub fn new(elapsed: Duration, mut latencies: Vec<Duration>) -> Sample {
        latencies.sort_unstable();
        Sample {
            ops: latencies.len() as u64,
            elapsed,
            latencies,
        }
    }

    /// Adds `other`'s calls and time to this batch's: the batches of one side, run in turns with
    /// the other sides', make one row.
    pub fn absorb(&mut self, other: Sample) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
        self.latencies.sort_unstable();
    }

    /// Calls per second over the whole batch (not the mean of the latencies: with C callers in
    /// flight the batch finishes about C times sooner than the sum of its calls).
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The latency below which `percent` of the calls finished, in microseconds (nearest rank).
    pub fn percentile_us(&self, percent: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let rank = ((percent / 100.0) * self.latencies.len() as f64).ceil() as usize;
        let index = rank.clamp(1, self.latencies.len()) - 1;
        self.latencies[index].as_secs_f64() * 1e6
    }
}

/// Runs calls `first..first + count` with `concurrency` callers and times them.
///
/// The callers are futures joined in this task, not spawned tasks: like the Python bench's
/// asyncio workers, they share one thread of the client, so the client's own cost per call
/// shows instead of being spread over both cores (which Redis and PostgreSQL need too). The
/// first error stops the batch.
pub async fn measure<F, Fut, E>(
    first: u64,
    count: u64,
    concurrency: u32,
    progress: &dyn Progress,
    call: F,
) -> Result<Sample, E>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let next = AtomicU64::new(0);
    let caller = || async {
        let mut latencies = Vec::new();
        loop {
            let n = next.fetch_add(1, Ordering::Relaxed);
            if n >= count {
                return Ok::<_, E>(latencies);
            }
            let started = Instant::now();
            call(first + n).await?;
            latencies.push(started.elapsed());
            progress.advance(1);
        }
    };
    let started = Instant::now();
    let callers = (0..concurrency.max(1)).map(|_| caller());
    let per_caller = futures_util::future::try_join_all(callers).await?;
    let elapsed = started.elapsed();
    let mut latencies: Vec<Duration> = per_caller.into_iter().flatten().collect();
    latencies.sort_unstable();
    Ok(Sample {
        ops: count,
        elapsed,
        latencies,
    })
}

/// Calls made before a batch and not counted: connections opened, scripts loaded, caches warm.
/// A tenth of the batch, at most 300 (the Python reference warms up with 300).
pub fn warm_up(ops: u64) -> u64 {
    (ops / 10).clamp(1, 300)
}

/// Rounds to one decimal: enough for ops/s and microseconds, and short in JSON.
pub fn tenth(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sample = Sample {
            ops: 100,
            elapsed: Duration::from_secs(1),
            latencies: (1..=100).map(Duration::from_micros).collect(),
        };
        assert_eq!(sample.percentile_us(50.0).round(), 50.0);
        assert_eq!(sample.percentile_us(99.0).round(), 99.0);
        assert_eq!(sample.ops_per_sec(), 100.0);
    }

    #[tokio::test]
    async fn every_call_is_made_once() {
        let seen = parking_lot::Mutex::new(Vec::new());
        let sample = measure(10, 25, 4, &NoProgress, |n| {
            seen.lock().push(n);
            async { Ok::<_, ()>(()) }
        })
        .await
        .unwrap();
        assert_eq!(sample.ops, 25);
        let mut seen = seen.into_inner();
        seen.sort_unstable();
        assert_eq!(seen, (10..35).collect::<Vec<_>>());
    }
}
