//! JSON lines: one object per event, texts rendered in the chosen language. The last line of a
//! scenario is its summary, `{"event":"summary","scenario":…,"facts":…,"expected":…,"passed":…}`
//! (the machine-readable contract of SCENARIOS.md).

use std::sync::Arc;

use serde_json::{Value, json};

use super::fold::{Fold, Folded};
use super::reflow;
use crate::text::COMMON;
use crate::{Event, Executed, Facts, Fault, Lang, Msg, Outcome, Texts};

/// Renders events as JSON lines.
pub struct JsonRenderer {
    texts: Arc<Texts>,
    lang: Lang,
    scope: String,
    /// The prediction asked last, and the learner's answer to it, for grading at the reveal.
    prediction: Option<String>,
    learner: Option<String>,
    /// Include the model answers of the quiz (`--answers`).
    answers: bool,
    /// The services' lines that say why, folded until the reveal.
    fold: Fold,
}

impl JsonRenderer {
    pub fn new(texts: Arc<Texts>, lang: Lang) -> JsonRenderer {
        JsonRenderer {
            texts,
            lang,
            scope: COMMON.to_string(),
            prediction: None,
            learner: None,
            answers: false,
            fold: Fold::new(),
        }
    }

    /// Includes the model answer of each quiz question.
    pub fn with_answers(mut self, answers: bool) -> JsonRenderer {
        self.answers = answers;
        self
    }

    fn t(&self, msg: &Msg) -> String {
        self.texts.render(&self.scope, self.lang, msg)
    }

    fn key(&self, key: &str) -> String {
        self.t(&Msg::new(key))
    }

    /// The JSON object of one event. A reveal (or the end of a part that revealed nothing)
    /// carries `unfolded`: the services' lines folded until then, in full.
    pub fn value(&mut self, event: &Event) -> Value {
        self.fold.see(event);
        let unfolded = self.fold.unfold(event);
        let mut value = self.event_value(event);
        if !unfolded.is_empty() {
            value["unfolded"] = self.unfolded(&unfolded);
        }
        value
    }

    /// `[{"service": …, "step": 3, "text": …}]`: folded lines, in full.
    fn unfolded(&self, lines: &[Folded]) -> Value {
        lines
            .iter()
            .map(|l| json!({"service": l.service, "step": l.step, "text": self.t(&l.text)}))
            .collect()
    }

    fn event_value(&mut self, event: &Event) -> Value {
        match event {
            Event::Start { scenario } => self.start(scenario),
            Event::Side { text } => json!({"event": "side", "text": self.t(text)}),
            Event::Step { number, text } => {
                json!({"event": "step", "n": number, "text": self.t(text)})
            }
            Event::Request {
                text, timeout_ms, ..
            } => self.request(text, *timeout_ms),
            Event::Response {
                outcome,
                status,
                body,
                detail,
            } => self.response(*outcome, *status, body.as_deref(), detail.as_ref()),
            Event::Service { service, text } => {
                let shown = self
                    .fold
                    .service(&self.texts, &self.scope, self.lang, service, text);
                let mut line =
                    json!({"event": "service", "service": service, "text": self.t(&shown)});
                if shown != *text {
                    line["folded"] = json!(true);
                }
                line
            }
            Event::Executed(executed) => Self::executed(executed),
            Event::State { table } => json!({
                "event": "state",
                "title": self.t(&table.title),
                "columns": table.columns,
                "rows": table.rows,
            }),
            Event::Note { text } => json!({"event": "note", "text": reflow(&self.t(text))}),
            Event::Predict { prefix } => self.predict(prefix),
            Event::LearnerAnswer { answer } => {
                self.learner = Some(answer.clone());
                json!({"event": "learner_answer", "answer": answer})
            }
            Event::Reveal { answer } => self.reveal(answer),
            Event::Fact { name, value } => json!({"event": "fact", "name": name, "value": value}),
            Event::Fault { hop, fault } => Self::fault(hop, fault),
            Event::Checkpoint { point } => json!({"event": "checkpoint", "point": point}),
            Event::Explain => json!({
                "event": "explain",
                "text": reflow(&self.key("explain")),
                "checklist": self.texts.list(&self.scope, self.lang, "checklist"),
            }),
            Event::Quiz => self.quiz(),
            Event::Summary {
                scenario,
                facts,
                expected,
                passed,
                settings,
            } => Self::summary(scenario, facts, expected, *passed, settings),
        }
    }

