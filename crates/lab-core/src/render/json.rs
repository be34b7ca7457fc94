//! JSON lines: one object per event, texts rendered in the chosen language. The last line of a
//! scenario is its summary, `{"event":"summary","scenario":…,"facts":…,"expected":…,"passed":…}`
//! (the machine-readable contract of SCENARIOS.md).

use std::sync::Arc;

use serde_json::{Value, json};

use super::reflow;
use crate::text::COMMON;
use crate::{Event, Fault, Lang, Msg, Texts};

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

    /// The JSON object of one event.
    pub fn value(&mut self, event: &Event) -> Value {
        match event {
            Event::Start { scenario } => {
                self.scope = scenario.clone();
                self.prediction = None;
                self.learner = None;
                json!({"event": "start", "scenario": scenario, "title": self.key("title"), "story": reflow(&self.key("story"))})
            }
            Event::Side { text } => json!({"event": "side", "text": self.t(text)}),
            Event::Step { number, text } => {
                json!({"event": "step", "n": number, "text": self.t(text)})
            }
            Event::Request {
                text, timeout_ms, ..
            } => {
                let mut request = json!({"event": "request", "text": self.t(text)});
                // Only a call whose client's timeout matters says it: the others keep their shape.
                if let Some(ms) = timeout_ms {
                    request["timeout_ms"] = json!(ms);
                }
                request
            }
            Event::Response {
                outcome,
                status,
                body,
                detail,
            } => {
                // A JSON body is embedded as JSON; anything else as a string.
                let body = body
                    .as_ref()
                    .map(|b| serde_json::from_str::<Value>(b).unwrap_or_else(|_| json!(b)));
                json!({
                    "event": "response",
                    "outcome": outcome,
                    "status": status,
                    "body": body,
                    "detail": detail.as_ref().map(|d| self.t(d)),
                })
            }
            Event::Service { service, text } => {
                json!({"event": "service", "service": service, "text": self.t(text)})
            }
            Event::Executed(executed) => {
                let mut value = json!({"event": "executed"});
                if let (Value::Object(value), Ok(Value::Object(fields))) =
                    (&mut value, serde_json::to_value(executed))
                {
                    value.extend(fields);
                }
                value
            }
            Event::State { table } => json!({
                "event": "state",
                "title": self.t(&table.title),
                "columns": table.columns,
                "rows": table.rows,
            }),
            Event::Note { text } => json!({"event": "note", "text": reflow(&self.t(text))}),
            Event::Predict { prefix } => {
                self.prediction = Some(prefix.clone());
                self.learner = None;
                json!({
                    "event": "predict",
                    "question": self.key(&format!("{prefix}.question")),
                    "options": self.texts.list(&self.scope, self.lang, &format!("{prefix}.options")),
                })
            }
            Event::LearnerAnswer { answer } => {
                self.learner = Some(answer.clone());
                json!({"event": "learner_answer", "answer": answer})
            }
            Event::Reveal { answer } => {
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
            Event::Fact { name, value } => json!({"event": "fact", "name": name, "value": value}),
            Event::Fault { hop, fault } => {
                let mut line = json!({"event": "fault", "hop": hop, "fault": fault.word()});
                if let Fault::Held { millis } = fault {
                    line["millis"] = json!(millis);
                }
                line
            }
            Event::Checkpoint { point } => json!({"event": "checkpoint", "point": point}),
            Event::Explain => json!({
                "event": "explain",
                "text": reflow(&self.key("explain")),
                "checklist": self.texts.list(&self.scope, self.lang, "checklist"),
            }),
            Event::Quiz => {
                let mut quiz = json!({
                    "event": "quiz",
                    "questions": self.texts.list(&self.scope, self.lang, "quiz"),
                });
                if self.answers {
                    quiz["answers"] =
                        json!(self.texts.list(&self.scope, self.lang, "quiz_answers"));
                }
                quiz
            }
            Event::Summary {
                scenario,
                facts,
                expected,
                passed,
                settings,
            } => {
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
        }
    }

    /// One event as one line.
    pub fn render(&mut self, event: &Event) -> String {
        format!("{}\n", self.value(event))
    }
}
