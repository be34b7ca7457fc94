//! Pictures of a recorded run: who called whom, in the order it happened.
//!
//! Both pictures come from the same reading of the events ([`calls`]): a caller's request and
//! its answer (ok, fail, unknown), a relay's call to the next service and what it got back, and
//! what each participant did in between. [`mermaid`] writes a Mermaid sequence diagram (for
//! slides, docs and `--artifacts`); [`swimlanes`] draws the same as lanes in a terminal
//! (`--diagram`), one per participant.
//!
//! The SQL statements and Redis commands a run executed ([`Event::Executed`]) are arrows too,
//! into a lane of their own: our database (the scenario's own tables), each service's database,
//! Redis. So `timeout` reads request → INSERT → COMMIT → the client gives up.
//!
//! The relays of the chain report their calls as service messages (`relay.calling`,
//! `relay.answered`, `relay.retrying_*`); their arguments name the service called, which is how
//! those become arrows too.

use std::fmt::Write as _;

use crate::text::{Arg, COMMON};
use crate::{Event, Executed, Lang, Msg, Outcome, Server, Texts};

/// One thing in the picture.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    /// `from` calls `to`.
    Call {
        from: usize,
        to: usize,
        label: String,
    },
    /// `from`'s answer reaches `to`, or (unknown) never does.
    Answer {
        from: usize,
        to: usize,
        outcome: Outcome,
        label: String,
    },
    /// Something a participant did or said.
    Note { at: usize, text: String },
    /// A step of the story.
    Step { text: String },
}

/// The participants (their names, in order of appearance) and the marks between them.
#[derive(Debug, Default)]
pub struct Picture {
    pub participants: Vec<String>,
    pub marks: Vec<Mark>,
}

