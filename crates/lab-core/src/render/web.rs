//! The web view's renderer: each event as one JSON message for the page, in both languages at
//! once, with what it adds to the sequence diagram.
//!
//! The page (`lab run NAME --web`) is a renderer of the same event stream as the terminal, not a
//! second telling of the scenarios: the texts come from [`JsonRenderer`] (one per language, so
//! the page can switch language without asking the server), the diagram from the same
//! [`Reader`] that draws `--diagram` and the Mermaid artifact. A message looks like:
//!
//! ```json
//! {"kind": "response",
//!  "en": {"event": "response", "outcome": "unknown", …}, "ru": {…},
//!  "lanes": [{"id": "worker.a", "name": {"en": "worker A", "ru": "воркер A"}}],
//!  "draw": [{"mark": "answer", "from": 1, "to": 0, "outcome": "unknown", "call": 3,
//!            "label": {"en": "unknown: no answer in time…", "ru": "…"}}]}
//! ```
//!
//! `lanes` are the participants that first appear with this event (in order; a mark's `from`,
//! `to` and `at` index all lanes so far), `draw` the marks it adds. A mark's index (its `id`) is
//! its position among all marks of the scenario, which is how an answer names its call.

use std::sync::Arc;

use serde_json::{Value, json};

use super::JsonRenderer;
use super::diagram::{Mark, Reader};
use crate::text::COMMON;
use crate::{Event, Fault, Lang, Msg, Texts};

/// What one language's reader added for an event: the new lanes (id, name) and the new marks.
struct Added {
    lang: Lang,
    lanes: Vec<(String, String)>,
    marks: Vec<Mark>,
}

/// Renders events as the web view's messages.
pub struct WebRenderer {
    texts: Arc<Texts>,
    /// One per language, in [`Lang::ALL`] order, each with its own state (the scenario, the
    /// prediction asked last).
    json: Vec<(Lang, JsonRenderer)>,
    readers: Vec<(Lang, Reader)>,
}

impl WebRenderer {
    pub fn new(texts: Arc<Texts>, answers: bool) -> WebRenderer {
        WebRenderer {
            json: Lang::ALL
                .iter()
                .map(|&lang| {
                    (
                        lang,
                        JsonRenderer::new(texts.clone(), lang).with_answers(answers),
                    )
                })
                .collect(),
            readers: Lang::ALL
                .iter()
                .map(|&lang| (lang, Reader::with_faults(lang)))
                .collect(),
            texts,
        }
    }

