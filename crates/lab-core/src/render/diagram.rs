//! Pictures of a recorded run: who called whom, in the order it happened.
//!
//! Both pictures come from the same reading of the events ([`calls`]): a caller's request and
//! its answer (ok, fail, unknown), a relay's call to the next service and what it got back, and
//! what each participant did in between. [`mermaid`] writes a Mermaid sequence diagram (for
//! slides, docs and `--artifacts`); [`swimlanes`] draws the same as lanes in a terminal
//! (`--diagram`), one per participant.
//!
//! The SQL statements and Redis commands a run executed ([`Event::Executed`]) are arrows too,
//! into lanes of their own, drawn right of everyone else: our database (the scenario's own
//! tables), each service's database, Redis. So `timeout` reads request → INSERT → COMMIT → the
//! client gives up. (The web view draws the calls between participants only.)
//!
//! The relays of the chain report their calls as service messages (`relay.calling`,
//! `relay.answered`, `relay.retrying_*`); their arguments name the service called, which is how
//! those become arrows too.

use std::fmt::Write as _;

use super::fold::Fold;
use crate::text::{Arg, COMMON};
use crate::{Event, Executed, Fault, Lang, Msg, Outcome, Server, Texts};

/// One thing in the picture.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// `from` calls `to`; `timeout_ms` is how long the caller waits, when the story says.
    Call {
        from: usize,
        to: usize,
        label: String,
        timeout_ms: Option<u64>,
    },
    /// `from`'s answer reaches `to`, or (unknown) never does. `call` is the index of the
    /// [`Mark::Call`] it answers, when known.
    Answer {
        from: usize,
        to: usize,
        outcome: Outcome,
        label: String,
        call: Option<usize>,
    },
    /// Something a participant did or said.
    Note { at: usize, text: String },
    /// A step of the story.
    Step { text: String },
    /// A fault put on (or taken off) the hop in front of a participant: `at`, when it has been
    /// drawn already, else the one that will get the id `hop` (`service.<name>`). Only
    /// [`Reader::with_faults`].
    Fault {
        at: Option<usize>,
        hop: String,
        fault: Fault,
        label: String,
    },
    /// A participant reached a checkpoint the scenario holds. Only [`Reader::with_faults`].
    Checkpoint { at: usize, label: String },
}

/// The participants (their names, in order of appearance) and the marks between them.
#[derive(Debug, Default)]
pub struct Picture {
    pub participants: Vec<String>,
    /// The id of each participant: the key its name comes from (`worker.a`, `service.reports`),
    /// the same in every language.
    pub ids: Vec<String>,
    pub marks: Vec<Mark>,
}

impl Picture {
    /// A participant by name: two keys with the same name (`worker.a`, `service.worker_a`) are
    /// one lane. The id is the first key seen.
    fn participant(&mut self, id: String, name: String) -> usize {
        match self.participants.iter().position(|p| *p == name) {
            Some(i) => i,
            None => {
                self.ids.push(id);
                self.participants.push(name);
                self.participants.len() - 1
            }
        }
    }
}

/// The service a message names in its `next` argument (`Msg service.<name>`), if any.
fn next_service(msg: &Msg) -> Option<String> {
    msg.args
        .iter()
        .find_map(|(name, arg)| match (name.as_str(), arg) {
            ("next", Arg::Msg(inner)) => inner.key.strip_prefix("service.").map(str::to_string),
            _ => None,
        })
}

/// Reads events one at a time into a [`Picture`]: what [`calls`] does for a whole run, and the
/// web view does as events arrive.
pub struct Reader {
    lang: Lang,
    picture: Picture,
    scope: String,
    /// Open requests: (caller, callee, index of the call's mark), the most recent last.
    open: Vec<(usize, usize, usize)>,
    /// Whether faults and checkpoints become marks (the terminal pictures leave them out).
    faults: bool,
    /// Whether statements and commands become arrows into database and Redis lanes (the
    /// terminal and Mermaid pictures draw them; the web view leaves them out).
    stores: bool,
    /// The lanes of databases and Redis, to move right of the others at the end.
    store_lanes: Vec<usize>,
    /// The services' lines that say why, folded until the reveal, and the notes drawn folded
    /// (index, full text) since; at the reveal those notes get their full text.
    fold: Fold,
    folded_notes: Vec<(usize, String)>,
    /// The notes the last event unfolded (for the web view, which redraws them).
    unfolded: Vec<usize>,
}

