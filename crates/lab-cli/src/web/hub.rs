//! The hub between one `lab run --web` and the browsers watching it.
//!
//! Outward, the hub keeps every message of the current scenario (so a browser that connects late,
//! or reconnects, replays the run so far) and broadcasts each new one to every browser. Inward,
//! it knows where the run waits: the step gate's pauses (it is the gate's prompt) and the run
//! loop's own (before a scenario starts). The driving browser's Next or answer goes to exactly
//! that pause, once: a second click on a pause that is over is refused (409), so a double click
//! never skips a step.
//!
//! Every run of a scenario (the first one, and each restart) is an epoch. Messages from an older
//! epoch are dropped: a request of an abandoned run that was paused inside a service goes on when
//! its gate's input closes, and whatever it narrates then belongs to no page.

use std::sync::Arc;

use axum::http::StatusCode;
use lab_core::gate::Pause;
use lab_core::narrator::Sink;
use lab_core::render::WebRenderer;
use lab_core::{Event, Lang, Texts};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use super::input::LineReader;

/// How many messages a slow browser may fall behind before its stream is closed (it reconnects
/// at once and replays the run from the start).
const BROADCAST_CAPACITY: usize = 1024;

/// Where the run waits, as the page names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseKind {
    /// Before a scenario starts.
    Start,
    /// A scenario has ended and another follows: its page stays until Next.
    Next,
    Step,
    Service,
    Predict,
    Reveal,
}

impl PauseKind {
    fn word(self) -> &'static str {
        match self {
            PauseKind::Start => "start",
            PauseKind::Next => "next",
            PauseKind::Step => "step",
            PauseKind::Service => "service",
            PauseKind::Predict => "predict",
            PauseKind::Reveal => "reveal",
        }
    }
}

impl From<Pause> for PauseKind {
    fn from(pause: Pause) -> PauseKind {
        match pause {
            Pause::Step => PauseKind::Step,
            Pause::Service => PauseKind::Service,
            Pause::Predict => PauseKind::Predict,
            Pause::Reveal => PauseKind::Reveal,
        }
    }
}

/// Who gets the driver's answer to the current pause.
enum Answerer {
    /// The step gate, through its input.
    Gate,
    /// The run loop, waiting to start a scenario.
    Loop(oneshot::Sender<()>),
}

struct Waiting {
    id: u64,
    kind: PauseKind,
    answerer: Answerer,
}

struct State {
    epoch: u64,
    /// Numbers every message sent, across epochs (the SSE event id).
    seq: u64,
    /// The messages of the current epoch, in order.
    replay: Vec<Arc<str>>,
    /// The current run's gate input.
    input: Option<mpsc::UnboundedSender<String>>,
    pauses: u64,
    waiting: Option<Waiting>,
}

/// What the driving browser asks for (`POST /api/control`).
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Go on from the current pause (Space or Enter on the page).
    Next { pause: Option<u64> },
    /// Answer the prediction asked at the current pause with a letter.
    Answer { pause: Option<u64>, letter: char },
    /// Run the current scenario again from its start.
    Restart,
}

/// A refused control request: its status and what to say.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub error: String,
}

impl Refusal {
    fn new(status: StatusCode, error: impl Into<String>) -> Refusal {
        Refusal {
            status,
            error: error.into(),
        }
    }
}

pub struct Hub {
    state: Mutex<State>,
    tx: broadcast::Sender<Arc<str>>,
    /// The secret that makes a browser the driver: in the URL printed on the terminal.
    token: String,
    /// The page's own words in both languages (templates from `scenarios/common`).
    ui: Value,
    lang: Lang,
    restart: Notify,
}

