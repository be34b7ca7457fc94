//! The narrator: the one handle through which a scenario (and the services it starts) tells
//! what happens.
//!
//! Every event goes to the sink (the live renderer) at once, so the learner sees each step as it
//! happens, and is recorded, so `lab check` can render the whole run again in both languages.
//! The step methods are `async` because in step mode they wait at the [`Gate`].
//!
//! A scenario run is short, and keeps every event. `lab serve` runs until it is stopped and
//! answers whatever is sent to it, a load generator too: its narrator has [`Bounds`], so a
//! storm of requests neither floods the terminal (lines from the services beyond a rate are
//! counted, and the count is told once a second) nor grows the record without end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde_json::Value;

use crate::gate::{Look, Pause, Place, Sofar, SofarFuture};
use crate::{Event, Facts, Fault, Gate, Msg, Outcome, Quit, Table, facts};

/// Where events go as they happen: a renderer writing to stdout, usually.
pub trait Sink: Send {
    fn emit(&mut self, event: &Event);
}

/// A sink shared by every scenario of one `lab` call.
pub type SharedSink = Arc<Mutex<dyn Sink>>;

/// The narrator of one scenario run. Cheap to clone: services get a clone.
#[derive(Clone)]
pub struct Narrator {
    inner: Arc<Inner>,
}

struct Inner {
    sink: Option<SharedSink>,
    gate: Gate,
    events: Mutex<Vec<Event>>,
    /// Step numbers count from 1 in each scenario.
    steps: AtomicU32,
    /// How many steps this run will have, when known for sure (0: not known).
    expected_steps: AtomicU32,
    facts: Mutex<Facts>,
    /// The state views shown so far that can be read again, by table title key, in the order
    /// they were first shown.
    views: Mutex<Vec<(String, Reread)>>,
    bounds: Bounds,
    /// The lines from services shown and held back in the current second (with
    /// [`Bounds::service_lines_per_second`]).
    window: Mutex<Window>,
}

/// Limits for a narrator that runs as long as a server does (`lab serve`); a scenario run has
/// none ([`Bounds::NONE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Events kept for looks (`lab serve --step`): beyond it, the oldest half is forgotten.
    pub history: Option<usize>,
    /// Lines from services shown per second: the rest are counted, and the count is told as a
    /// note when the second is over (at the next line, or at [`Narrator::tell_held_back`]).
    pub service_lines_per_second: Option<u32>,
}

impl Bounds {
    pub const NONE: Bounds = Bounds {
        history: None,
        service_lines_per_second: None,
    };
}

/// One second of lines from services.
struct Window {
    started: Instant,
    shown: u32,
    held_back: u64,
}

impl Window {
    /// Starts a new second if this one is over; returns how many lines the one that ended held
    /// back, if any.
    fn roll(&mut self, now: Instant) -> Option<u64> {
        if now.duration_since(self.started) < Duration::from_secs(1) {
            return None;
        }
        self.started = now;
        self.shown = 0;
        Some(std::mem::take(&mut self.held_back)).filter(|&n| n > 0)
    }
}

/// Reads a state view again: the same query (or Redis read) that produced a table the scenario
/// showed, run again when the learner presses `s` in step mode. `None` when it cannot be read
/// now (the look then shows the table as last read).
pub type Reread =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<Table>> + Send>> + Send + Sync>;

/// Makes a [`Reread`] of an async closure.
pub fn reread<F, Fut>(read: F) -> Reread
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Table>> + Send + 'static,
{
    Arc::new(move || Box::pin(read()))
}

/// How long `s` waits for one view to be read again before it shows the table as last read: a
/// pause inside a service may hold what the read needs (a pool's last connection), and a look
/// must never hang the class.
const REREAD_TIMEOUT: Duration = Duration::from_secs(1);

/// A narrator that does not keep its run alive (the run table of [`crate::trace`]).
#[derive(Clone)]
pub struct WeakNarrator {
    inner: std::sync::Weak<Inner>,
}

impl WeakNarrator {
    pub fn upgrade(&self) -> Option<Narrator> {
        self.inner.upgrade().map(|inner| Narrator { inner })
    }

    pub fn is_alive(&self) -> bool {
        self.inner.strong_count() > 0
    }
}

/// A call's result, as the narrator shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallView {
    pub outcome: Outcome,
    pub status: Option<u16>,
    pub body: Option<String>,
    pub detail: Option<Msg>,
}

