//! A call held inside a service: "the first call is still charging while the second arrives".
//!
//! ```text
//! let first = ctx.hold(IN_ACTION).call(pay(…)).await?;   // sent, and held at the checkpoint
//! let second = first.meanwhile(pay(…)).await?;           // another call while it is held
//! let first = first.release().await;                     // let it finish: its answer
//! ```
//!
//! [`Hold::call`] drives the call until the service reaches the checkpoint, within
//! [`HOLD_LIMIT`]; a call that never gets there, or that finishes without passing it, is a
//! broken script, said as such, never a story that goes on as if the call were held. The held
//! call's future stays with the [`Held`], so nothing can await it by mistake before it is
//! released; dropping the `Held` (a scenario that fails half-way) releases the service's handler.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use lab_core::checkpoint;

use crate::ScenarioError;

/// A service that never reaches its checkpoint within this is broken, not slow.
pub const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// A checkpoint ready to hold the next call that reaches it: [`crate::Ctx::hold`].
#[must_use = "a hold holds nothing until a call is sent into it: use `call`"]
pub struct Hold {
    inner: checkpoint::Hold,
}

impl Hold {
    pub(crate) fn new(inner: checkpoint::Hold) -> Hold {
        Hold { inner }
    }

    /// Drives `call` until the service holds it at the checkpoint.
    pub async fn call<F: Future>(self, call: F) -> Result<Held<F>, ScenarioError> {
        let mut call = Box::pin(call);
        let point = self.inner.point().to_string();
        tokio::select! {
            inside = self.inner.entered(HOLD_LIMIT) => {
                inside.map_err(|missed| ScenarioError::Broken(missed.to_string()))?;
            }
            _ = &mut call => {
                return Err(ScenarioError::Broken(format!(
                    "the call finished before it reached the checkpoint {point}"
                )));
            }
        }
        Ok(Held {
            hold: self.inner,
            call,
        })
    }
}

/// A call held at a checkpoint: made by [`Hold::call`].
#[must_use = "a held call stays held until released"]
pub struct Held<F: Future> {
    hold: checkpoint::Hold,
    call: Pin<Box<F>>,
}

impl<F: Future> Held<F> {
    /// Runs `other` while the call stays held; a held call that finished meanwhile (released by
    /// something else) is a broken script.
    pub async fn meanwhile<T>(
        &mut self,
        other: impl Future<Output = T>,
    ) -> Result<T, ScenarioError> {
        tokio::select! {
            done = other => Ok(done),
            _ = &mut self.call => Err(ScenarioError::Broken(format!(
                "the call held at {} was released early",
                self.hold.point()
            ))),
        }
    }

    /// Lets the call go on, and waits for its end.
    pub async fn release(self) -> F::Output {
        let Held { hold, call } = self;
        hold.release();
        call.await
    }

    /// The caller dies where it is held (a worker process that crashes): its future is dropped
    /// without running another step, then the checkpoint is cleared.
    pub fn crash(self) {
        let Held { hold, call } = self;
        drop(call);
        drop(hold);
    }

    /// The client gives up: it waits `patience` for an answer while the service holds the
    /// call, then abandons the call (its connection closes, as a client timeout closes it).
    /// The service's handler is still held; what happens to it is the server's choice. The
    /// patience is the client's own timer, not an ordering: the hold orders the story.
    pub async fn give_up_after(mut self, patience: Duration) -> Result<StillHeld, ScenarioError> {
        self.meanwhile(tokio::time::sleep(patience)).await?;
        let Held { hold, call } = self;
        drop(call);
        Ok(StillHeld { hold })
    }
}

/// A handler still held at a checkpoint after its client went away: made by
/// [`Held::give_up_after`]. Dropping it releases the handler.
#[must_use = "the handler stays held until released"]
pub struct StillHeld {
    hold: checkpoint::Hold,
}

impl StillHeld {
    /// Waits until the server has cancelled the held handler (dropped its work because the
    /// client's connection closed), within [`HOLD_LIMIT`]. A server that keeps the work going
    /// never gets here: a broken script, said as such.
    pub async fn cancelled(&self) -> Result<(), ScenarioError> {
        self.hold.abandoned(HOLD_LIMIT).await.map_err(|missed| {
            ScenarioError::Broken(format!(
                "the handler held at {} was not cancelled when its client left",
                missed.point
            ))
        })
    }

    /// Lets the handler go on.
    pub fn release(self) {
        self.hold.release();
    }
}

/// Tells when a call has passed a checkpoint (it is not held): [`crate::Ctx::notice`].
#[must_use = "a notice tells nothing unless you wait with `passed`"]
pub struct Notice {
    inner: checkpoint::Notice,
}

impl Notice {
    pub(crate) fn new(inner: checkpoint::Notice) -> Notice {
        Notice { inner }
    }

    /// Waits until a call has passed the checkpoint (maybe already), within [`HOLD_LIMIT`].
    pub async fn passed(&self) -> Result<(), ScenarioError> {
        self.inner
            .passed(HOLD_LIMIT)
            .await
            .map_err(|missed| ScenarioError::Broken(missed.to_string()))
    }
}