impl Hub {
    pub fn new(texts: &Texts, lang: Lang, token: String) -> Arc<Hub> {
        Arc::new(Hub {
            state: Mutex::new(State {
                epoch: 0,
                seq: 0,
                replay: Vec::new(),
                input: None,
                pauses: 0,
                waiting: None,
            }),
            tx: broadcast::channel(BROADCAST_CAPACITY).0,
            token,
            ui: ui_texts(texts),
            lang,
            restart: Notify::new(),
        })
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `given` is the driver's token.
    pub fn drives(&self, given: Option<&str>) -> bool {
        given.is_some_and(|g| g == self.token)
    }

    /// The first message of every stream: the page's words, its default language, and whether
    /// this browser drives.
    pub fn hello(&self, driver: bool) -> Arc<str> {
        let hello =
            json!({"kind": "hello", "lang": self.lang.code(), "driver": driver, "ui": self.ui});
        Arc::from(hello.to_string())
    }

    /// The messages so far and a receiver of the next ones, with nothing lost or repeated in
    /// between (both are taken under the lock every message is sent under).
    pub fn subscribe(&self) -> (Vec<Arc<str>>, broadcast::Receiver<Arc<str>>) {
        let state = self.state.lock();
        (state.replay.clone(), self.tx.subscribe())
    }

    fn send(&self, state: &mut State, mut message: Value) {
        state.seq += 1;
        message["seq"] = json!(state.seq);
        let text: Arc<str> = Arc::from(message.to_string());
        state.replay.push(text.clone());
        // No browser connected is not an error: the replay has it.
        let _ = self.tx.send(text);
    }

    /// Sends a message of `epoch`, unless that run was abandoned.
    pub fn publish(&self, epoch: u64, message: Value) {
        let mut state = self.state.lock();
        if state.epoch == epoch {
            self.send(&mut state, message);
        }
    }

    /// Begins a new epoch for a run of `scenario`: browsers drop what they show, the old run's
    /// gate input closes, and the new run's gate reads from the returned reader.
    pub fn begin(&self, scenario: Value) -> (u64, LineReader) {
        let (tx, reader) = LineReader::channel();
        let mut state = self.state.lock();
        state.epoch += 1;
        state.replay.clear();
        state.input = Some(tx);
        // A run loop waiting at the old start pause sees its answerer dropped.
        state.waiting = None;
        let mut ready = scenario;
        ready["kind"] = json!("ready");
        self.send(&mut state, ready);
        (state.epoch, reader)
    }

    /// The gate of `epoch` waits at a pause (called as the gate's prompt, just before it reads).
    pub fn gate_paused(&self, epoch: u64, pause: Pause) {
        self.wait_at(epoch, pause.into(), Answerer::Gate);
    }

    fn wait_at(&self, epoch: u64, kind: PauseKind, answerer: Answerer) {
        let mut state = self.state.lock();
        if state.epoch != epoch {
            return;
        }
        state.pauses += 1;
        let id = state.pauses;
        state.waiting = Some(Waiting { id, kind, answerer });
        self.send(
            &mut state,
            json!({"kind": "pause", "pause": kind.word(), "id": id}),
        );
    }

    /// The run loop waits for Next: before running a scenario ([`PauseKind::Start`]) or after
    /// one that another follows ([`PauseKind::Next`]). Returns false if the epoch ended first.
    pub async fn wait_for_next(&self, epoch: u64, kind: PauseKind) -> bool {
        let (tx, rx) = oneshot::channel();
        self.wait_at(epoch, kind, Answerer::Loop(tx));
        rx.await.is_ok()
    }

    /// Every scenario ran: the page shows the end, and only a restart goes on.
    pub fn finished(&self, epoch: u64, passed: bool) {
        self.publish(epoch, json!({"kind": "end", "passed": passed}));
    }

    /// Resolves when the driver asks for a restart (or has asked since the last one).
    pub async fn restart_requested(&self) {
        self.restart.notified().await;
    }

    /// Carries out a driver's command.
    pub fn control(&self, command: Command) -> Result<Value, Refusal> {
        let (pause, line) = match command {
            Command::Restart => {
                self.restart.notify_one();
                return Ok(json!({"ok": true, "restarting": true}));
            }
            Command::Next { pause } => (pause, "\n".to_string()),
            Command::Answer { pause, letter } => (pause, format!("{letter}\n")),
        };
        let mut state = self.state.lock();
        let Some(waiting) = state.waiting.as_ref() else {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                "the run is not waiting at a pause",
            ));
        };
        if pause.is_some_and(|p| p != waiting.id) {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                format!(
                    "pause {} is over; the run waits at pause {}",
                    pause.unwrap_or_default(),
                    waiting.id
                ),
            ));
        }
        if line != "\n" && waiting.kind != PauseKind::Predict {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                "an answer is taken only while a prediction waits for one",
            ));
        }
        let Some(waiting) = state.waiting.take() else {
            unreachable!("checked above, under the same lock");
        };
        match waiting.answerer {
            Answerer::Gate => {
                if let Some(input) = &state.input {
                    let _ = input.send(line);
                }
            }
            Answerer::Loop(tx) => {
                let _ = tx.send(());
            }
        }
        let id = waiting.id;
        self.send(&mut state, json!({"kind": "resume", "id": id}));
        Ok(json!({"ok": true, "pause": id}))
    }
}