impl Narrator {
    /// A narrator that renders into `sink` (if any) and pauses at `gate`.
    pub fn new(sink: Option<SharedSink>, gate: Gate) -> Narrator {
        Narrator::bounded(sink, gate, Bounds::NONE)
    }

    /// A narrator as [`Narrator::new`], within `bounds`.
    pub fn bounded(sink: Option<SharedSink>, gate: Gate, bounds: Bounds) -> Narrator {
        Narrator {
            inner: Arc::new(Inner {
                sink,
                gate,
                events: Mutex::new(Vec::new()),
                steps: AtomicU32::new(0),
                expected_steps: AtomicU32::new(0),
                facts: Mutex::new(Facts::new()),
                views: Mutex::new(Vec::new()),
                bounds,
                window: Mutex::new(Window {
                    started: Instant::now(),
                    shown: 0,
                    held_back: 0,
                }),
            }),
        }
    }

    /// A narrator that only records (tests, `lab check`).
    pub fn recording() -> Narrator {
        Narrator::new(None, Gate::default())
    }

    pub fn downgrade(&self) -> WeakNarrator {
        WeakNarrator {
            inner: Arc::downgrade(&self.inner),
        }
    }

    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// Tells how many steps this run will have, for the step gate's footer (`step 3/8`). Only
    /// a number known for sure: the CLI counts them in the scenario's expected narrative, the
    /// record of an identical run. `None` (or 0) leaves the footer at `step 3`.
    pub fn expect_steps(&self, steps: Option<u32>) {
        self.inner
            .expected_steps
            .store(steps.unwrap_or(0), Ordering::SeqCst);
    }

    /// Where the run is, for the footer of a pause of this kind.
    fn place(&self, pause: Pause) -> Place {
        let step = self.inner.steps.load(Ordering::SeqCst);
        let of = self.inner.expected_steps.load(Ordering::SeqCst);
        Place {
            pause,
            step,
            // A run that has gone past the count is not the run it was counted from: no
            // number rather than a wrong one.
            of: (of > 0 && step <= of).then_some(of),
        }
    }

    /// Pauses at the gate, with the progress for its footer and this run's events (and, for
    /// `s`, its state views read again) for its looks.
    async fn pause(&self, pause: Pause) -> Result<String, Quit> {
        let sofar = |look: Look| -> SofarFuture<'_> { Box::pin(self.sofar(look)) };
        self.inner.gate.pause_at(self.place(pause), &sofar).await
    }

    /// What a look is made of: the events so far, and for `s` every state view read again now.
    async fn sofar(&self, look: Look) -> Sofar {
        let events = self.events();
        if look != Look::State {
            return Sofar {
                events,
                now: Vec::new(),
            };
        }
        let views: Vec<Reread> = self
            .inner
            .views
            .lock()
            .iter()
            .map(|(_, r)| r.clone())
            .collect();
        let mut now = Vec::new();
        for view in views {
            // Backstage: the look's own reads are not part of the run (`--show-sql`, JSON).
            let read = crate::backstage::backstage(tokio::time::timeout(REREAD_TIMEOUT, view()));
            if let Ok(Some(table)) = read.await {
                now.push(table);
            }
        }
        Sofar { events, now }
    }

    /// Sends an event to the sink and records it.
    pub fn emit(&self, event: Event) {
        if let Some(sink) = &self.inner.sink {
            sink.lock().emit(&event);
        }
        let mut events = self.inner.events.lock();
        if let Some(history) = self.inner.bounds.history
            && events.len() >= history
        {
            // Down to half at a time, so forgetting costs nothing per event on average.
            let forgotten = events.len() - history / 2;
            events.drain(..forgotten);
        }
        events.push(event);
    }

    pub fn start(&self, scenario: &str) {
        self.emit(Event::Start {
            scenario: scenario.to_string(),
        });
    }

    /// A heading for one side of a two-sided scenario.
    pub fn side(&self, text: impl Into<Msg>) {
        self.emit(Event::Side { text: text.into() });
    }

    /// The next numbered step; in step mode, waits for Enter afterwards.
    pub async fn step(&self, text: impl Into<Msg>) -> Result<(), Quit> {
        let number = self.inner.steps.fetch_add(1, Ordering::SeqCst) + 1;
        self.emit(Event::Step {
            number,
            text: text.into(),
        });
        self.pause(Pause::Step).await.map(drop)
    }

