//! [`Coordinator::coordinate`]: reserve the key, run the action once, store and replay its result.
//!
//! The flow of one call, with the policy deciding each branch:
//!
//! ```text
//! validate ──invalid──▶ refuse (Error::Invalid) or run unprotected
//!    │
//!    ├─ Run mode ──▶ GET ──completed──▶ replay
//!    │                 └──absent/pending──▶ action ──▶ SET NX GET (store, or adopt the winner)
//!    │
//!    └─ Wait/Raise ──▶ reserve-or-read ──completed──▶ replay
//!                        │      └──pending──▶ Raise: Error::InProgress; Wait: poll again
//!                        ▼
//!                     reserved ──▶ action (renewing the lease) ──ok──▶ complete ──▶ Ran
//!                                                   └──err──▶ release ──▶ Error::Action
//! ```

use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant, SystemTime};

use redis::aio::ConnectionLike;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Stage, StorageCause, StorageError, Unprotected};
use crate::key::{self, DEFAULT_PREFIX, Identifiers, ValidationError};
use crate::observe::{Event, EventKind, Observer};
use crate::policy::{InFlight, InvalidKey, OnStorageError, Ownership, Policy};
use crate::record::{PendingTimes, Record, StoredRecord, utc_timestamp};
use crate::store::{Reservation, Store};

/// Coordinates idempotent calls over one Redis connection.
///
/// Cheap to clone (the connection types are handles to one shared connection); one coordinator
/// serves any number of concurrent calls. `C` is any of redis's async connections:
/// `ConnectionManager`, `MultiplexedConnection`, or `cluster_async::ClusterConnection`.
#[derive(Clone)]
pub struct Coordinator<C> {
    store: Store<C>,
    policy: Policy,
    /// Prepended verbatim to every record key; see [`Coordinator::with_prefix`].
    prefix: String,
    observer: Option<Observer>,
}

/// One call's identity, as the caller states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The operation, e.g. `payment.charge.<tenant>`: keys are scoped to it.
    pub operation: &'a str,
    /// The client's idempotency key, the same on every retry of one intent.
    pub key: &'a str,
    /// How long to keep the result (the TTL policy may round it or refuse to store it).
    pub ttl: Duration,
    /// What the request was (see [`fingerprint_of`](crate::fingerprint_of)); `None` compares by
    /// key alone.
    pub fingerprint: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A request without a fingerprint.
    pub fn new(operation: &'a str, key: &'a str, ttl: Duration) -> Request<'a> {
        Request {
            operation,
            key,
            ttl,
            fingerprint: None,
        }
    }

    /// The same request with a fingerprint.
    pub fn fingerprint(self, fingerprint: &'a str) -> Request<'a> {
        Request {
            fingerprint: Some(fingerprint),
            ..self
        }
    }
}

/// A successful call: the value, and where it came from.
#[derive(Debug)]
pub struct Coordinated<T> {
    /// The action's result: ours, or the stored one.
    pub value: T,
    /// Whether the action ran for this call, and whether a retry is protected.
    pub source: Source,
}

/// Where a [`Coordinated`] value came from.
#[derive(Debug)]
pub enum Source {
    /// Our action ran under our reservation and its result is stored.
    Ran,
    /// A stored result was returned; the action did not run.
    Replayed,
    /// [`InFlight::Run`] only: our action ran, but a concurrent caller stored its result first,
    /// and that result is returned (as idempotency-kit does), so all callers agree on one value.
    Superseded,
    /// The action ran, but a retry is not protected from running it again; this says why.
    Unprotected(Unprotected),
}

/// What the action is handed: the fencing token of its reservation.
///
/// With [`Ownership::Fenced`] every reservation of a key gets a larger token than the previous
/// ones. Pass it to the resource the action writes (a database row's `fence` column, a storage
/// API's precondition) and let that resource refuse a write with a smaller token than it has
/// seen: a holder whose lease lapsed is then stopped *at the resource*, which no lock service can
/// do on its own. `None` when there is no fenced reservation (compatible policy, run mode,
/// unprotected runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub token: Option<u64>,
}

impl Fence {
    const NONE: Fence = Fence { token: None };
}

/// A call after validation.
struct Call<'a> {
    ids: Identifiers<'a>,
    fingerprint: Option<&'a str>,
    ttl: Duration,
    record_key: String,
    /// The fence counter's key with [`Ownership::Fenced`]; empty (and never sent) otherwise.
    fence_key: String,
}