impl Picture {
    fn participant(&mut self, name: String) -> usize {
        match self.participants.iter().position(|p| *p == name) {
            Some(i) => i,
            None => {
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
    let upper = |i: usize| words.get(i).map(|w| w.to_ascii_uppercase());
    let what = match executed.server {
        Server::Postgres => match upper(0).as_deref() {
            Some("INSERT") | Some("DELETE") => {
                words.iter().take(3).copied().collect::<Vec<_>>().join(" ")
            }
            Some("UPDATE") => words.iter().take(2).copied().collect::<Vec<_>>().join(" "),
            Some("SELECT") | Some("WITH") => {
                match words.iter().position(|w| w.eq_ignore_ascii_case("FROM")) {
                    Some(from) => format!("SELECT … FROM {}", words.get(from + 1).unwrap_or(&"")),
                    None => cut(&executed.text),
                }
            }
            _ => cut(&executed.text),
        },
        // The run's key prefix (`lab:1a2b3c4d:`) says nothing about the story.
        Server::Redis => cut(&executed
            .text
            .split_whitespace()
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

/// Reads the events of one scenario run into a picture, in `lang`.
pub fn calls(texts: &Texts, lang: Lang, events: &[Event]) -> Picture {
    let mut picture = Picture::default();
    let mut scope = COMMON.to_string();
    // The databases and Redis: drawn to the right of everyone who talks to them.
    let mut stores: Vec<usize> = Vec::new();
    // Open requests: (caller, callee), the most recent last.
    let mut open: Vec<(usize, usize)> = Vec::new();
    let label = |texts: &Texts, scope: &str, key: &str| texts.render(scope, lang, &Msg::new(key));
    for event in events {
        match event {
            Event::Start { scenario } => scope = scenario.clone(),
            Event::Step { number, text } => picture.marks.push(Mark::Step {
                text: format!(
                    "{number}. {}",
                    texts
                        .render(&scope, lang, text)
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            }),
            Event::Request { text, from, to } => {
                let (Some(from), Some(to)) = (from, to) else {
                    continue;
                };
                let from = picture.participant(label(texts, &scope, from));
                let to = picture.participant(label(texts, &scope, &format!("service.{to}")));
                let told = texts.render(&scope, lang, text);
                // "who → service: POST …": the arrow already says who and where.
                let short = told
                    .split_once(": ")
                    .map_or(told.clone(), |(_, rest)| rest.to_string());
                picture.marks.push(Mark::Call {
                    from,
                    to,
                    label: short,
                });
                open.push((from, to));
            }
            Event::Response {
                outcome,
                status,
                detail,
                ..
            } => {
                let Some((caller, callee)) = open.pop() else {
                    continue;
                };
                let mut label = label(texts, &scope, &format!("outcome.{}", outcome.word()));
                if let Some(status) = status {
                    let _ = write!(label, " {status}");
                }
                if let Some(detail) = detail {
                    let _ = write!(label, ": {}", texts.render(&scope, lang, detail));
                }
                picture.marks.push(Mark::Answer {
                    from: callee,
                    to: caller,
                    outcome: *outcome,
                    label,
                });
            }
            Event::Executed(executed) => {
                let from = match &executed.by {
                    Some(service) => label(texts, &scope, &format!("service.{service}")),
                    None => label(texts, &scope, "lane.ours"),
                };
                let store = match (&executed.server, &executed.by) {
                    (Server::Redis, _) => "Redis".to_string(),
                    (Server::Postgres, None) => label(texts, &scope, "lane.our_db"),
                    (Server::Postgres, Some(service)) => texts.render(
                        &scope,
                        lang,
                        &Msg::new("lane.service_db")
                            .arg("service", Msg::new(format!("service.{service}"))),
                    ),
                };
                let from = picture.participant(from);
                let to = picture.participant(store);
                if !stores.contains(&to) {
                    stores.push(to);
                }
                picture.marks.push(Mark::Call {
                    from,
                    to,
                    label: executed_label(executed),
                });
            }
            Event::Service { service, text } => {
                let at = picture.participant(label(texts, &scope, &format!("service.{service}")));
                let told = texts.render(&scope, lang, text);
                let next = next_service(text)
                    .map(|n| picture.participant(label(texts, &scope, &format!("service.{n}"))));
                match (text.key.as_str(), next) {
                    ("relay.calling", Some(next)) => picture.marks.push(Mark::Call {
                        from: at,
                        to: next,
                        label: told,
                    }),
                    ("relay.answered", Some(next)) => picture.marks.push(Mark::Answer {
                        from: next,
                        to: at,
                        outcome: Outcome::Ok,
                        label: told,
                    }),
                    (key, Some(next)) if key.starts_with("relay.retrying") => {
                        picture.marks.push(Mark::Answer {
                            from: next,
                            to: at,
                            outcome: Outcome::Unknown,
                            label: told,
                        })
                    }
                    _ => picture.marks.push(Mark::Note { at, text: told }),
                }
            }
            _ => {}
        }
    }
    stores_last(picture, &stores)
}

/// Moves the store lanes to the right, keeping every other lane's order.
fn stores_last(picture: Picture, stores: &[usize]) -> Picture {
    let order: Vec<usize> = (0..picture.participants.len())
        .filter(|i| !stores.contains(i))
        .chain((0..picture.participants.len()).filter(|i| stores.contains(i)))
        .collect();
    let new_index = |old: usize| order.iter().position(|&i| i == old).unwrap_or(old);
    let marks = picture
        .marks
        .into_iter()
        .map(|mark| match mark {
            Mark::Call { from, to, label } => Mark::Call {
                from: new_index(from),
                to: new_index(to),
                label,
            },
            Mark::Answer {
                from,
                to,
                outcome,
                label,
            } => Mark::Answer {
                from: new_index(from),
                to: new_index(to),
                outcome,
                label,
            },
            Mark::Note { at, text } => Mark::Note {
                at: new_index(at),
                text,
            },
            step @ Mark::Step { .. } => step,
        })
        .collect();
    Picture {
        participants: order
            .iter()
            .map(|&i| picture.participants[i].clone())
            .collect(),
        marks,
    }
}

/// Mermaid text must not break its own syntax: no line breaks, no `;` (a statement separator).
fn mermaid_text(text: &str) -> String {
    text.replace(['\n', ';'], ",").replace('#', "№")
}

/// A Mermaid sequence diagram of the run: the calls that happened, each answer labelled with its
/// outcome (ok, fail, unknown: a crossed arrow, the answer never arrived).
pub fn mermaid(texts: &Texts, lang: Lang, events: &[Event]) -> String {
    let picture = calls(texts, lang, events);
    let mut out = String::from("sequenceDiagram\n");
    for (i, name) in picture.participants.iter().enumerate() {
        let _ = writeln!(out, "    participant p{i} as {}", mermaid_text(name));
    }
    for mark in &picture.marks {
        match mark {
            Mark::Call { from, to, label } => {
                let _ = writeln!(out, "    p{from}->>p{to}: {}", mermaid_text(label));
            }
            Mark::Answer {
                from,
                to,
                outcome,
                label,
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
            Mark::Step { .. } => {}
        }
    }
    out
}

/// The run as lanes in a terminal: one column per participant, time going down. `●──▶` is a
/// call, `◀──●` an answer, `◀┄┄✗` an answer that never arrived, `●` something a participant did.
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
            Mark::Step { text } => {
                out.push_str(&format!("  {}\n", text));
                continue;
            }
            Mark::Note { at, text } => {
                cells[at * LANE] = '●';
                row(cells, text)
            }
            Mark::Call { from, to, label } => {
                draw(&mut cells, *from, *to, '─', '●', LANE);
                row(cells, label)
            }
            Mark::Answer {
                from,
                to,
                outcome,
                label,
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