/// The page's words, as templates (the page fills `{ms}`, `{answer}`, `{scenario}`), in both
/// languages: every `web.*` key and the labels the narrative's blocks use.
fn ui_texts(texts: &Texts) -> Value {
    const LABELS: &[&str] = &[
        "outcome.ok",
        "outcome.fail",
        "outcome.unknown",
        "label.predict",
        "label.answer",
        "label.unfolded",
        "label.unfolded_line",
        "label.your_answer",
        "label.learner_right",
        "label.learner_wrong",
        "label.model_answer",
        "label.explain",
        "label.checklist",
        "label.quiz",
        "label.facts",
        "label.fact",
        "label.measured",
        "label.expected",
        "label.default_run",
        "label.passed",
        "label.failed",
        "label.no_rows",
    ];
    let mut ui = serde_json::Map::new();
    for lang in Lang::ALL {
        let mut words = serde_json::Map::new();
        let keys = texts
            .keys(lab_core::text::COMMON, lang)
            .into_iter()
            .filter(|k| k.starts_with("web."))
            .map(str::to_string)
            .chain(LABELS.iter().map(|k| k.to_string()));
        for key in keys {
            if let Some(text) = texts.get(lab_core::text::COMMON, lang, &key) {
                words.insert(key, json!(text));
            }
        }
        ui.insert(lang.code().to_string(), Value::Object(words));
    }
    Value::Object(ui)
}

/// The sink of one epoch: renders each event for the page and hands it to the hub, and passes
/// it on to the terminal's renderer too (the terminal keeps its narrative, as a log).
pub struct WebSink {
    renderer: WebRenderer,
    hub: Arc<Hub>,
    epoch: u64,
    terminal: Option<lab_core::narrator::SharedSink>,
}

impl WebSink {
    pub fn new(
        texts: Arc<Texts>,
        answers: bool,
        hub: Arc<Hub>,
        epoch: u64,
        terminal: Option<lab_core::narrator::SharedSink>,
    ) -> WebSink {
        WebSink {
            renderer: WebRenderer::new(texts, answers),
            hub,
            epoch,
            terminal,
        }
    }
}

impl Sink for WebSink {
    fn emit(&mut self, event: &Event) {
        if let Some(terminal) = &self.terminal {
            terminal.lock().emit(event);
        }
        let message = self.renderer.render(event);
        self.hub.publish(self.epoch, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> Arc<Hub> {
        Hub::new(&Texts::new(), Lang::En, "secret".into())
    }

    fn kinds(messages: &[Arc<str>]) -> Vec<String> {
        messages
            .iter()
            .map(|m| {
                serde_json::from_str::<Value>(m).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[tokio::test]
    async fn next_goes_to_the_pause_waiting_once_and_a_late_click_is_refused() {
        let hub = hub();
        let (epoch, reader) = hub.begin(json!({"scenario": "x"}));
        let gate = lab_core::Gate::stepping(reader, {
            let hub = hub.clone();
            Box::new(move |place: lab_core::gate::Place| {
                hub.gate_paused(epoch, place.pause);
                String::new()
            })
        });
        assert_eq!(
            hub.control(Command::Next { pause: None })
                .unwrap_err()
                .status,
            StatusCode::CONFLICT,
            "nothing waits yet"
        );
        let (_, mut rx) = hub.subscribe();
        let paused = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.pause(Pause::Predict).await })
        };
        // The pause is announced (as the gate's prompt) just before the gate reads.
        let pause: Value = loop {
            let message: Value = serde_json::from_str(&rx.recv().await.unwrap()).unwrap();
            if message["kind"] == "pause" {
                break message;
            }
        };
        let id = pause["id"].as_u64().unwrap();
        hub.control(Command::Answer {
            pause: Some(id),
            letter: 'b',
        })
        .unwrap();
        assert_eq!(paused.await.unwrap(), Ok("b".to_string()));
        let again = hub.control(Command::Next { pause: Some(id) }).unwrap_err();
        assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.error);
        let (replay, _) = hub.subscribe();
        assert_eq!(kinds(&replay), ["ready", "pause", "resume"]);
    }

    #[tokio::test]
    async fn a_new_epoch_drops_the_old_runs_messages_and_closes_its_input() {
        let hub = hub();
        let (old, reader) = hub.begin(json!({}));
        let gate = lab_core::Gate::stepping(reader, Box::new(|_| String::new()));
        let (new, _reader) = hub.begin(json!({}));
        hub.publish(old, json!({"kind": "step"}));
        hub.publish(new, json!({"kind": "start"}));
        let (replay, _) = hub.subscribe();
        assert_eq!(kinds(&replay), ["ready", "start"]);
        // The old gate's input is closed: its pauses no longer wait.
        assert_eq!(gate.pause(Pause::Step).await, Ok(String::new()));
    }

    #[tokio::test]
    async fn an_answer_is_refused_where_no_prediction_waits() {
        let hub = hub();
        let (epoch, _reader) = hub.begin(json!({}));
        hub.gate_paused(epoch, Pause::Step);
        let refused = hub
            .control(Command::Answer {
                pause: None,
                letter: 'a',
            })
            .unwrap_err();
        assert_eq!(refused.status, StatusCode::CONFLICT);
        assert!(hub.control(Command::Next { pause: None }).is_ok());
    }
}