    /// `start`: the scenario, its title and its story. Forgets the previous scenario's
    /// prediction.
    fn start(&mut self, scenario: &str) -> Value {
        self.scope = scenario.to_string();
        self.prediction = None;
        self.learner = None;
        json!({"event": "start", "scenario": scenario, "title": self.key("title"), "story": reflow(&self.key("story"))})
    }

    /// `request`: what is told of the call, and the caller's timeout when the story is about it.
    fn request(&self, text: &Msg, timeout_ms: Option<u64>) -> Value {
        let mut request = json!({"event": "request", "text": self.t(text)});
        // Only a call whose client's timeout matters says it: the others keep their shape.
        if let Some(ms) = timeout_ms {
            request["timeout_ms"] = json!(ms);
        }
        request
    }

    /// `response`: the outcome, the status, the body and why, each `null` when absent.
    fn response(
        &self,
        outcome: Outcome,
        status: Option<u16>,
        body: Option<&str>,
        detail: Option<&Msg>,
    ) -> Value {
        // A JSON body is embedded as JSON; anything else as a string.
        let body = body.map(|b| serde_json::from_str::<Value>(b).unwrap_or_else(|_| json!(b)));
        json!({
            "event": "response",
            "outcome": outcome,
            "status": status,
            "body": body,
            "detail": detail.map(|d| self.t(d)),
        })
    }

    /// `executed`: the statement or command with every field of [`Executed`] beside `event`.
    fn executed(executed: &Executed) -> Value {
        let mut value = json!({"event": "executed"});
        if let (Value::Object(value), Ok(Value::Object(fields))) =
            (&mut value, serde_json::to_value(executed))
        {
            value.extend(fields);
        }
        value
    }

    /// `predict`: the question and its options. Remembers the question, for grading at the
    /// reveal.
    fn predict(&mut self, prefix: &str) -> Value {
        self.prediction = Some(prefix.to_string());
        self.learner = None;
        json!({
            "event": "predict",
            "question": self.key(&format!("{prefix}.question")),
            "options": self.texts.list(&self.scope, self.lang, &format!("{prefix}.options")),
        })
    }

    /// `reveal`: the right option (letter and text), whether the learner got it right (when
    /// they answered), and the explanation.
    fn reveal(&mut self, answer: &Msg) -> Value {
        let prefix = self.prediction.clone().unwrap_or_else(|| "predict".into());
        let right = self.texts.prediction(&self.scope, self.lang, &prefix);
        let learner_right = self
            .learner
            .take()
            .and_then(|given| self.texts.grade(&self.scope, self.lang, &prefix, &given));
        json!({
            "event": "reveal",
            "right": right.as_ref().map(|(letter, _)| letter.to_string()),
            "right_option": right.map(|(_, option)| option),
            "learner_right": learner_right,
            "answer": reflow(&self.t(answer)),
        })
    }

    /// `fault`: the hop and the fault, with how long answers are held for a hold.
    fn fault(hop: &str, fault: &Fault) -> Value {
        let mut line = json!({"event": "fault", "hop": hop, "fault": fault.word()});
        if let Fault::Held { millis } = fault {
            line["millis"] = json!(millis);
        }
        line
    }

    /// `quiz`: the questions, and their model answers with `--answers`.
    fn quiz(&self) -> Value {
        let mut quiz = json!({
            "event": "quiz",
            "questions": self.texts.list(&self.scope, self.lang, "quiz"),
        });
        if self.answers {
            quiz["answers"] = json!(self.texts.list(&self.scope, self.lang, "quiz_answers"));
        }
        quiz
    }

    /// `summary`: the last line of a scenario, the contract of SCENARIOS.md, with the knobs set
    /// when there are any.
    fn summary(
        scenario: &str,
        facts: &Facts,
        expected: &Facts,
        passed: bool,
        settings: &[(String, String)],
    ) -> Value {
        let mut summary = json!({
            "event": "summary",
            "scenario": scenario,
            "facts": facts,
            "expected": expected,
            "passed": passed,
        });
        // Only a run with knobs set says so: the default run's line keeps its shape.
        if !settings.is_empty() {
            summary["settings"] = settings
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        summary
    }

    /// One event as one line.
    pub fn render(&mut self, event: &Event) -> String {
        format!("{}\n", self.value(event))
    }
}
