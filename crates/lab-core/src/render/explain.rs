//! `lab explain`: from a run's narrative to the code. Every SQL statement and Redis command the
//! run executed, grouped by the function it is written in (file and line), with who ran it and
//! how often. Built from a real run's [`Event::Executed`] events, so it cannot drift from what
//! the code does.

use std::sync::Arc;

use crate::text::COMMON;
use crate::{CodePlace, Event, Executed, Lang, Msg, Server, Texts};

/// One function that ran statements or commands, with what it ran.
struct Place {
    server: Server,
    by: Option<String>,
    code: Option<CodePlace>,
    /// Distinct statements (or command shapes), in order of first appearance.
    lines: Vec<Line>,
}

struct Line {
    /// What identifies it: the statement, or the command word and its key.
    shape: String,
    /// The first instance, as it ran.
    example: String,
    /// Every distinct result it had (`INSERT 0 1`, `INSERT 0 0`).
    results: Vec<String>,
    times: usize,
}

/// What groups two commands together: for SQL the statement itself (its parameters are `$1`
/// already); for Redis the command word, since keys and values carry run ids and payloads.
fn shape(executed: &Executed) -> String {
    match executed.server {
        Server::Postgres => executed.text.clone(),
        Server::Redis => executed
            .text
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase(),
    }
}

/// The run prefix of keys (`lab:1a2b3c4d:`) differs between runs; shown as `lab:<run>:`.
fn without_run_id(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("lab:") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 4..];
        let id_len = after.chars().take_while(|c| c.is_ascii_hexdigit()).count();
        if id_len == 8 && after[id_len..].starts_with(':') {
            out.push_str("lab:<run>:");
            rest = &after[id_len + 1..];
        } else {
            out.push_str("lab:");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Renders the explanation of one recorded run in `lang`. `source` is the scenario's own
/// module.
pub fn render_explain(texts: &Arc<Texts>, lang: Lang, source: &str, events: &[Event]) -> String {
    let (scope, places) = read_places(events);
    let t = |key: &str| texts.render(&scope, lang, &Msg::new(key));
    let mut out = format!(
        "━━ {} · {} ━━\n{}\n",
        scope,
        t("title"),
        texts.render(
            &scope,
            lang,
            &Msg::new("explain_cmd.module").arg("path", source)
        )
    );
    for (server, heading, prompt, end) in [
        (Server::Postgres, "explain_cmd.postgres", "sql>", ";"),
        (Server::Redis, "explain_cmd.redis", "redis>", ""),
    ] {
        let of_server: Vec<&Place> = places.iter().filter(|p| p.server == server).collect();
        if of_server.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{}\n", t(heading)));
        for place in of_server {
            out.push_str(&render_place(place, prompt, end, &t));
        }
    }
    if places.is_empty() {
        out.push_str(&format!("\n{}\n", t("explain_cmd.nothing")));
    }
    out
}

/// Reads a recorded run: the scenario it ran (its catalogue names things) and the places its
/// statements and commands were run from, in order of first appearance.
fn read_places(events: &[Event]) -> (String, Vec<Place>) {
    let mut scope = COMMON.to_string();
    let mut places: Vec<Place> = Vec::new();
    for event in events {
        match event {
            Event::Start { scenario } => scope = scenario.clone(),
            Event::Executed(executed) => record(&mut places, executed),
            _ => {}
        }
    }
    (scope, places)
}

/// Counts one statement or command in the place it ran from: a new line for a shape not seen
/// there yet, else one more time (and its result, if new) on the line it has.
fn record(places: &mut Vec<Place>, executed: &Executed) {
    let index = places
        .iter()
        .position(|p| p.server == executed.server && p.by == executed.by && p.code == executed.code)
        .unwrap_or_else(|| {
            places.push(Place {
                server: executed.server,
                by: executed.by.clone(),
                code: executed.code.clone(),
                lines: Vec::new(),
            });
            places.len() - 1
        });
    let place = &mut places[index];
    let shape = shape(executed);
    let result = without_run_id(&executed.result);
    match place.lines.iter_mut().find(|l| l.shape == shape) {
        Some(line) => {
            line.times += 1;
            if !line.results.contains(&result) {
                line.results.push(result);
            }
        }
        None => place.lines.push(Line {
            shape,
            example: without_run_id(&executed.text),
            results: vec![result],
            times: 1,
        }),
    }
}

/// One place: who ran it and the function (file and line), then each of its statements as the
/// client's `prompt` shows it, with its results and how often it ran:
/// `sql> UPDATE tasks SET … WHERE id = $1;  -- UPDATE 1  (×2)`.
fn render_place(place: &Place, prompt: &str, end: &str, t: &dyn Fn(&str) -> String) -> String {
    let who = match &place.by {
        Some(service) => t(&format!("service.{service}")),
        None => t("explain_cmd.scenario"),
    };
    let code = match &place.code {
        Some(code) => format!("{}  {}:{}", code.function, code.file, code.line),
        None => t("explain_cmd.no_function"),
    };
    let mut out = format!("  {who} · {code}\n");
    for line in &place.lines {
        let times = if line.times > 1 {
            format!("  (×{})", line.times)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "    {prompt} {}{end}  -- {}{times}\n",
            line.example,
            line.results.join(" | ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_in_keys_are_generalised() {
        assert_eq!(
            without_run_id("GET lab:0a8e2fcc:idempotency:k lab:short"),
            "GET lab:<run>:idempotency:k lab:short"
        );
    }
}
