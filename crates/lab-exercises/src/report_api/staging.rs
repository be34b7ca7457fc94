//! The moment of `race` and `burst`, staged in PostgreSQL and watched there: what the lab sees
//! of the service's sessions while it holds `reports` against writes, and when it lets them go.
//!
//! The lab holds `LOCK TABLE reports IN SHARE ROW EXCLUSIVE MODE` in a transaction of its own:
//! reads pass, every write to `reports` waits. A request has come to its write when one of the
//! service's sessions waits for the lab's backend, directly or behind another session
//! (`pg_blocking_pids`, followed link by link: any lock, a row, an advisory lock, a key table of
//! the service's own). [`Watch`] decides, poll by poll, when the moment is there:
//!
//! - every request still out has a session waiting for the lab (or as many as a burst asked
//!   for): the race is set, let go now;
//! - some wait, and nothing of the service has moved for a quiet while (who waits, which calls
//!   ended, no other session of the service running a statement): the service holds the others
//!   back before the database itself (a lock of its own, one thread, one connection); let go,
//!   and the answers and the rows judge the rest;
//! - a call ended with a 5xx or without an answer after a session had waited: the service
//!   stopped waiting on its own under a hold longer than any real race, so the moment is spoilt;
//! - the staging limit passed.
//!
//! Nothing here sleeps to order anything: the lab polls real state, and each poll is bounded.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::call::{Call, send};
use crate::lab_side::STAGING_LIMIT;
use crate::verdict::Sent;

/// How often PostgreSQL's locks are read while the race's requests gather: a poll for a state,
/// not a wait for an order.
const LOCK_POLL: Duration = Duration::from_millis(10);

/// The least time nothing of the service may move before the lab concludes it holds the other
/// requests back itself: far longer than a request takes from its socket to its first
/// statement on an idle machine. It grows with what the first request took to come to wait
/// (see [`Watch::quiet`]), so a loaded machine makes the check slower, never its verdict
/// another.
pub(super) const QUIET: Duration = Duration::from_millis(500);

/// How a staged race went, up to the moment the lab let go; then every call's answer.
#[derive(Debug)]
pub(super) struct Staged {
    pub release: Release,
    /// Whether any session of the service ever waited for the lab.
    pub ever_waited: bool,
    /// The service's sessions waiting for the lab when it let go.
    pub waiting: usize,
    /// The calls answered (with a status) while the lab held.
    pub answered: usize,
    /// The calls still out when the lab let go, beyond the sessions waiting: they never
    /// reached the lab's lock.
    pub absent: usize,
    /// How long the lab held, from the moment the calls were sent.
    pub held_for: Duration,
    /// Every call's answer, in the order given, and when it ended (since the calls were sent).
    pub answers: Vec<(Sent, Duration)>,
}

/// Holds `reports` against writes in a transaction of the lab's own, sends `calls` (each after
/// its delay), lets go (rolls back) when [`Watch`] says the moment is there (`meet` sessions
/// waiting at most: every call still out when `meet` is their number), and waits for every
/// call to end. `role`: see [`sessions`].
pub(super) async fn stage(
    pool: &PgPool,
    role: Option<&str>,
    http: &reqwest::Client,
    calls: Vec<(Call, Duration)>,
    meet: usize,
) -> Result<Staged, sqlx::Error> {
    let count = calls.len();
    // Writes to `reports` wait for the lab from now on; reads do not, so each request makes
    // whatever check it makes before its write, and stops at the write (or earlier, behind
    // another request's lock).
    let mut held = pool.begin().await?;
    sqlx::query("LOCK TABLE reports IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *held)
        .await?;
    let lab: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *held)
        .await?;
    let sent_at = Instant::now();
    let mut out: Vec<_> = calls
        .into_iter()
        .map(|(call, delay)| {
            let client = http.clone();
            Some(tokio::spawn(async move {
                // A seeded start (a burst's spread): what is explored, not an order.
                tokio::time::sleep(delay).await;
                let sent = send(&client, call).await;
                (sent, sent_at.elapsed())
            }))
        })
        .collect();
    let mut ended: Vec<Option<(Sent, Duration)>> = vec![None; count];
    let mut watch = Watch::new(count, meet, STAGING_LIMIT);
    let (release, seen) = loop {
        for (pending, done) in out.iter_mut().zip(ended.iter_mut()) {
            if pending.as_ref().is_some_and(|call| call.is_finished()) {
                let call = pending.take().expect("just seen");
                *done = Some(call.await.expect("a call does not panic"));
            }
        }
        let seen = Seen::of(
            &sessions(pool, lab, role).await?,
            (0..count).filter(|&n| ended[n].is_some()).collect(),
            (0..count)
                .filter(|&n| {
                    ended[n]
                        .as_ref()
                        .is_some_and(|(sent, _)| sent.status.is_none_or(|s| s >= 500))
                })
                .collect(),
        );
        if let Some(release) = watch.observe(sent_at.elapsed(), &seen) {
            break (release, seen);
        }
        tokio::time::sleep(LOCK_POLL).await;
    };
    let held_for = sent_at.elapsed();
    held.rollback().await?;
    let answered = ended
        .iter()
        .flatten()
        .filter(|(sent, _)| sent.status.is_some())
        .count();
    let absent = (count - seen.ended.len()).saturating_sub(seen.waiting.len());
    // Every call ends before the check goes on, whatever it concludes.
    for (pending, done) in out.into_iter().zip(ended.iter_mut()) {
        if let Some(call) = pending {
            *done = Some(call.await.expect("a call does not panic"));
        }
    }
    Ok(Staged {
        release,
        ever_waited: watch.ever_waited(),
        waiting: seen.waiting.len(),
        answered,
        absent,
        held_for,
        answers: ended
            .into_iter()
            .map(|done| done.expect("every call ended"))
            .collect(),
    })
}