impl Reader {
    /// A reader of calls, answers, notes and steps.
    pub fn new(lang: Lang) -> Reader {
        Reader {
            lang,
            picture: Picture::default(),
            scope: COMMON.to_string(),
            open: Vec::new(),
            faults: false,
            stores: false,
            store_lanes: Vec::new(),
            fold: Fold::new(),
            folded_notes: Vec::new(),
            unfolded: Vec::new(),
        }
    }

    /// The notes the last event read gave their full text (a reveal unfolds them).
    pub fn unfolded(&self) -> &[usize] {
        &self.unfolded
    }

    /// A reader that also draws statements and commands into database and Redis lanes.
    pub fn with_stores(lang: Lang) -> Reader {
        Reader {
            stores: true,
            ..Reader::new(lang)
        }
    }

    /// A reader that also marks faults and checkpoints.
    pub fn with_faults(lang: Lang) -> Reader {
        Reader {
            faults: true,
            ..Reader::new(lang)
        }
    }

    pub fn picture(&self) -> &Picture {
        &self.picture
    }

    /// The picture, with the database and Redis lanes moved right of every other lane.
    pub fn into_picture(self) -> Picture {
        stores_last(self.picture, &self.store_lanes)
    }

    fn label(&self, texts: &Texts, key: &str) -> String {
        texts.render(&self.scope, self.lang, &Msg::new(key))
    }

    /// A participant by the key of its name.
    fn participant(&mut self, texts: &Texts, key: &str) -> usize {
        let name = self.label(texts, key);
        self.picture.participant(key.to_string(), name)
    }

    /// The latest call from `from` to `to` that has no answer yet.
    fn unanswered(&self, from: usize, to: usize) -> Option<usize> {
        let answered: Vec<usize> = self
            .picture
            .marks
            .iter()
            .filter_map(|m| match m {
                Mark::Answer { call, .. } => *call,
                _ => None,
            })
            .collect();
        self.picture
            .marks
            .iter()
            .enumerate()
            .rev()
            .find(|(i, m)| {
                matches!(m, Mark::Call { from: f, to: t, .. } if *f == from && *t == to)
                    && !answered.contains(i)
            })
            .map(|(i, _)| i)
    }

    /// A message rendered in the reader's scenario and language.
    fn render(&self, texts: &Texts, msg: &Msg) -> String {
        texts.render(&self.scope, self.lang, msg)
    }

    /// Reads one event; returns how many marks it added (at the end of the picture's marks).
    pub fn read(&mut self, texts: &Texts, event: &Event) -> usize {
        let before = self.picture.marks.len();
        self.fold.see(event);
        self.unfolded.clear();
        if !self.fold.unfold(event).is_empty() {
            for (i, text) in std::mem::take(&mut self.folded_notes) {
                if let Some(Mark::Note { text: shown, .. }) = self.picture.marks.get_mut(i) {
                    *shown = text;
                    self.unfolded.push(i);
                }
            }
        }
        match event {
            Event::Start { scenario } => self.scope = scenario.clone(),
            Event::Step { number, text } => self.step(texts, *number, text),
            Event::Request {
                text,
                from: Some(from),
                to: Some(to),
                timeout_ms,
            } => self.request(texts, text, from, to, *timeout_ms),
            Event::Response {
                outcome,
                status,
                detail,
                ..
            } => self.response(texts, *outcome, *status, detail.as_ref()),
            Event::Service { service, text } => self.service(texts, service, text),
            Event::Executed(executed) if self.stores => self.executed(texts, executed),
            Event::Fault { hop, fault } if self.faults => self.fault(texts, hop, fault),
            Event::Checkpoint { point } if self.faults => self.checkpoint(texts, point),
            _ => {}
        }
        self.picture.marks.len() - before
    }

