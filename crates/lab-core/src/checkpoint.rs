//! Checkpoints: named points inside the bundled services where a scenario can intervene.
//!
//! A service calls [`Checkpoints::reached`] at the moments the lessons talk about ("report
//! service: about to insert", "committed, about to respond"). Normally nothing is installed and
//! the call returns at once. A scenario installs a hook to order concurrent work: a barrier that
//! holds two requests until both are inside the handler, so PostgreSQL's UNIQUE constraint, not
//! luck, decides the race. Nothing in the lab waits on the clock to get an ordering right.
//!
//! Three shapes cover what the lessons need:
//!
//! - [`Checkpoints::barrier`]: hold every caller until N are there (two requests really overlap);
//! - [`Checkpoints::hold`]: hold the first caller until the scenario lets it go ("the first call
//!   is still charging while the second arrives"); [`Hold::entered`] says when it is there;
//! - [`Checkpoints::hold_all`]: hold every caller until the scenario lets them all go ("worker A's
//!   call, and every retry its client sends meanwhile, waits while its lease runs out");
//! - [`Checkpoints::notice`]: let callers pass, and tell the scenario that one did ("the service
//!   has its answer ready").
//!
//! Waiting for a caller is bounded: a service that never reaches its checkpoint is broken, not
//! slow, and [`NotReached`] says which point it never reached. The bound is part of the wait, so
//! no caller can forget it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use tokio::sync::{Barrier, Notify, watch};

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

    /// Holds the first caller that reaches `point` until the [`Hold`] is released (or dropped);
    /// callers after it pass straight through.
    pub fn hold(&self, point: &str) -> Hold {
        let entered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let abandoned = Arc::new(Notify::new());
        let taken = Arc::new(AtomicBool::new(false));
        self.install(point, {
            let (entered, release, abandoned) =
                (entered.clone(), release.clone(), abandoned.clone());
            Arc::new(move || {
                let (entered, release, taken) = (entered.clone(), release.clone(), taken.clone());
                let abandoned = abandoned.clone();
                Box::pin(async move {
                    // Only the first caller is held: the hook is cleared once it is inside, and
                    // one that raced in before that goes on.
                    if taken.swap(true, Ordering::SeqCst) {
                        return;
                    }
                    // Told if this future is dropped while it waits: the caller's own work was
                    // cancelled (a server that drops a request whose client went away).
                    let mut dropped = NotifyOnDrop(Some(abandoned));
                    entered.notify_one();
                    release.notified().await;
                    dropped.0 = None;
                })
            })
        });
        Hold {
            checkpoints: self.clone(),
            point: point.to_string(),
            entered,
            release,
            abandoned,
        }
    }

    /// Holds every caller that reaches `point` (a request, and each retry its client sends while
    /// it waits) until the [`HoldAll`] is released or dropped; then they all go on.
    pub fn hold_all(&self, point: &str) -> HoldAll {
        let (open, opened) = watch::channel(false);
        let arrivals = Arc::new(AtomicUsize::new(0));
        let entered = Arc::new(Notify::new());
        self.install(point, {
            let (arrivals, entered) = (arrivals.clone(), entered.clone());
            Arc::new(move || {
                let (arrivals, entered) = (arrivals.clone(), entered.clone());
                let mut opened = opened.clone();
                Box::pin(async move {
                    arrivals.fetch_add(1, Ordering::SeqCst);
                    entered.notify_one();
                    // Returns at once once the hold is open, also for a caller that cloned the
                    // hook just before it was cleared.
                    let _ = opened.wait_for(|open| *open).await;
                })
            })
        });
        HoldAll {
            checkpoints: self.clone(),
            point: point.to_string(),
            arrivals,
            entered,
            open,
        }
    }

    /// Lets callers of `point` pass, and tells when one has ([`Notice::passed`]).
    pub fn notice(&self, point: &str) -> Notice {
        let passed = Arc::new(Notify::new());
        self.install(point, {
            let passed = passed.clone();
            Arc::new(move || {
                let passed = passed.clone();
                // A permit is kept if nobody waits yet: a caller that passed before the
                // scenario asked is still seen.
                Box::pin(async move { passed.notify_one() })
            })
        });
        Notice {
            checkpoints: self.clone(),
            point: point.to_string(),
            passed,
        }
    }
}