/// Our reservation.
struct Claim {
    /// Our owner token ([`Ownership::Fenced`]), compared by the scripts.
    owner: Option<String>,
    fence: Option<u64>,
    /// The pending record we wrote, kept to rewrite it on renewal.
    pending: Record,
}

/// What reserve-or-read led to.
enum Claimed<T> {
    Ours(Claim),
    Replay(T),
    /// Run the action without a reservation, for this reason.
    Unprotected(Unprotected),
}

/// What a stored value means for this call.
enum Found<T> {
    /// A reservation: another call's action is running.
    Pending,
    /// A stored result for this request, decoded.
    Completed(T),
    /// Nothing we can use, and the policy fails open: run without protection, for this reason.
    RunUnprotected(Unprotected),
}

impl<C> Coordinator<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A coordinator with idempotency-kit's key prefix, `idempotency:`.
    ///
    /// # Panics
    ///
    /// If the policy cannot work: a lease under a millisecond, or a zero renewal interval,
    /// command timeout or poll interval.
    pub fn new(conn: C, policy: Policy) -> Coordinator<C> {
        policy.assert_usable();
        Coordinator {
            store: Store::new(conn, policy.command_timeout, policy.resend_on_dropped),
            policy,
            prefix: DEFAULT_PREFIX.to_owned(),
            observer: None,
        }
    }

    /// Uses another key prefix, verbatim (`"lab:run7:"` gives `lab:run7:<operation>:<key>`).
    /// Services that should replay each other's results must use the same prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Coordinator<C> {
        self.prefix = prefix.into();
        self
    }

    /// Reports every step to `observer` (see [`crate::observe`]).
    pub fn with_observer(
        mut self,
        observer: impl Fn(&Event<'_>) + Send + Sync + 'static,
    ) -> Coordinator<C> {
        self.observer = Some(std::sync::Arc::new(observer));
        self
    }

    /// The policy this coordinator follows.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The Redis key of the record for `operation` and `key`, trimmed as every call trims them.
    /// Not validated: for an invalid pair no call ever writes this key.
    pub fn record_key(&self, operation: &str, key: &str) -> String {
        let ids = Identifiers {
            operation: key::normalise_key(operation),
            key: key::normalise_key(key),
        };
        key::record_key(&self.prefix, ids)
    }

    /// The Redis key of the fence counter beside that record ([`Ownership::Fenced`]).
    pub fn fence_key(&self, operation: &str, key: &str) -> String {
        key::fence_key(&self.prefix, &self.record_key(operation, key))
    }

    /// Reads the record for `operation` and `key` (one `GET`), for inspection: what a retry
    /// would find right now. `Ok(None)` if there is none.
    pub async fn read(&self, operation: &str, key: &str) -> Result<Option<Record>, StorageError> {
        let record_key = self.record_key(operation, key);
        match self.store.read(Stage::Read, &record_key).await? {
            None => Ok(None),
            Some(stored) => parse_owned_record(&stored)
                .map(Some)
                .map_err(|reason| StorageError::new(Stage::Read, StorageCause::Corrupt(reason))),
        }
    }

    /// Runs `action` at most once per `(operation, key)` while its result is stored, and returns
    /// its result to every call with that key: the first call runs it, the others replay it.
    ///
    /// The action gets the reservation's [`Fence`]. Its error is returned as
    /// [`Error::Action`] and never stored: the reservation is released and the next attempt runs
    /// the action again.
    ///
    /// # Cancellation
    ///
    /// Dropping the returned future while the action runs (a client disconnect that cancels the
    /// handler, a crash, a panic in the action) leaves the pending record in place: nothing is
    /// released, nothing renews it. Retries then wait or get [`Error::InProgress`] until the lease
    /// runs out, exactly as after a real crash, which cannot clean up either. (idempotency-kit
    /// deletes the reservation on cancellation; a crashed process could not, and a cancelled
    /// action may well have had its effect.)
    #[tracing::instrument(level = "debug", skip_all, fields(operation = request.operation, key = request.key))]
    pub async fn coordinate<T, E, F, Fut>(
        &self,
        request: Request<'_>,
        action: F,
    ) -> Result<Coordinated<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(Fence) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let ids = match key::validate(request.operation, request.key) {
            Ok(ids) => ids,
            Err(invalid) => return self.invalid(request, invalid, action).await,
        };
        let record_key = key::record_key(&self.prefix, ids);
        let call = Call {
            ids,
            fingerprint: request.fingerprint,
            ttl: request.ttl,
            // Only the fenced scripts use the counter; the compatible policy never builds its key.
            fence_key: match self.policy.ownership {
                Ownership::Fenced => key::fence_key(&self.prefix, &record_key),
                Ownership::Unchecked => String::new(),
            },
            record_key,
        };
        match self.policy.in_flight {
            InFlight::Run => self.run_without_reservation(&call, action).await,
            InFlight::Wait | InFlight::Raise => self.run_with_reservation(&call, action).await,
        }
    }

    /// An invalid operation or key: refuse, or run without touching Redis (idempotency-kit 0.4.1).
    async fn invalid<T, E, F, Fut>(
        &self,
        request: Request<'_>,
        invalid: ValidationError,
        action: F,
    ) -> Result<Coordinated<T>, Error<E>>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.policy.invalid_key {
            InvalidKey::Reject => Err(Error::Invalid(invalid)),
            InvalidKey::RunUnprotected => {
                let why = Unprotected::InvalidKey(invalid);
                self.notify(Event {
                    operation: request.operation,
                    key: request.key,
                    kind: EventKind::RanUnprotected { why: &why },
                });
                let value = action(Fence::NONE).await.map_err(Error::Action)?;
                Ok(Coordinated {
                    value,
                    source: Source::Unprotected(why),
                })
            }
        }
    }

    // ---- Wait and Raise: a reservation before the action -------------------------------------

    async fn run_with_reservation<T, E, F, Fut>(
        &self,
        call: &Call<'_>,
        action: F,
    ) -> Result<Coordinated<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(Fence) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let claim = match self.claim(call).await? {
            Claimed::Ours(claim) => claim,
            Claimed::Replay(value) => {
                return Ok(Coordinated {
                    value,
                    source: Source::Replayed,
                });
            }
            Claimed::Unprotected(why) => {
                let replaces_record = matches!(why, Unprotected::UnusableRecord(_));
                let value = self.run_unprotected(call, &why, action).await?;
                if replaces_record {
                    // As idempotency-kit: overwrite the record nobody can use, so later retries
                    // replay this result instead of each running the action again.
                    self.replace_unusable(call, &value).await;
                }
                return Ok(Coordinated {
                    value,
                    source: Source::Unprotected(why),
                });
            }
        };

        let outcome = self
            .hold_while(call, &claim, action(Fence { token: claim.fence }))
            .await;
        match outcome {
            Ok(value) => {
                let source = self.complete(call, &claim, &value).await;
                Ok(Coordinated { value, source })
            }
            Err(error) => {
                // Failures are not stored: free the key so the retry runs the action again.
                self.release(call, &claim).await;
                Err(Error::Action(error))
            }
        }
    }

    /// Reserve-or-read until the key is ours, its result is found, or the in-flight mode gives up.
    /// One round trip per attempt.
    async fn claim<T, E>(&self, call: &Call<'_>) -> Result<Claimed<T>, Error<E>>
    where
        T: DeserializeOwned,
    {
        // A waiter gives up one lease after it *started* waiting, as idempotency-kit does.
        let deadline = Instant::now() + self.policy.lease;
        let mut reported_in_flight = false;
        loop {
            let (owner, times, attempt) = self.try_reserve(call).await;
            let stored = match attempt {
                Ok(Reservation::Reserved { fence }) => {
                    self.emit(call, EventKind::Reserved { fence });
                    // The record we wrote, kept for the renewals; only now, since most attempts
                    // of a busy key find its result instead.
                    let mut pending = Record::pending_at(
                        call.ids.operation,
                        call.ids.key,
                        call.fingerprint,
                        times,
                        owner.as_deref(),
                    );
                    pending.fence = fence;
                    return Ok(Claimed::Ours(Claim {
                        owner,
                        fence,
                        pending,
                    }));
                }
                Ok(Reservation::Taken(stored)) => stored,
                Err(error) => {
                    return self
                        .failed_before_action(call, error)
                        .map(Claimed::Unprotected);
                }
            };
            match self.examine(call, Stage::Reserve, &stored)? {
                Found::Completed(value) => return Ok(Claimed::Replay(value)),
                Found::RunUnprotected(why) => return Ok(Claimed::Unprotected(why)),
                Found::Pending => {}
            }

            if !reported_in_flight {
                self.emit(call, EventKind::InFlight);
                reported_in_flight = true;
            }
            if self.policy.in_flight == InFlight::Raise {
                return Err(self.in_progress(call));
            }
            let now = Instant::now();
            if now >= deadline {
                self.emit(call, EventKind::WaitTimedOut);
                return Err(self.in_progress(call));
            }
            // The holder finishes, fails or lapses at some unknown moment: look again shortly,
            // but never sleep past the deadline.
            tokio::time::sleep(self.policy.poll_interval.min(deadline - now)).await;
        }
    }

    /// One reservation attempt, one round trip: a fresh pending record (with a fresh owner token
    /// under [`Ownership::Fenced`]) sent as `SET NX` or the fenced script. Returns the token and
    /// the record's times with what Redis answered, so the caller can keep the record if the key
    /// became ours.
    async fn try_reserve(
        &self,
        call: &Call<'_>,
    ) -> (
        Option<String>,
        PendingTimes,
        Result<Reservation, StorageError>,
    ) {
        let owner = match self.policy.ownership {
            Ownership::Fenced => Some(uuid::Uuid::new_v4().simple().to_string()),
            Ownership::Unchecked => None,
        };
        let times = PendingTimes::starting(SystemTime::now(), self.policy.lease);
        let pending = Record::pending_json(
            call.ids.operation,
            call.ids.key,
            call.fingerprint,
            &times,
            owner.as_deref(),
        );
        let attempt = match (self.policy.ownership, &owner) {
            (Ownership::Fenced, Some(owner)) => {
                self.store
                    .reserve_fenced(
                        &call.record_key,
                        &call.fence_key,
                        &pending,
                        owner,
                        self.policy.lease,
                        self.policy.lease + self.policy.fence_retention,
                    )
                    .await
            }
            _ => {
                self.store
                    .reserve(&call.record_key, &pending, self.policy.lease)
                    .await
            }
        };
        let attempt = attempt.map(|sent| {
            if sent.again {
                self.emit(
                    call,
                    EventKind::Resent {
                        stage: Stage::Reserve,
                    },
                );
            }
            sent.reply
        });
        (owner, times, attempt)
    }

    /// Runs the action while keeping the reservation alive (if the policy renews).
    ///
    /// The renewal is not a spawned task: it runs inside this future, beside the action, so it
    /// stops the moment the action finishes or the call is dropped (a crashed holder renews
    /// nothing). A renewal that is in flight when the action finishes is simply abandoned; with
    /// [`Ownership::Fenced`] it is a compare-and-set, so even if Redis executes it late it cannot
    /// land on the result or on another caller's reservation.
    async fn hold_while<T, E>(
        &self,
        call: &Call<'_>,
        claim: &Claim,
        action: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let Some(every) = self.policy.renew_every else {
            return action.await;
        };
        let mut action = pin!(action);
        let mut renewal = pin!(self.keep_renewed(call, claim, every));
        tokio::select! {
            // The action first: once it is done, a renewal that is also due is pointless.
            biased;
            outcome = &mut action => outcome,
            // The renewal loop only ends when the lease is lost; the action goes on regardless
            // (it may be past the point of no return), and completion will find out.
            () = &mut renewal => action.await,
        }
    }

    /// Renews the reservation every `every` until it turns out not to be ours any more.
    async fn keep_renewed(&self, call: &Call<'_>, claim: &Claim, every: Duration) {
        let mut pending = claim.pending.clone();
        loop {
            tokio::time::sleep(every).await;
            pending.expires_at = utc_timestamp(SystemTime::now() + self.policy.lease);
            let renewed = match (&self.policy.ownership, &claim.owner) {
                (Ownership::Fenced, Some(owner)) => {
                    self.store
                        .renew_fenced(
                            &call.record_key,
                            &call.fence_key,
                            owner,
                            &pending.to_json(),
                            self.policy.lease,
                            self.policy.lease + self.policy.fence_retention,
                        )
                        .await
                }
                _ => {
                    self.store
                        .renew(&call.record_key, &pending.to_json(), self.policy.lease)
                        .await
                }
            };
            match renewed {
                Ok(true) => self.emit(call, EventKind::Renewed { fence: claim.fence }),
                Ok(false) => {
                    self.emit(
                        call,
                        EventKind::LeaseLost {
                            stage: Stage::Renew,
                            fence: claim.fence,
                        },
                    );
                    return;
                }
                // Keep trying: one lost renewal still leaves most of the lease. If Redis stays
                // away for the whole lease, the reservation lapses, which is what a lease is for.
                Err(error) => self.emit(call, EventKind::StorageError { error: &error }),
            }
        }
    }

    /// Stores the result over our reservation and says what the call's source is.
    ///
    /// A storage failure here is never an error for the caller: the action has run, and an error
    /// would make the client retry an operation that happened. It becomes
    /// [`Source::Unprotected`] instead. A failed write is not followed by a `DEL` (as
    /// idempotency-kit does): the `DEL` would most likely fail too, costing another timeout, and
    /// if the timed-out `SET` did land, the `DEL` would erase the result. The reservation lapses
    /// with its lease.
    async fn complete<T: Serialize>(&self, call: &Call<'_>, claim: &Claim, value: &T) -> Source {
        let Some(ttl) = self.policy.ttl.resolve(call.ttl) else {
            // Not storable: free the key rather than leave a reservation no result will replace.
            self.release(call, claim).await;
            let why = Unprotected::TtlOutOfRange {
                requested: call.ttl,
            };
            return self.unprotected_after_action(call, why);
        };
        let mut record = match self.completed_record(call, value, ttl) {
            Ok(record) => record,
            Err(why) => {
                self.release(call, claim).await;
                return self.unprotected_after_action(call, why);
            }
        };
        // Kept in the stored result too, so an inspection shows which reservation wrote it.
        record.owner = claim.owner.clone();
        record.fence = claim.fence;

        let stored = match (&self.policy.ownership, &claim.owner) {
            (Ownership::Fenced, Some(owner)) => {
                self.store
                    .complete_fenced(
                        &call.record_key,
                        &call.fence_key,
                        owner,
                        &record.to_json(),
                        ttl,
                        ttl + self.policy.fence_retention,
                    )
                    .await
            }
            _ => self
                .store
                .overwrite(Stage::Complete, &call.record_key, &record.to_json(), ttl)
                .await
                .map(|sent| crate::store::Sent {
                    reply: true,
                    again: sent.again,
                }),
        };
        let stored = stored.map(|sent| {
            if sent.again {
                self.emit(
                    call,
                    EventKind::Resent {
                        stage: Stage::Complete,
                    },
                );
            }
            sent.reply
        });
        match stored {
            Ok(true) => {
                self.emit(call, EventKind::Completed { fence: claim.fence });
                Source::Ran
            }
            Ok(false) => {
                self.emit(
                    call,
                    EventKind::LeaseLost {
                        stage: Stage::Complete,
                        fence: claim.fence,
                    },
                );
                self.unprotected_after_action(call, Unprotected::LeaseLost)
            }
            Err(error) => {
                self.emit(call, EventKind::StorageError { error: &error });
                self.unprotected_after_action(call, Unprotected::Storage(error))
            }
        }
    }

    /// Deletes our reservation (plain `DEL`, or compare-and-delete when fenced). Failures are
    /// reported, not returned: the caller is already returning something more important.
    async fn release(&self, call: &Call<'_>, claim: &Claim) {
        let released = match (&self.policy.ownership, &claim.owner) {
            (Ownership::Fenced, Some(owner)) => {
                self.store.release_fenced(&call.record_key, owner).await
            }
            _ => self.store.delete(&call.record_key).await.map(|()| true),
        };
        match released {
            Ok(true) => self.emit(call, EventKind::Released { fence: claim.fence }),
            Ok(false) => self.emit(
                call,
                EventKind::LeaseLost {
                    stage: Stage::Release,
                    fence: claim.fence,
                },
            ),
            Err(error) => self.emit(call, EventKind::StorageError { error: &error }),
        }
    }

    /// Overwrites an unusable record with our result (plain `SET`, idempotency-kit's `replace`).
    async fn replace_unusable<T: Serialize>(&self, call: &Call<'_>, value: &T) {
        let Some(ttl) = self.policy.ttl.resolve(call.ttl) else {
            return;
        };
        let Ok(record) = self.completed_record(call, value, ttl) else {
            return;
        };
        match self
            .store
            .overwrite(Stage::Complete, &call.record_key, &record.to_json(), ttl)
            .await
        {
            Ok(_) => self.emit(call, EventKind::Completed { fence: None }),
            Err(error) => self.emit(call, EventKind::StorageError { error: &error }),
        }
    }

    // ---- Run mode: no reservation --------------------------------------------------------------

    async fn run_without_reservation<T, E, F, Fut>(
        &self,
        call: &Call<'_>,
        action: F,
    ) -> Result<Coordinated<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(Fence) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        // One GET: a stored result is replayed; a reservation is ignored (that is run mode).
        let found = match self.store.read(Stage::Read, &call.record_key).await {
            Ok(None) => None,
            Ok(Some(stored)) => Some(self.examine(call, Stage::Read, &stored)?),
            Err(error) => Some(Found::RunUnprotected(
                self.failed_before_action(call, error)?,
            )),
        };
        match found {
            Some(Found::Completed(value)) => {
                return Ok(Coordinated {
                    value,
                    source: Source::Replayed,
                });
            }
            Some(Found::RunUnprotected(why)) => {
                let value = self.run_unprotected(call, &why, action).await?;
                return Ok(Coordinated {
                    value,
                    source: Source::Unprotected(why),
                });
            }
            Some(Found::Pending) => self.emit(call, EventKind::InFlight),
            None => {}
        }

        let value = action(Fence::NONE).await.map_err(Error::Action)?;
        let source = self.store_unreserved(call, &value).await;
        match source {
            Ok(source) => Ok(Coordinated { value, source }),
            Err(winner) => {
                self.emit(call, EventKind::Superseded);
                Ok(Coordinated {
                    value: winner,
                    source: Source::Superseded,
                })
            }
        }
    }

    /// Stores a run-mode result if the key is free (`SET NX GET`). `Err(winner)` when another
    /// caller's completed result for the same request holds the key: adopt it.
    async fn store_unreserved<T>(&self, call: &Call<'_>, value: &T) -> Result<Source, T>
    where
        T: Serialize + DeserializeOwned,
    {
        let Some(ttl) = self.policy.ttl.resolve(call.ttl) else {
            let why = Unprotected::TtlOutOfRange {
                requested: call.ttl,
            };
            return Ok(self.unprotected_after_action(call, why));
        };
        let record = match self.completed_record(call, value, ttl) {
            Ok(record) => record,
            Err(why) => return Ok(self.unprotected_after_action(call, why)),
        };
        match self
            .store
            .store_if_absent(&call.record_key, &record.to_json(), ttl)
            .await
        {
            Ok(None) => {
                self.emit(call, EventKind::Completed { fence: None });
                Ok(Source::Ran)
            }
            Ok(Some(stored)) => {
                let winner = parse_record(&stored).ok().filter(|winner| {
                    !winner.is_pending()
                        && !fingerprints_differ(call.fingerprint, winner.fingerprint.as_deref())
                });
                match winner.map(|winner| winner.decode_result::<T>()) {
                    Some(Ok(value)) => Err(value),
                    _ => Ok(self.unprotected_after_action(call, Unprotected::KeyTaken)),
                }
            }
            Err(error) => {
                self.emit(call, EventKind::StorageError { error: &error });
                Ok(self.unprotected_after_action(call, Unprotected::Storage(error)))
            }
        }
    }

    // ---- Shared steps --------------------------------------------------------------------------

    /// Runs the action with no reservation and no fence, after reporting why.
    async fn run_unprotected<T, E, F, Fut>(
        &self,
        call: &Call<'_>,
        why: &Unprotected,
        action: F,
    ) -> Result<T, Error<E>>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.emit(call, EventKind::RanUnprotected { why });
        action(Fence::NONE).await.map_err(Error::Action)
    }

    /// What a stored value means for this call: a reservation, a result to replay (decoded), or
    /// something unusable. Checks the fingerprint first.
    fn examine<T, E>(
        &self,
        call: &Call<'_>,
        stage: Stage,
        stored: &[u8],
    ) -> Result<Found<T>, Error<E>>
    where
        T: DeserializeOwned,
    {
        let record = match parse_record(stored) {
            Ok(record) => record,
            Err(reason) => {
                return self
                    .unusable(call, stage, reason)
                    .map(Found::RunUnprotected);
            }
        };
        // Before the pending check on purpose (as idempotency-kit): a caller with another
        // request is refused now, not handed someone else's result after waiting.
        self.check_fingerprint(call, &record)?;
        if record.is_pending() {
            return Ok(Found::Pending);
        }
        match record.decode_result::<T>() {
            Ok(value) => {
                self.emit(call, EventKind::Replayed);
                Ok(Found::Completed(value))
            }
            Err(error) => {
                let reason = format!("the stored result does not decode: {error}");
                self.unusable(call, stage, reason)
                    .map(Found::RunUnprotected)
            }
        }
    }

    /// Redis failed before the action: fail closed, or say why the action runs unprotected.
    fn failed_before_action<E>(
        &self,
        call: &Call<'_>,
        error: StorageError,
    ) -> Result<Unprotected, Error<E>> {
        self.emit(call, EventKind::StorageError { error: &error });
        match self.policy.on_storage_error {
            OnStorageError::Fail => Err(Error::Storage(error)),
            OnStorageError::RunUnprotected => Ok(Unprotected::Storage(error)),
        }
    }

    /// The key holds something we cannot use. Failing open, it is as good as no record; failing
    /// closed, it is a storage error (the action must not run when we cannot tell whether it ran).
    fn unusable<E>(
        &self,
        call: &Call<'_>,
        stage: Stage,
        reason: String,
    ) -> Result<Unprotected, Error<E>> {
        match self.policy.on_storage_error {
            OnStorageError::Fail => {
                let error = StorageError::new(stage, StorageCause::Corrupt(reason));
                self.emit(call, EventKind::StorageError { error: &error });
                Err(Error::Storage(error))
            }
            OnStorageError::RunUnprotected => Ok(Unprotected::UnusableRecord(reason)),
        }
    }

    /// Reports an after-the-fact reason and turns it into the call's source.
    fn unprotected_after_action(&self, call: &Call<'_>, why: Unprotected) -> Source {
        self.emit(call, EventKind::RanUnprotected { why: &why });
        Source::Unprotected(why)
    }

    /// The completed record for `value`, or why it cannot be stored.
    fn completed_record<T: Serialize>(
        &self,
        call: &Call<'_>,
        value: &T,
        ttl: Duration,
    ) -> Result<Record, Unprotected> {
        let result = serde_json::value::to_raw_value(value)
            .map_err(|error| Unprotected::UnstorableResult(error.to_string()))?;
        Ok(Record::completed(
            call.ids.operation,
            call.ids.key,
            call.fingerprint,
            result,
            SystemTime::now(),
            ttl,
        ))
    }

    /// `KeyReused` when both sides have a fingerprint and they differ; with `None` on either side
    /// the key alone decides (idempotency-kit's rule).
    fn check_fingerprint<E>(
        &self,
        call: &Call<'_>,
        record: &StoredRecord<'_>,
    ) -> Result<(), Error<E>> {
        if fingerprints_differ(call.fingerprint, record.fingerprint.as_deref()) {
            self.emit(call, EventKind::KeyReused);
            return Err(Error::KeyReused {
                operation: call.ids.operation.to_owned(),
                key: call.ids.key.to_owned(),
            });
        }
        Ok(())
    }

    fn in_progress<E>(&self, call: &Call<'_>) -> Error<E> {
        Error::InProgress {
            operation: call.ids.operation.to_owned(),
            key: call.ids.key.to_owned(),
        }
    }

    fn emit(&self, call: &Call<'_>, kind: EventKind<'_>) {
        self.notify(Event {
            operation: call.ids.operation,
            key: call.ids.key,
            kind,
        });
    }

    fn notify(&self, event: Event<'_>) {
        if let Some(observer) = &self.observer {
            observer(&event);
        }
    }
}

impl<C> std::fmt::Debug for Coordinator<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("policy", &self.policy)
            .field("prefix", &self.prefix)
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

fn fingerprints_differ(ours: Option<&str>, stored: Option<&str>) -> bool {
    matches!((ours, stored), (Some(ours), Some(stored)) if ours != stored)
}

/// A stored value as a record, or why it is not one.
fn parse_record(stored: &[u8]) -> Result<StoredRecord<'_>, String> {
    StoredRecord::from_json(stored_text(stored)?).map_err(not_a_record)
}

/// A stored value as a record of its own (for [`Coordinator::read`]), or why it is not one.
fn parse_owned_record(stored: &[u8]) -> Result<Record, String> {
    Record::from_json(stored_text(stored)?).map_err(not_a_record)
}

fn stored_text(stored: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(stored).map_err(|_| "the value is not UTF-8".to_owned())
}

fn not_a_record(error: serde_json::Error) -> String {
    format!("not an idempotency record: {error}")
}