    /// A network call is being sent.
    pub fn request(&self, text: impl Into<Msg>) {
        self.emit(Event::Request {
            text: text.into(),
            from: None,
            to: None,
            timeout_ms: None,
        });
    }

    /// A network call from `from` (a label key such as `worker.a` or `who.client`) to the
    /// service `to`: told as `text`, drawn as an arrow in diagrams.
    pub fn call(&self, from: &str, to: &str, text: impl Into<Msg>) {
        self.emit(Event::Request {
            text: text.into(),
            from: Some(from.to_string()),
            to: Some(to.to_string()),
            timeout_ms: None,
        });
    }

    /// [`Narrator::call`] from a caller whose client gives up after `timeout`: pictures show
    /// how long it waits beside the call.
    pub fn call_waiting(&self, from: &str, to: &str, text: impl Into<Msg>, timeout: Duration) {
        self.emit(Event::Request {
            text: text.into(),
            from: Some(from.to_string()),
            to: Some(to.to_string()),
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        });
    }

    /// A fault put on (or taken off) the hop in front of the service `hop`.
    pub fn fault(&self, hop: &str, fault: Fault) {
        self.emit(Event::Fault {
            hop: hop.to_string(),
            fault,
        });
    }

    /// What the caller of the last request saw.
    pub fn response(&self, view: CallView) {
        self.emit(Event::Response {
            outcome: view.outcome,
            status: view.status,
            body: view.body,
            detail: view.detail,
        });
    }

    /// Something inside a bundled service; in step mode, a pause. A quit here cannot reach the
    /// scenario through a request handler, so it is left to [`Gate::quit_requested`].
    pub async fn service(&self, service: &str, text: impl Into<Msg>) {
        if !self.admit_service_line(Instant::now()) {
            return;
        }
        self.emit(Event::Service {
            service: service.to_string(),
            text: text.into(),
        });
        let _ = self.pause(Pause::Service).await;
    }

    pub fn state(&self, table: Table) {
        self.emit(Event::State { table });
    }

    /// Whether a line from a service is shown now, within [`Bounds::service_lines_per_second`];
    /// tells first how many the second before held back.
    fn admit_service_line(&self, now: Instant) -> bool {
        let Some(limit) = self.inner.bounds.service_lines_per_second else {
            return true;
        };
        // A second that is over is told first, then this line counts in the new one.
        self.tell_held_back_at(now);
        let mut window = self.inner.window.lock();
        let admitted = window.shown < limit;
        if admitted {
            window.shown += 1;
        } else {
            window.held_back += 1;
        }
        admitted
    }

    /// Tells how many lines from services were held back, once their second is over: `lab
    /// serve` calls it every second, so the count of a storm's last second is told when the
    /// storm ends, not at the next request.
    pub fn tell_held_back(&self) {
        self.tell_held_back_at(Instant::now());
    }

    fn tell_held_back_at(&self, now: Instant) {
        let Some(limit) = self.inner.bounds.service_lines_per_second else {
            return;
        };
        let held_back = self.inner.window.lock().roll(now);
        if let Some(count) = held_back {
            self.note_held_back(count, limit);
        }
    }

    fn note_held_back(&self, count: u64, limit: u32) {
        self.note(
            Msg::new("cli.serve.held_back")
                .arg("count", count.to_string())
                .arg("limit", limit.to_string()),
        );
    }

    /// A table, as [`Narrator::state`], that `s` in step mode reads again with `reread`, to
    /// show it as it is at that moment. A later view with the same title replaces it.
    pub fn state_view(&self, table: Table, reread: Reread) {
        if self.inner.gate.is_stepping() {
            let mut views = self.inner.views.lock();
            match views.iter_mut().find(|(key, _)| *key == table.title.key) {
                Some((_, view)) => *view = reread,
                None => views.push((table.title.key.clone(), reread)),
            }
        }
        self.state(table);
    }

    pub fn note(&self, text: impl Into<Msg>) {
        self.emit(Event::Note { text: text.into() });
    }

    /// Asks the prediction question `prefix.question`; in step mode the learner may type an
    /// answer before going on.
    pub async fn predict(&self, prefix: &str) -> Result<(), Quit> {
        self.emit(Event::Predict {
            prefix: prefix.to_string(),
        });
        let answer = self.pause(Pause::Predict).await?;
        if !answer.is_empty() {
            self.emit(Event::LearnerAnswer { answer });
        }
        Ok(())
    }