/// A caller never reached a checkpoint within the bound: the service (or the scenario's script)
/// is broken, not slow.
#[derive(Debug, Clone, thiserror::Error)]
#[error("nothing reached the checkpoint {point} within {} s", .limit.as_secs_f64())]
pub struct NotReached {
    pub point: String,
    pub limit: Duration,
}

/// The first caller of a point, held there: made by [`Checkpoints::hold`]. Released with
/// [`Hold::release`], or when dropped (a scenario that fails half-way never leaves a request
/// hanging).
#[must_use = "a hold holds nothing until a caller enters it: wait with `entered`"]
pub struct Hold {
    checkpoints: Checkpoints,
    point: String,
    entered: Arc<Notify>,
    release: Arc<Notify>,
    abandoned: Arc<Notify>,
}

/// Notifies when dropped, unless disarmed (set to `None`) first.
struct NotifyOnDrop(Option<Arc<Notify>>);

impl Drop for NotifyOnDrop {
    fn drop(&mut self) {
        if let Some(notify) = self.0.take() {
            notify.notify_one();
        }
    }
}

impl Hold {
    /// Waits until a caller is held at the point, at most `limit`. From then on, later callers
    /// pass straight through.
    pub async fn entered(&self, limit: Duration) -> Result<(), NotReached> {
        let inside = tokio::time::timeout(limit, self.entered.notified()).await;
        self.checkpoints.clear(&self.point);
        inside.map_err(|_| NotReached {
            point: self.point.clone(),
            limit,
        })
    }

    /// Waits until the held caller is gone without being released, at most `limit`: its work
    /// was cancelled while it waited here (its future dropped).
    pub async fn abandoned(&self, limit: Duration) -> Result<(), NotReached> {
        tokio::time::timeout(limit, self.abandoned.notified())
            .await
            .map_err(|_| NotReached {
                point: self.point.clone(),
                limit,
            })
    }

    /// The point it holds.
    pub fn point(&self) -> &str {
        &self.point
    }

    /// Lets the held caller go on.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.checkpoints.clear(&self.point);
        // A permit, if the caller is not waiting yet: it then goes on at once.
        self.release.notify_one();
    }
}

/// Every caller of a point, held there until it opens: made by [`Checkpoints::hold_all`].
/// Released with [`HoldAll::release`], or when dropped.
#[must_use = "a hold holds nothing until a caller enters it: wait with `entered`"]
pub struct HoldAll {
    checkpoints: Checkpoints,
    point: String,
    arrivals: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    open: watch::Sender<bool>,
}

impl HoldAll {
    /// Waits until a caller is held at the point (maybe already), at most `limit`. Later callers
    /// are held too.
    pub async fn entered(&self, limit: Duration) -> Result<(), NotReached> {
        let first = async {
            while self.arrivals() == 0 {
                self.entered.notified().await;
            }
        };
        tokio::time::timeout(limit, first)
            .await
            .map_err(|_| NotReached {
                point: self.point.clone(),
                limit,
            })
    }

    /// How many callers have reached the point since the hold was made.
    pub fn arrivals(&self) -> usize {
        self.arrivals.load(Ordering::SeqCst)
    }

    /// The point it holds.
    pub fn point(&self) -> &str {
        &self.point
    }

    /// Lets every held caller go on, and every later one pass.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for HoldAll {
    fn drop(&mut self) {
        self.checkpoints.clear(&self.point);
        self.open.send_replace(true);
    }
}

/// Tells when a caller has passed a point: made by [`Checkpoints::notice`]. The point is cleared
/// when it is dropped.
#[must_use = "a notice tells nothing unless you wait with `passed`"]
pub struct Notice {
    checkpoints: Checkpoints,
    point: String,
    passed: Arc<Notify>,
}

