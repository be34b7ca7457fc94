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