/// Waits, at most `limit`, until none of the service's sessions is at work (a bounded poll):
/// whether it came to that.
pub(super) async fn settle(
    pool: &PgPool,
    role: Option<&str>,
    limit: Duration,
) -> Result<bool, sqlx::Error> {
    let started = Instant::now();
    while at_work(pool, role).await? {
        if started.elapsed() >= limit {
            return Ok(false);
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    Ok(true)
}

/// One session of the service, as `pg_stat_activity` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Session {
    pub pid: i32,
    /// It waits for the lab's backend, directly or behind other sessions.
    pub waiting: bool,
    /// `pg_stat_activity.state` (`None` when the lab's role may not see it).
    pub state: Option<String>,
}

/// The service's sessions in the run's database: those logged in as `role` (the login the lab
/// gave the service), or without a role (`--target`) every session but the lab's own (its
/// connections carry the lab's `application_name`). `lab` is the backend that holds the lock:
/// any session waiting for it is counted, whatever its role.
pub(super) async fn sessions(
    pool: &PgPool,
    lab: i32,
    role: Option<&str>,
) -> Result<Vec<Session>, sqlx::Error> {
    let rows: Vec<(i32, bool, Option<String>)> = sqlx::query_as(
        "WITH RECURSIVE waits(pid, blocker) AS (
             SELECT pid, unnest(pg_blocking_pids(pid)) FROM pg_stat_activity
              WHERE datname = current_database()
         ), reach(pid) AS (
             SELECT pid FROM waits WHERE blocker = $1
             UNION
             SELECT w.pid FROM waits w JOIN reach r ON w.blocker = r.pid
         )
         SELECT a.pid, a.pid IN (SELECT pid FROM reach), a.state
           FROM pg_stat_activity a
          WHERE a.datname = current_database()
            AND a.backend_type = 'client backend'
            AND a.pid NOT IN ($1, pg_backend_pid())
            AND (a.pid IN (SELECT pid FROM reach)
                 OR CASE WHEN $2::text IS NULL
                         THEN a.application_name IS DISTINCT FROM current_setting('application_name')
                         ELSE a.usename = $2 END)
          ORDER BY a.pid",
    )
    .bind(lab)
    .bind(role)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(pid, waiting, state)| Session {
            pid,
            waiting,
            state,
        })
        .collect())
}

/// Whether any of the service's sessions is still at work: running a statement, or inside a
/// transaction it has not ended (once the hold is over: no session waits for the lab then).
async fn at_work(pool: &PgPool, role: Option<&str>) -> Result<bool, sqlx::Error> {
    // Backend 0 is no session's: nothing is followed back to it.
    Ok(sessions(pool, 0, role).await?.iter().any(|s| {
        matches!(
            s.state.as_deref(),
            Some("active" | "idle in transaction" | "idle in transaction (aborted)")
        )
    }))
}

/// What the lab sees at one poll while it holds `reports`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// The service's sessions waiting for the lab, directly or behind one another.
    pub waiting: Vec<i32>,
    /// Another session of the service is running a statement (not waiting for the lab).
    pub busy: bool,
    /// The race's calls that have ended, by index.
    pub ended: Vec<usize>,
    /// Of those, the ones that ended with a 5xx or without an answer.
    pub broke_off: Vec<usize>,
}