    /// A step of the story, on one line: `7. Worker B claims the same task: …`.
    fn step(&mut self, texts: &Texts, number: u32, text: &Msg) {
        let text = format!(
            "{number}. {}",
            self.render(texts, text)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        );
        self.picture.marks.push(Mark::Step { text });
    }

    /// A call from one of our actors to a service, left open until its answer.
    fn request(
        &mut self,
        texts: &Texts,
        text: &Msg,
        from: &str,
        to: &str,
        timeout_ms: Option<u64>,
    ) {
        let from = self.participant(texts, from);
        let to = self.participant(texts, &format!("service.{to}"));
        let told = self.render(texts, text);
        // "who → service: POST …": the arrow already says who and where.
        let short = told
            .split_once(": ")
            .map_or(told.clone(), |(_, rest)| rest.to_string());
        self.open.push((from, to, self.picture.marks.len()));
        self.picture.marks.push(Mark::Call {
            from,
            to,
            label: short,
            timeout_ms,
        });
    }

    /// The answer to the most recent open call, back from the callee to its caller:
    /// `unknown: …`, `ok 201`.
    fn response(
        &mut self,
        texts: &Texts,
        outcome: Outcome,
        status: Option<u16>,
        detail: Option<&Msg>,
    ) {
        let Some((caller, callee, call)) = self.open.pop() else {
            return;
        };
        let mut label = self.label(texts, &format!("outcome.{}", outcome.word()));
        if let Some(status) = status {
            let _ = write!(label, " {status}");
        }
        if let Some(detail) = detail {
            let _ = write!(label, ": {}", self.render(texts, detail));
        }
        self.picture.marks.push(Mark::Answer {
            from: callee,
            to: caller,
            outcome,
            label,
            call: Some(call),
        });
    }

    /// What a service did: a note in its lane, or, for a relay calling the next service (and
    /// what came back, or did not), an arrow between the two.
    fn service(&mut self, texts: &Texts, service: &str, text: &Msg) {
        let at = self.participant(texts, &format!("service.{service}"));
        let shown = self
            .fold
            .service(texts, &self.scope, self.lang, service, text);
        if shown != *text {
            let full = self.render(texts, text);
            self.folded_notes.push((self.picture.marks.len(), full));
        }
        let told = self.render(texts, &shown);
        let next = next_service(text).map(|n| self.participant(texts, &format!("service.{n}")));
        let mark = match (text.key.as_str(), next) {
            ("relay.calling", Some(next)) => Mark::Call {
                from: at,
                to: next,
                label: told,
                timeout_ms: None,
            },
            ("relay.answered", Some(next)) => Mark::Answer {
                from: next,
                to: at,
                outcome: Outcome::Ok,
                label: told,
                call: self.unanswered(at, next),
            },
            (key, Some(next)) if key.starts_with("relay.retrying") => Mark::Answer {
                from: next,
                to: at,
                outcome: Outcome::Unknown,
                label: told,
                call: self.unanswered(at, next),
            },
            _ => Mark::Note { at, text: told },
        };
        self.picture.marks.push(mark);
    }

    /// A statement or command, as an arrow from whoever ran it into the lane of its database
    /// (ours or the service's) or of Redis.
    fn executed(&mut self, texts: &Texts, executed: &Executed) {
        let from = match &executed.by {
            Some(service) => self.participant(texts, &format!("service.{service}")),
            None => self.participant(texts, "lane.ours"),
        };
        let (id, name) = match (&executed.server, &executed.by) {
            (Server::Redis, _) => ("redis".to_string(), "Redis".to_string()),
            (Server::Postgres, None) => {
                ("lane.our_db".to_string(), self.label(texts, "lane.our_db"))
            }
            (Server::Postgres, Some(service)) => (
                format!("lane.service_db.{service}"),
                self.render(
                    texts,
                    &Msg::new("lane.service_db")
                        .arg("service", Msg::new(format!("service.{service}"))),
                ),
            ),
        };
        let to = self.picture.participant(id, name);
        if !self.store_lanes.contains(&to) {
            self.store_lanes.push(to);
        }
        self.picture.marks.push(Mark::Call {
            from,
            to,
            label: executed_label(executed),
            timeout_ms: None,
        });
    }