impl Notice {
    /// Waits until a caller has passed the point (maybe already), at most `limit`.
    pub async fn passed(&self, limit: Duration) -> Result<(), NotReached> {
        tokio::time::timeout(limit, self.passed.notified())
            .await
            .map_err(|_| NotReached {
                point: self.point.clone(),
                limit,
            })
    }
}

impl Drop for Notice {
    fn drop(&mut self) {
        self.checkpoints.clear(&self.point);
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
    async fn a_hold_all_holds_a_caller_and_its_retries_until_released() {
        let points = Checkpoints::new();
        let hold = points.hold_all("p");
        let spawn = || {
            let points = points.clone();
            tokio::spawn(async move { points.reached("p").await })
        };
        let mut first = spawn();
        hold.entered(Duration::from_secs(60))
            .await
            .expect("the first caller is held");
        let mut retry = spawn();
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut retry)
                .await
                .is_err(),
            "a later caller is held too"
        );
        assert_eq!(hold.arrivals(), 2);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut first)
                .await
                .is_err()
        );
        hold.release();
        for caller in [first, retry] {
            tokio::time::timeout(Duration::from_secs(60), caller)
                .await
                .expect("released")
                .unwrap();
        }
        tokio::time::timeout(Duration::from_secs(60), points.reached("p"))
            .await
            .expect("after the release, callers pass");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_all_that_nobody_enters_says_so() {
        let points = Checkpoints::new();
        let hold = points.hold_all("p");
        assert!(hold.entered(Duration::from_secs(5)).await.is_err());
        assert_eq!(hold.arrivals(), 0);
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
    async fn a_hold_keeps_the_first_caller_until_released_and_lets_later_ones_pass() {
        let points = Checkpoints::new();
        let hold = points.hold("p");
        let mut first = {
            let points = points.clone();
            tokio::spawn(async move { points.reached("p").await })
        };
        hold.entered(Duration::from_secs(60))
            .await
            .expect("the first caller is held");
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut first)
                .await
                .is_err(),
            "held until released"
        );
        tokio::time::timeout(Duration::from_secs(60), points.reached("p"))
            .await
            .expect("a later caller passes");
        hold.release();
        tokio::time::timeout(Duration::from_secs(60), first)
            .await
            .expect("released")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_nobody_enters_says_which_point_and_a_dropped_one_holds_nobody() {
        let points = Checkpoints::new();
        let hold = points.hold("payments.in_action");
        let missed = hold.entered(Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(missed.point, "payments.in_action");
        assert_eq!(missed.limit, Duration::from_secs(10));
        drop(hold);
        tokio::time::timeout(
            Duration::from_secs(60),
            points.reached("payments.in_action"),
        )
        .await
        .expect("a dropped hold holds nobody");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_tells_when_its_caller_was_cancelled_but_not_when_it_was_released() {
        let points = Checkpoints::new();
        let hold = points.hold("p");
        let caller = {
            let points = points.clone();
            tokio::spawn(async move { points.reached("p").await })
        };
        hold.entered(Duration::from_secs(1)).await.unwrap();
        assert!(hold.abandoned(Duration::from_millis(50)).await.is_err());
        caller.abort();
        hold.abandoned(Duration::from_secs(1)).await.unwrap();

        let hold = points.hold("q");
        let caller = {
            let points = points.clone();
            tokio::spawn(async move { points.reached("q").await })
        };
        hold.entered(Duration::from_secs(1)).await.unwrap();
        let abandoned = hold.abandoned.clone();
        hold.release();
        caller.await.unwrap();
        let told = tokio::time::timeout(Duration::from_millis(50), abandoned.notified()).await;
        assert!(told.is_err(), "a released caller was reported as cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_notice_sees_a_caller_that_passed_before_it_was_asked() {
        let points = Checkpoints::new();
        let notice = points.notice("p");
        tokio::time::timeout(Duration::from_secs(60), points.reached("p"))
            .await
            .expect("a noticed point holds nobody");
        notice
            .passed(Duration::from_secs(1))
            .await
            .expect("seen, though it passed first");
        assert!(notice.passed(Duration::from_secs(1)).await.is_err());
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