impl Seen {
    /// What one poll shows: the sessions, and which calls have ended and how.
    pub fn of(sessions: &[Session], ended: Vec<usize>, broke_off: Vec<usize>) -> Seen {
        Seen {
            waiting: sessions
                .iter()
                .filter(|s| s.waiting)
                .map(|s| s.pid)
                .collect(),
            busy: sessions
                .iter()
                .any(|s| !s.waiting && s.state.as_deref() == Some("active")),
            ended,
            broke_off,
        }
    }
}

/// Why the lab let the race go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Release {
    /// As many sessions wait for the lab as the stage asked for (every call still out, or
    /// fewer when a burst lets go early).
    Met,
    /// Every call ended while the lab held.
    AllEnded,
    /// Some sessions wait; the other calls did not reach the database while nothing of the
    /// service moved for `quiet`.
    HeldBack { quiet: Duration },
    /// The staging limit passed first.
    Limit,
    /// Call `call` ended with a 5xx or without an answer after a session had waited for the
    /// lab: the service stopped waiting on its own.
    GaveUp { call: usize },
}

/// Decides, poll by poll, when the race is set (see the module's documentation).
#[derive(Debug)]
pub(super) struct Watch {
    calls: usize,
    /// How many sessions waiting are enough, at most.
    meet: usize,
    limit: Duration,
    /// When a session first came to wait for the lab, from the moment the calls were sent.
    first_wait: Option<Duration>,
    /// Calls that broke off before any session waited: ended, not given up on a wait.
    broke_early: Vec<usize>,
    /// What the last poll saw (without `busy`, which only stops the clock), and since when.
    last: Option<(Vec<i32>, Vec<usize>)>,
    since: Duration,
}

impl Watch {
    pub fn new(calls: usize, meet: usize, limit: Duration) -> Watch {
        Watch {
            calls,
            meet,
            limit,
            first_wait: None,
            broke_early: Vec::new(),
            last: None,
            since: Duration::ZERO,
        }
    }

    /// Whether any session of the service ever waited for the lab: the race's moment was
    /// reached at least by one request.
    pub fn ever_waited(&self) -> bool {
        self.first_wait.is_some()
    }

    /// How long nothing may move before the lab concludes the service holds the rest back:
    /// [`QUIET`], or twice what the first request took to come to wait (a loaded machine), the
    /// longer.
    pub fn quiet(&self) -> Duration {
        QUIET.max(self.first_wait.unwrap_or_default() * 2)
    }