    /// Reveals the answer (built from measured values); step mode pauses first.
    pub async fn reveal(&self, answer: impl Into<Msg>) -> Result<(), Quit> {
        self.pause(Pause::Reveal).await?;
        self.emit(Event::Reveal {
            answer: answer.into(),
        });
        Ok(())
    }

    /// Records a measured fact. Facts come from real state, never from the script.
    pub fn fact(&self, name: &str, value: impl Into<Value>) {
        let value = value.into();
        self.inner
            .facts
            .lock()
            .insert(name.to_string(), value.clone());
        self.emit(Event::Fact {
            name: name.to_string(),
            value,
        });
    }

    pub fn explain(&self) {
        self.emit(Event::Explain);
    }

    pub fn quiz(&self) {
        self.emit(Event::Quiz);
    }

    /// Ends the scenario: compares the facts with `expected` and emits the summary. `settings`
    /// are the knobs set away from their defaults; `expected` is then the default run's.
    pub fn summary(
        &self,
        scenario: &str,
        expected: &Facts,
        settings: Vec<(String, String)>,
    ) -> bool {
        let facts = self.facts();
        let passed = facts::all_ok(&facts, expected);
        self.emit(Event::Summary {
            scenario: scenario.to_string(),
            facts,
            expected: expected.clone(),
            passed,
            settings,
        });
        passed
    }

    pub fn facts(&self) -> Facts {
        self.inner.facts.lock().clone()
    }

    /// Everything emitted so far, in order.
    pub fn events(&self) -> Vec<Event> {
        self.inner.events.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_back_notes(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Note { text } if text.key == "cli.serve.held_back" => {
                    Some(format!("{text:?}"))
                }
                _ => None,
            })
            .collect()
    }

    fn services(events: &[Event]) -> usize {
        events
            .iter()
            .filter(|e| matches!(e, Event::Service { .. }))
            .count()
    }

    /// Beyond the rate, lines from services are counted, not shown; the count is told once
    /// their second is over, and a new second shows lines again. (The clock is passed in: the
    /// test decides when a second is over.)
    #[test]
    fn lines_beyond_the_rate_are_held_back_and_counted() {
        let bounds = Bounds {
            history: None,
            service_lines_per_second: Some(2),
        };
        let narrator = Narrator::bounded(None, Gate::default(), bounds);
        let start = narrator.inner.window.lock().started;
        let line = |at: Duration| {
            if narrator.admit_service_line(start + at) {
                narrator.emit(Event::Service {
                    service: "reports".into(),
                    text: Msg::new("reports.replayed"),
                });
            }
        };
        for _ in 0..5 {
            line(Duration::from_millis(10));
        }
        assert_eq!(
            services(&narrator.events()),
            2,
            "two shown in the first second"
        );
        assert!(
            held_back_notes(&narrator.events()).is_empty(),
            "told only once it is over"
        );
        // The second is not over yet: nothing to tell.
        narrator.tell_held_back_at(start + Duration::from_millis(900));
        assert!(held_back_notes(&narrator.events()).is_empty());
        narrator.tell_held_back_at(start + Duration::from_millis(1100));
        let notes = held_back_notes(&narrator.events());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("\"3\""), "three held back: {notes:?}");
        // A new second shows lines again, and a quiet second tells nothing.
        line(Duration::from_millis(1200));
        narrator.tell_held_back_at(start + Duration::from_millis(2300));
        assert_eq!(services(&narrator.events()), 3);
        assert_eq!(held_back_notes(&narrator.events()).len(), 1);
    }

    /// Without bounds (a scenario run) every line is shown and every event kept.
    #[test]
    fn a_scenario_narrator_keeps_everything() {
        let narrator = Narrator::recording();
        let now = Instant::now();
        for _ in 0..500 {
            assert!(narrator.admit_service_line(now));
            narrator.note(Msg::new("x"));
        }
        assert_eq!(narrator.events().len(), 500);
    }

    /// With a history bound the record stays within it, and keeps the newest events.
    #[test]
    fn the_history_keeps_the_newest_events_within_its_bound() {
        let bounds = Bounds {
            history: Some(10),
            service_lines_per_second: None,
        };
        let narrator = Narrator::bounded(None, Gate::default(), bounds);
        for n in 0..95 {
            narrator.note(Msg::new("n").arg("n", n.to_string()));
        }
        let events = narrator.events();
        assert!(events.len() <= 10, "{}", events.len());
        let last = format!("{:?}", events.last().expect("events"));
        assert!(last.contains("\"94\""), "{last}");
    }
}