    /// A fault put on (or taken off) the hop in front of a service: `answers held 900 ms …`.
    fn fault(&mut self, texts: &Texts, hop: &str, fault: &Fault) {
        let mut label = Msg::new(format!("fault.{}", fault.word()));
        if let Fault::Held { millis } = fault {
            label = label.arg("ms", i64::try_from(*millis).unwrap_or(i64::MAX));
        }
        let label = self.render(texts, &label);
        let hop = format!("service.{hop}");
        let name = self.label(texts, &hop);
        let at = self.picture.participants.iter().position(|p| *p == name);
        self.picture.marks.push(Mark::Fault {
            at,
            hop,
            fault: *fault,
            label,
        });
    }

    /// A checkpoint the scenario holds, marked in the lane of the service that reached it.
    fn checkpoint(&mut self, texts: &Texts, point: &str) {
        // Points are named `<service>.<where>`: the service is the lane.
        let service = point.split('.').next().unwrap_or(point);
        let at = self.participant(texts, &format!("service.{service}"));
        let label = self.render(texts, &Msg::new("fault.checkpoint").arg("point", point));
        self.picture.marks.push(Mark::Checkpoint { at, label });
    }
}

/// A statement or command as an arrow's label: what it did to what, and the server's answer
/// (`INSERT INTO reports → INSERT 0 1`, `SET …:K1 … NX GET PX 30000 → (nil)`).
fn executed_label(executed: &Executed) -> String {
    const LONGEST: usize = 48;
    let cut = |text: &str| -> String {
        if text.chars().count() > LONGEST {
            format!("{}…", text.chars().take(LONGEST).collect::<String>())
        } else {
            text.to_string()
        }
    };
    let words: Vec<&str> = executed.text.split_whitespace().collect();
    let first_words = |n: usize| words.iter().take(n).copied().collect::<Vec<_>>().join(" ");
    let what = match executed.server {
        Server::Postgres => match words.first().map(|w| w.to_ascii_uppercase()).as_deref() {
            Some("INSERT") | Some("DELETE") => first_words(3),
            Some("UPDATE") => first_words(2),
            Some("SELECT") | Some("WITH") => {
                match words.iter().position(|w| w.eq_ignore_ascii_case("FROM")) {
                    Some(from) => format!("SELECT … FROM {}", words.get(from + 1).unwrap_or(&"")),
                    None => cut(&executed.text),
                }
            }
            _ => cut(&executed.text),
        },
        // The run's key prefix (`lab:1a2b3c4d:`) says nothing about the story.
        Server::Redis => cut(&words
            .iter()
            .map(|w| match w.find("lab:") {
                Some(0) | Some(1) => w
                    .splitn(3, ':')
                    .nth(2)
                    .map_or(w.to_string(), |rest| format!("…:{rest}")),
                _ => w.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ")),
    };
    if executed.result.is_empty() || executed.result == what {
        what
    } else {
        format!("{what} → {}", cut(&executed.result))
    }
}

/// Moves the lanes in `stores` right of every other lane, keeping each group's order.
fn stores_last(picture: Picture, stores: &[usize]) -> Picture {
    let count = picture.participants.len();
    let order: Vec<usize> = (0..count)
        .filter(|i| !stores.contains(i))
        .chain((0..count).filter(|i| stores.contains(i)))
        .collect();
    let moved = |old: usize| order.iter().position(|&i| i == old).unwrap_or(old);
    let marks = picture
        .marks
        .into_iter()
        .map(|mark| match mark {
            Mark::Call {
                from,
                to,
                label,
                timeout_ms,
            } => Mark::Call {
                from: moved(from),
                to: moved(to),
                label,
                timeout_ms,
            },
            Mark::Answer {
                from,
                to,
                outcome,
                label,
                call,
            } => Mark::Answer {
                from: moved(from),
                to: moved(to),
                outcome,
                label,
                call,
            },
            Mark::Note { at, text } => Mark::Note {
                at: moved(at),
                text,
            },
            Mark::Fault {
                at,
                hop,
                fault,
                label,
            } => Mark::Fault {
                at: at.map(moved),
                hop,
                fault,
                label,
            },
            Mark::Checkpoint { at, label } => Mark::Checkpoint {
                at: moved(at),
                label,
            },
            step @ Mark::Step { .. } => step,
        })
        .collect();
    Picture {
        participants: order
            .iter()
            .map(|&i| picture.participants[i].clone())
            .collect(),
        ids: order.iter().map(|&i| picture.ids[i].clone()).collect(),
        marks,
    }
}

/// Reads the events of one scenario run into a picture, in `lang`: calls, answers, notes and
/// steps, the faults and checkpoints, and the statements and commands into their stores.
pub fn calls(texts: &Texts, lang: Lang, events: &[Event]) -> Picture {
    read_all(
        Reader {
            faults: true,
            ..Reader::with_stores(lang)
        },
        texts,
        events,
    )
}

/// Like [`calls`], without the database and Redis lanes: only what the narrative tells, so the
/// same scenario draws the same picture on every run. (Statements on two connections at once
/// finish in either order, and Redis answers with fresh stream ids and remaining milliseconds;
/// the pages in `docs/` are compared byte for byte.)
pub fn calls_only(texts: &Texts, lang: Lang, events: &[Event]) -> Picture {
    read_all(Reader::with_faults(lang), texts, events)
}

fn read_all(mut reader: Reader, texts: &Texts, events: &[Event]) -> Picture {
    for event in events {
        reader.read(texts, event);
    }
    reader.into_picture()
}

/// The lane a fault mark belongs to: where it was drawn, or the lane its hop got later.
fn fault_lane(picture: &Picture, at: Option<usize>, hop: &str) -> Option<usize> {
    at.or_else(|| picture.ids.iter().position(|id| id == hop))
}

/// A call's label, with how long its caller waits when the story says (`… · waits 150 ms`).
fn call_label(texts: &Texts, lang: Lang, label: &str, timeout_ms: Option<u64>) -> String {
    match timeout_ms {
        Some(ms) => format!(
            "{label} · {}",
            texts.render(
                COMMON,
                lang,
                &Msg::new("web.waits").arg("ms", i64::try_from(ms).unwrap_or(i64::MAX))
            )
        ),
        None => label.to_string(),
    }
}

/// Mermaid text must not break its own syntax: no line breaks, no `;` (a statement separator).
fn mermaid_text(text: &str) -> String {
    text.replace(['\n', ';'], ",").replace('#', "№")
}

/// A Mermaid sequence diagram of the run: the calls that happened, each answer labelled with its
/// outcome (ok, fail, unknown: a crossed arrow, the answer never arrived).
pub fn mermaid(texts: &Texts, lang: Lang, events: &[Event]) -> String {
    mermaid_of(texts, lang, &calls(texts, lang, events))
}

/// The Mermaid diagram of [`calls_only`]: the same on every run of a scenario, as the pages in
/// `docs/scenarios/` need.
pub fn mermaid_calls(texts: &Texts, lang: Lang, events: &[Event]) -> String {
    mermaid_of(texts, lang, &calls_only(texts, lang, events))
}

fn mermaid_of(texts: &Texts, lang: Lang, picture: &Picture) -> String {
    let mut out = String::from("sequenceDiagram\n");
    for (i, name) in picture.participants.iter().enumerate() {
        let _ = writeln!(out, "    participant p{i} as {}", mermaid_text(name));
    }
    for mark in &picture.marks {
        match mark {
            Mark::Call {
                from,
                to,
                label,
                timeout_ms,
            } => {
                let label = call_label(texts, lang, label, *timeout_ms);
                let _ = writeln!(out, "    p{from}->>p{to}: {}", mermaid_text(&label));
            }
            Mark::Answer {
                from,
                to,
                outcome,
                label,
                ..
            } => {
                let arrow = if *outcome == Outcome::Unknown {
                    "--x"
                } else {
                    "-->>"
                };
                let _ = writeln!(out, "    p{from}{arrow}p{to}: {}", mermaid_text(label));
            }
            Mark::Note { at, text } => {
                let _ = writeln!(out, "    Note over p{at}: {}", mermaid_text(text));
            }
            Mark::Fault { at, hop, label, .. } => {
                // A fault is on the hop in front of a participant, not in it: the note spans
                // that lane and the one before it (its caller, which was drawn first).
                let at = fault_lane(picture, *at, hop).unwrap_or(0);
                let over = match at.checked_sub(1) {
                    Some(before) => format!("p{before},p{at}"),
                    None => format!("p{at}"),
                };
                let _ = writeln!(out, "    Note over {over}: ↯ {}", mermaid_text(label));
            }
            Mark::Checkpoint { at, label } => {
                let _ = writeln!(out, "    Note over p{at}: ◆ {}", mermaid_text(label));
            }
            Mark::Step { .. } => {}
        }
    }
    out
}

/// The run as lanes in a terminal: one column per participant, time going down. `●──▶` is a
/// call, `◀──●` an answer, `◀┄┄✗` an answer that never arrived, `●` something a participant did,
/// `↯` a fault put on the hop in front of a participant, `◆` a checkpoint where it is held.
pub fn swimlanes(texts: &Texts, lang: Lang, events: &[Event]) -> String {
    let picture = calls(texts, lang, events);
    let lanes = picture.participants.len();
    if lanes == 0 {
        return String::new();
    }
    const LANE: usize = 4;
    let mut out = String::new();
    for (i, name) in picture.participants.iter().enumerate() {
        let _ = writeln!(out, "  {}┌ {name}", "│   ".repeat(i));
    }
    let row = |cells: Vec<char>, text: &str| -> String {
        let lanes: String = cells.into_iter().collect();
        format!("  {}  {text}\n", lanes.trim_end())
    };
    for mark in &picture.marks {
        let mut cells: Vec<char> = (0..lanes * LANE)
            .map(|i| if i % LANE == 0 { '│' } else { ' ' })
            .collect();
        let line = match mark {
            Mark::Fault { at, hop, label, .. } => {
                if let Some(at) = fault_lane(&picture, *at, hop) {
                    cells[at * LANE] = '↯';
                }
                row(cells, &format!("↯ {label}"))
            }
            Mark::Checkpoint { at, label } => {
                cells[at * LANE] = '◆';
                row(cells, label)
            }
            Mark::Step { text } => {
                out.push_str(&format!("  {}\n", text));
                continue;
            }
            Mark::Note { at, text } => {
                cells[at * LANE] = '●';
                row(cells, text)
            }
            Mark::Call {
                from,
                to,
                label,
                timeout_ms,
            } => {
                draw(&mut cells, *from, *to, '─', '●', LANE);
                row(cells, &call_label(texts, lang, label, *timeout_ms))
            }
            Mark::Answer {
                from,
                to,
                outcome,
                label,
                ..
            } => {
                let (fill, start) = if *outcome == Outcome::Unknown {
                    ('┄', '✗')
                } else {
                    ('─', '●')
                };
                draw(&mut cells, *from, *to, fill, start, LANE);
                row(cells, label)
            }
        };
        out.push_str(&line);
    }
    out
}

/// An arrow from lane `from` to lane `to`: `start` at its origin, `fill` along, a head at the end.
fn draw(cells: &mut [char], from: usize, to: usize, fill: char, start: char, lane: usize) {
    let (a, b) = (from * lane, to * lane);
    let (lo, hi) = (a.min(b), a.max(b));
    for cell in cells.iter_mut().take(hi).skip(lo + 1) {
        *cell = fill;
    }
    cells[a] = start;
    cells[b] = if b > a { '▶' } else { '◀' };
}