    /// What a poll `at` (since the calls were sent) saw; `Some` when the lab lets go.
    pub fn observe(&mut self, at: Duration, seen: &Seen) -> Option<Release> {
        if !seen.waiting.is_empty() && self.first_wait.is_none() {
            self.first_wait = Some(at);
        }
        if !self.ever_waited() {
            self.broke_early.clone_from(&seen.broke_off);
        } else if let Some(&call) = seen
            .broke_off
            .iter()
            .find(|call| !self.broke_early.contains(call))
        {
            return Some(Release::GaveUp { call });
        }
        let out = self.calls.saturating_sub(seen.ended.len());
        if out == 0 {
            return Some(Release::AllEnded);
        }
        if seen.waiting.len() >= out.min(self.meet) {
            return Some(Release::Met);
        }
        let state = (seen.waiting.clone(), seen.ended.clone());
        // A statement running anywhere in the service is movement: the clock starts again.
        if self.last.as_ref() != Some(&state) || seen.busy {
            self.last = Some(state);
            self.since = at;
        } else if !seen.waiting.is_empty() && at.saturating_sub(self.since) >= self.quiet() {
            return Some(Release::HeldBack {
                quiet: self.quiet(),
            });
        }
        (at >= self.limit).then_some(Release::Limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn seen(waiting: &[i32], busy: bool, ended: &[usize]) -> Seen {
        Seen {
            waiting: waiting.to_vec(),
            busy,
            ended: ended.to_vec(),
            broke_off: Vec::new(),
        }
    }

    #[test]
    fn the_race_is_set_when_every_call_still_out_waits() {
        let mut watch = Watch::new(3, 3, LIMIT);
        assert_eq!(watch.observe(ms(10), &seen(&[], true, &[])), None);
        assert_eq!(watch.observe(ms(20), &seen(&[101], true, &[])), None);
        assert_eq!(watch.observe(ms(30), &seen(&[101, 102], false, &[])), None);
        assert_eq!(
            watch.observe(ms(40), &seen(&[101, 102, 103], false, &[])),
            Some(Release::Met)
        );
        // A call answered meanwhile needs no session waiting.
        let mut watch = Watch::new(3, 3, LIMIT);
        assert_eq!(
            watch.observe(ms(40), &seen(&[101, 102], false, &[2])),
            Some(Release::Met)
        );
    }

    #[test]
    fn a_burst_lets_go_once_as_many_as_it_asked_for_wait() {
        let mut watch = Watch::new(8, 3, LIMIT);
        assert_eq!(watch.observe(ms(10), &seen(&[1, 2], true, &[])), None);
        assert_eq!(
            watch.observe(ms(20), &seen(&[1, 2, 3], true, &[])),
            Some(Release::Met)
        );
        // Fewer still out than asked for: every one of them.
        let mut watch = Watch::new(8, 3, LIMIT);
        assert_eq!(
            watch.observe(ms(20), &seen(&[1, 2], false, &[0, 1, 2, 3, 4, 5])),
            Some(Release::Met)
        );
    }

    #[test]
    fn a_service_that_holds_the_others_back_is_let_go_after_a_quiet_while() {
        let mut watch = Watch::new(3, 3, LIMIT);
        assert_eq!(watch.observe(ms(100), &seen(&[101], false, &[])), None);
        assert_eq!(watch.observe(ms(400), &seen(&[101], false, &[])), None);
        assert_eq!(
            watch.observe(ms(600), &seen(&[101], false, &[])),
            Some(Release::HeldBack { quiet: QUIET })
        );
    }

    #[test]
    fn anything_that_moves_starts_the_quiet_clock_again() {
        let mut watch = Watch::new(2, 2, LIMIT);
        watch.observe(ms(100), &seen(&[101], false, &[]));
        // Another session runs a statement: not quiet.
        assert_eq!(watch.observe(ms(550), &seen(&[101], true, &[])), None);
        assert_eq!(watch.observe(ms(1000), &seen(&[101], false, &[])), None);
        // Another session comes to wait behind the first: the race is set.
        assert_eq!(
            watch.observe(ms(1010), &seen(&[101, 102], false, &[])),
            Some(Release::Met)
        );
    }

    #[test]
    fn a_slow_first_request_makes_the_quiet_while_longer() {
        let mut watch = Watch::new(2, 2, LIMIT);
        watch.observe(ms(2000), &seen(&[101], false, &[]));
        assert_eq!(watch.quiet(), ms(4000));
        assert_eq!(watch.observe(ms(5000), &seen(&[101], false, &[])), None);
        assert_eq!(
            watch.observe(ms(6000), &seen(&[101], false, &[])),
            Some(Release::HeldBack { quiet: ms(4000) })
        );
    }

    #[test]
    fn nothing_waiting_is_never_quiet_and_ends_at_the_limit() {
        let mut watch = Watch::new(2, 2, LIMIT);
        assert_eq!(watch.observe(ms(10), &seen(&[], false, &[])), None);
        assert_eq!(watch.observe(ms(5000), &seen(&[], false, &[])), None);
        assert_eq!(
            watch.observe(LIMIT, &seen(&[], false, &[])),
            Some(Release::Limit)
        );
        assert!(!watch.ever_waited());
    }

    #[test]
    fn a_call_that_broke_off_after_a_wait_spoils_the_moment() {
        let mut watch = Watch::new(2, 2, LIMIT);
        watch.observe(ms(10), &seen(&[101], false, &[]));
        let mut gave_up = seen(&[], false, &[0]);
        gave_up.broke_off = vec![0];
        assert_eq!(
            watch.observe(ms(5000), &gave_up),
            Some(Release::GaveUp { call: 0 })
        );
        // Before anything waited, it is only a call that ended.
        let mut watch = Watch::new(2, 2, LIMIT);
        let mut early = seen(&[], false, &[0]);
        early.broke_off = vec![0];
        assert_eq!(watch.observe(ms(10), &early), None);
        let mut then_waits = seen(&[101], false, &[0]);
        then_waits.broke_off = vec![0];
        assert_eq!(watch.observe(ms(20), &then_waits), Some(Release::Met));
    }

    #[test]
    fn every_call_ended_lets_go() {
        let mut watch = Watch::new(2, 2, LIMIT);
        assert_eq!(
            watch.observe(ms(10), &seen(&[], false, &[0, 1])),
            Some(Release::AllEnded)
        );
    }

    #[test]
    fn a_poll_sees_who_waits_and_whether_anything_else_runs() {
        let sessions = [
            Session {
                pid: 1,
                waiting: true,
                state: Some("active".into()),
            },
            Session {
                pid: 2,
                waiting: false,
                state: Some("idle".into()),
            },
        ];
        let seen = Seen::of(&sessions, vec![], vec![]);
        assert_eq!(seen.waiting, vec![1]);
        assert!(
            !seen.busy,
            "a waiting session is not busy, an idle one neither"
        );
        let mut running = sessions.clone();
        running[1].state = Some("active".into());
        assert!(Seen::of(&running, vec![], vec![]).busy);
    }
}