    /// `{"en": …, "ru": …}` from one value per language.
    fn both(values: impl IntoIterator<Item = (Lang, Value)>) -> Value {
        values
            .into_iter()
            .map(|(lang, v)| (lang.code().to_string(), v))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The message for one event.
    pub fn render(&mut self, event: &Event) -> Value {
        if matches!(event, Event::Start { .. }) {
            // A new scenario draws a new picture.
            for (lang, reader) in &mut self.readers {
                *reader = Reader::with_faults(*lang);
            }
        }
        let texts: Vec<(Lang, Value)> = self
            .json
            .iter_mut()
            .map(|(lang, r)| (*lang, r.value(event)))
            .collect();
        let kind = texts
            .first()
            .and_then(|(_, v)| v["event"].as_str())
            .unwrap_or_default()
            .to_string();
        let (lanes, draw) = self.draw(event);
        let mut message = json!({"kind": kind});
        for (lang, value) in texts {
            message[lang.code()] = value;
        }
        if let Event::State { table } = event {
            // The title's key names the table in every language: the page compares snapshots
            // of the same table to show what changed.
            message["table"] = json!(table.title.key);
        }
        if !lanes.is_empty() {
            message["lanes"] = json!(lanes);
        }
        if !draw.is_empty() {
            message["draw"] = json!(draw);
        }
        let redraw = self.redraw();
        if !redraw.is_empty() {
            message["redraw"] = json!(redraw);
        }
        message
    }

    /// The notes this event gave their full text (a reveal unfolds the services' why lines):
    /// `[{"id": 4, "text": {"en": …, "ru": …}}]`.
    fn redraw(&self) -> Vec<Value> {
        let Some((_, first)) = self.readers.first() else {
            return Vec::new();
        };
        first
            .unfolded()
            .iter()
            .map(|&id| {
                let text = Self::both(self.readers.iter().map(|(lang, reader)| {
                    (*lang, json!(mark_text(reader.picture().marks.get(id))))
                }));
                json!({"id": id, "text": text})
            })
            .collect()
    }

    /// The lanes and marks an event adds, with their texts in both languages.
    fn draw(&mut self, event: &Event) -> (Vec<Value>, Vec<Value>) {
        let added = self.read(event);
        let Some(Added {
            lanes: first_lanes,
            marks: first_marks,
            ..
        }) = added.first()
        else {
            return (Vec::new(), Vec::new());
        };
        // Every language reads the same events into the same structure; only texts differ.
        let first_id = {
            let reader = &self.readers[0].1;
            reader.picture().marks.len() - first_marks.len()
        };
        let lanes = first_lanes
            .iter()
            .enumerate()
            .map(|(i, (id, _))| {
                let names = added.iter().map(|a| {
                    let name = a.lanes.get(i).map(|(_, n)| n.clone()).unwrap_or_default();
                    (a.lang, json!(name))
                });
                json!({"id": id, "name": Self::both(names)})
            })
            .collect();
        let draw = first_marks
            .iter()
            .enumerate()
            .map(|(i, mark)| {
                let text = Self::both(
                    added
                        .iter()
                        .map(|a| (a.lang, json!(mark_text(a.marks.get(i))))),
                );
                self.mark(mark, first_id + i, text)
            })
            .collect();
        (lanes, draw)
    }

    /// Reads the event with each language's reader: what each added, in [`Lang::ALL`] order.
    fn read(&mut self, event: &Event) -> Vec<Added> {
        let mut added: Vec<Added> = Vec::new();
        for (lang, reader) in &mut self.readers {
            let lanes_before = reader.picture().participants.len();
            let count = reader.read(&self.texts, event);
            let picture = reader.picture();
            let lanes = picture.ids[lanes_before..]
                .iter()
                .cloned()
                .zip(picture.participants[lanes_before..].iter().cloned())
                .collect();
            let marks = picture.marks[picture.marks.len() - count..].to_vec();
            added.push(Added {
                lang: *lang,
                lanes,
                marks,
            });
        }
        added
    }

    /// One mark as the page draws it: its kind, its index `id`, the lanes it joins, and `text`
    /// (its label or text in both languages).
    fn mark(&self, mark: &Mark, id: usize, text: Value) -> Value {
        match mark {
            Mark::Step { .. } => json!({"mark": "step", "id": id, "text": text}),
            Mark::Call {
                from,
                to,
                timeout_ms,
                ..
            } => json!({
                "mark": "call", "id": id, "from": from, "to": to,
                "timeout_ms": timeout_ms, "label": text,
            }),
            Mark::Answer {
                from,
                to,
                outcome,
                call,
                ..
            } => json!({
                "mark": "answer", "id": id, "from": from, "to": to,
                "outcome": outcome, "call": call, "label": text,
            }),
            Mark::Note { at, .. } => {
                json!({"mark": "note", "id": id, "at": at, "text": text})
            }
            Mark::Fault { at, hop, fault, .. } => {
                let millis = match fault {
                    Fault::Held { millis } => Some(*millis),
                    _ => None,
                };
                // The hop's name too: the fault may come before its lane does.
                let hop_name = Self::both(Lang::ALL.iter().map(|&lang| {
                    let name = self.texts.render(COMMON, lang, &Msg::new(hop.as_str()));
                    (lang, json!(name))
                }));
                json!({
                    "mark": "fault", "id": id, "at": at, "hop": hop,
                    "hop_name": hop_name, "fault": fault.word(), "millis": millis,
                    "label": text,
                })
            }
            Mark::Checkpoint { at, .. } => {
                json!({"mark": "checkpoint", "id": id, "at": at, "label": text})
            }
        }
    }
}

/// The words of one language's mark: its label, or its text for a note or a step (empty when
/// that language has no such mark).
fn mark_text(mark: Option<&Mark>) -> String {
    match mark {
        Some(
            Mark::Call { label, .. }
            | Mark::Answer { label, .. }
            | Mark::Fault { label, .. }
            | Mark::Checkpoint { label, .. },
        ) => label.clone(),
        Some(Mark::Note { text, .. } | Mark::Step { text }) => text.clone(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    fn texts() -> Arc<Texts> {
        let mut texts = Texts::new();
        for (lang, source) in [
            (
                Lang::En,
                "title = \"T\"\nstory = \"S\"\n[worker]\na = \"worker A\"\n[service]\nreports = \"report service\"\n[outcome]\nunknown = \"unknown\"\n[fault]\nheld = \"held {ms} ms\"\n[call]\nx = \"worker A → report service: POST /reports\"\n",
            ),
            (
                Lang::Ru,
                "title = \"Т\"\nstory = \"С\"\n[worker]\na = \"воркер A\"\n[service]\nreports = \"сервис отчётов\"\n[outcome]\nunknown = \"неизвестно\"\n[fault]\nheld = \"задержан на {ms} мс\"\n[call]\nx = \"воркер A → сервис отчётов: POST /reports\"\n",
            ),
        ] {
            texts.add(crate::text::COMMON, lang, source).unwrap();
        }
        Arc::new(texts)
    }

    #[test]
    fn a_call_its_fault_and_its_lost_answer_in_both_languages() {
        let mut web = WebRenderer::new(texts(), false);
        let start = web.render(&Event::Start {
            scenario: "x".into(),
        });
        assert_eq!(start["kind"], "start");
        assert_eq!(start["en"]["title"], "T");
        assert_eq!(start["ru"]["title"], "Т");

        let fault = web.render(&Event::Fault {
            hop: "reports".into(),
            fault: Fault::Held { millis: 900 },
        });
        assert_eq!(fault["draw"][0]["mark"], "fault");
        assert_eq!(fault["draw"][0]["at"], Value::Null, "no lane yet");
        assert_eq!(fault["draw"][0]["hop"], "service.reports");
        assert_eq!(fault["draw"][0]["millis"], 900);
        assert_eq!(fault["draw"][0]["label"]["ru"], "задержан на 900 мс");
        assert_eq!(fault["draw"][0]["hop_name"]["en"], "report service");

        let call = web.render(&Event::Request {
            text: Msg::new("call.x"),
            from: Some("worker.a".into()),
            to: Some("reports".into()),
            timeout_ms: Some(150),
        });
        assert_eq!(call["lanes"][0]["id"], "worker.a");
        assert_eq!(call["lanes"][1]["name"]["ru"], "сервис отчётов");
        let mark = &call["draw"][0];
        assert_eq!(
            (
                &mark["mark"],
                &mark["from"],
                &mark["to"],
                &mark["timeout_ms"]
            ),
            (&json!("call"), &json!(0), &json!(1), &json!(150))
        );
        assert_eq!(mark["label"]["en"], "POST /reports");

        let answer = web.render(&Event::Response {
            outcome: Outcome::Unknown,
            status: None,
            body: None,
            detail: None,
        });
        let mark = &answer["draw"][0];
        assert_eq!(mark["mark"], "answer");
        assert_eq!(
            mark["call"], call["draw"][0]["id"],
            "the answer names its call"
        );
        assert_eq!(mark["outcome"], "unknown");
        assert_eq!(mark["label"]["ru"], "неизвестно");
        assert!(answer.get("lanes").is_none());
    }
}
