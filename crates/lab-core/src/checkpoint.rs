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

use crate::{Event, Narrator};

/// A boxed future, so hooks of different types can live in one map.
pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What runs when a checkpoint is reached.
pub type Hook = Arc<dyn Fn() -> HookFuture + Send + Sync>;

/// The checkpoint registry of one scenario run, shared by the scenario and its services.
#[derive(Clone, Default)]
pub struct Checkpoints {
    hooks: Arc<Mutex<HashMap<String, Hook>>>,
    /// Told when a service reaches a point that has a hook ([`Event::Checkpoint`]), so pictures
    /// can mark where the scenario held or ordered a request.
    narrator: Option<Narrator>,
}

impl Checkpoints {
    pub fn new() -> Checkpoints {
        Checkpoints::default()
    }

    /// A registry that reports every point reached with a hook installed to `narrator`.
    pub fn narrated(narrator: Narrator) -> Checkpoints {
        Checkpoints {
            hooks: Arc::default(),
            narrator: Some(narrator),
        }
    }

    /// Called by a service at a named point; runs the hook installed there, if any.
    pub async fn reached(&self, point: &str) {
        // Clone the hook out so the lock is not held while the hook waits.
        let hook = self.hooks.lock().get(point).cloned();
        if let Some(hook) = hook {
            if let Some(narrator) = &self.narrator {
                narrator.emit(Event::Checkpoint {
                    point: point.to_string(),
                });
            }
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
    use std::time::Duration;

    /// With tokio's clock paused, time moves only when every task is blocked: a timeout that
    /// fires proves the caller was held, not merely slow.
    #[tokio::test(start_paused = true)]
    async fn a_barrier_holds_callers_until_all_arrive() {
        let points = Checkpoints::new();
        points.barrier("p", 2);
        let mut first = {
            let points = points.clone();
            tokio::spawn(async move { points.reached("p").await })
        };
        let alone = tokio::time::timeout(Duration::from_secs(60), &mut first).await;
        assert!(alone.is_err(), "one caller must wait for the other");
        tokio::time::timeout(Duration::from_secs(60), points.reached("p"))
            .await
            .expect("the second caller completes the barrier");
        tokio::time::timeout(Duration::from_secs(60), first)
            .await
            .expect("the first caller is released")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_or_cleared_points_pass() {
        let points = Checkpoints::new();
        let pass = |point: &'static str| {
            let points = points.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(60), points.reached(point))
                    .await
                    .is_ok()
            }
        };
        assert!(pass("nothing").await, "an unknown point holds nobody");
        points.barrier("p", 5);
        points.clear("p");
        assert!(pass("p").await, "a cleared point holds nobody");
    }

    #[tokio::test(start_paused = true)]
    async fn an_installed_hook_runs_where_the_point_is_reached() {
        let points = Checkpoints::new();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        points.install("p", {
            let ran = ran.clone();
            Arc::new(move || {
                let ran = ran.clone();
                Box::pin(async move {
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
        });
        points.reached("p").await;
        points.reached("other").await;
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn only_points_with_a_hook_are_reported() {
        let narrator = Narrator::recording();
        let points = Checkpoints::narrated(narrator.clone());
        points.reached("nobody.holds").await;
        points.barrier("p", 1);
        points.reached("p").await;
        assert_eq!(
            narrator.events(),
            vec![Event::Checkpoint { point: "p".into() }]
        );
    }
}
