//! Checkpoints: named points inside the bundled services where a scenario can intervene.
//!
//! A service calls [`Checkpoints::reached`] at the moments the lessons talk about ("report
//! service: about to insert", "committed, about to respond"). Normally nothing is installed and
//! the call returns at once. A scenario installs a hook to order concurrent work: a barrier that
//! holds two requests until both are inside the handler, so PostgreSQL's UNIQUE constraint, not
//! luck, decides the race. Nothing in the lab waits on the clock to get an ordering right.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;

use tokio::sync::Barrier;

/// A boxed future, so hooks of different types can live in one map.
pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What runs when a checkpoint is reached.
pub type Hook = Arc<dyn Fn() -> HookFuture + Send + Sync>;

/// The checkpoint registry of one scenario run, shared by the scenario and its services.
#[derive(Clone, Default)]
pub struct Checkpoints {
    hooks: Arc<Mutex<HashMap<String, Hook>>>,
}

impl Checkpoints {
    pub fn new() -> Checkpoints {
        Checkpoints::default()
    }

    /// Called by a service at a named point; runs the hook installed there, if any.
    pub async fn reached(&self, point: &str) {
        // Clone the hook out so the lock is not held while the hook waits.
        let hook = self.hooks.lock().get(point).cloned();
        if let Some(hook) = hook {
            hook().await;
        }
    }

    /// Installs a hook at `point`, replacing any other.
    pub fn install(&self, point: &str, hook: Hook) {
        self.hooks.lock().insert(point.to_string(), hook);
    }

    /// Holds every caller at `point` until `parties` callers are there, then lets all go on.
    pub fn barrier(&self, point: &str, parties: usize) {
        let barrier = Arc::new(Barrier::new(parties));
        self.install(
            point,
            Arc::new(move || {
                let barrier = barrier.clone();
                Box::pin(async move {
                    barrier.wait().await;
                })
            }),
        );
    }

    /// Removes the hook at `point`: later callers pass straight through.
    pub fn clear(&self, point: &str) {
        self.hooks.lock().remove(point);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_barrier_holds_callers_until_all_arrive() {
        let points = Checkpoints::new();
        points.barrier("p", 2);
        let passed = Arc::new(AtomicUsize::new(0));
        let first = {
            let (points, passed) = (points.clone(), passed.clone());
            tokio::spawn(async move {
                points.reached("p").await;
                passed.fetch_add(1, Ordering::SeqCst);
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(passed.load(Ordering::SeqCst), 0, "one caller must wait");
        points.reached("p").await;
        first.await.unwrap();
        assert_eq!(passed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn unknown_or_cleared_points_pass() {
        let points = Checkpoints::new();
        points.reached("nothing").await;
        points.barrier("p", 5);
        points.clear("p");
        points.reached("p").await;
    }
}
