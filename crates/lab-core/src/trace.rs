//! What ran: the SQL statements and Redis commands of a run, caught where they execute.
//!
//! A scenario's work happens in many tasks: the script itself, the bundled services' request
//! handlers, work they spawn. Each of them runs inside a [`tracing`] span: the whole run inside
//! `lab.run` (see [`run_span`]), each service inside `lab.service`, and the functions worth
//! pointing at (a handler, `claim_task`) inside spans of their own (`#[tracing::instrument]`).
//!
//! sqlx reports every statement it finishes as a `tracing` event (target `sqlx::query`, with the
//! statement and the rows it affected and returned), and the lab's Redis connections report each
//! command and its reply the same way (target `lab::redis`, see [`REDIS_TARGET`]).
//! [`RanLayer`] sees those events with the spans they happened in, finds the run they belong to
//! and tells that run's narrator an [`Event::Executed`]: which server, who (a service, or the
//! scenario's own actors), in which function, the text and the result. Runs in one process stay
//! apart because each has its own `lab.run` span.
//!
//! The lab's own work is not the story: creating the run's schema, reading the rows a step
//! shows, measuring the facts, cleaning up. Code that does it runs in a `lab.backstage` span
//! ([`backstage`], or `#[tracing::instrument(name = "lab.backstage", skip_all)]`), and what
//! runs there is not told.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event as TracingEvent, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::event::{CodePlace, Event, Executed, Server};
use crate::narrator::{Narrator, WeakNarrator};

/// The span a whole run executes in; its field `run` finds the narrator.
pub const RUN_SPAN: &str = "lab.run";
/// The span a bundled service's tasks execute in; its field `name` is the service's name.
pub const SERVICE_SPAN: &str = "lab.service";
pub use crate::backstage::{BACKSTAGE_SPAN, backstage};
/// The target of the events the lab's Redis connections emit for each command.
pub const REDIS_TARGET: &str = "lab::redis";
/// The target of sqlx's statement events.
pub const SQL_TARGET: &str = "sqlx::query";

/// The narrators of the runs in flight, by the id in their `lab.run` span. Weak: a finished run
/// is not kept alive by a span a stray task still holds.
static RUNS: LazyLock<Mutex<HashMap<u64, WeakNarrator>>> = LazyLock::new(Default::default);
static NEXT_RUN: AtomicU64 = AtomicU64::new(1);

/// The span to run a scenario in: what executes inside it (and inside the tasks that carry it
/// on with [`tracing::Instrument::in_current_span`]) is told to `narrator`.
pub fn run_span(narrator: &Narrator) -> tracing::Span {
    let id = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
    let mut runs = RUNS.lock();
    // Forget runs that have ended, so the table stays as small as the number of runs in flight.
    runs.retain(|_, narrator| narrator.is_alive());
    runs.insert(id, narrator.downgrade());
    tracing::info_span!(RUN_SPAN, run = id)
}

/// The span a bundled service's accept loop (and so its handlers) runs in.
pub fn service_span(name: &str) -> tracing::Span {
    tracing::info_span!(SERVICE_SPAN, name = name)
}

/// Tells that a transaction began. sqlx sends `BEGIN` without reporting it (it reports the
/// `COMMIT`), so code that opens a transaction calls this to show the transaction whole.
pub fn began() {
    tracing::debug!(target: SQL_TARGET, summary = "BEGIN", rows_affected = 0u64, rows_returned = 0u64);
}

/// What a span of ours stands for, kept in its extensions when it is created.
enum Role {
    Run(u64),
    Service(String),
    Backstage,
}

/// The layer that turns statement and command events into [`Event::Executed`] for their run.
/// Give it a filter that lets through [`SQL_TARGET`] and [`REDIS_TARGET`] events at DEBUG and
/// every span (see [`RanLayer::wants`]).
#[derive(Debug, Default)]
pub struct RanLayer;

impl RanLayer {
    /// What this layer needs to see: every span (to know the run, the service, the function)
    /// and the two kinds of events. Use as a per-layer filter, so a `--log` layer's own filter
    /// is not widened by it.
    pub fn wants(metadata: &tracing::Metadata<'_>) -> bool {
        metadata.is_span() || matches!(metadata.target(), SQL_TARGET | REDIS_TARGET)
    }
}

impl<S> Layer<S> for RanLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let role = match attrs.metadata().name() {
            RUN_SPAN => {
                let mut fields = Fields::default();
                attrs.record(&mut fields);
                fields.run.map(Role::Run)
            }
            SERVICE_SPAN => {
                let mut fields = Fields::default();
                attrs.record(&mut fields);
                fields.name.map(Role::Service)
            }
            BACKSTAGE_SPAN => Some(Role::Backstage),
            _ => None,
        };
        if let (Some(role), Some(span)) = (role, ctx.span(id)) {
            span.extensions_mut().insert(role);
        }
    }

    fn on_event(&self, event: &TracingEvent<'_>, ctx: Context<'_, S>) {
        let server = match event.metadata().target() {
            SQL_TARGET => Server::Postgres,
            REDIS_TARGET => Server::Redis,
            _ => return,
        };
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let (mut run, mut by, mut code) = (None, None, None);
        for span in scope {
            let metadata = span.metadata();
            match span.extensions().get::<Role>() {
                Some(Role::Backstage) => return,
                Some(Role::Run(id)) => {
                    run = Some(*id);
                    break;
                }
                Some(Role::Service(name)) => {
                    by.get_or_insert_with(|| name.clone());
                }
                // The innermost span of our own code is the function the statement is in
                // (spans of libraries, if any had them, would point into their code).
                None => {
                    if code.is_none() && is_ours(metadata.target()) {
                        code = Some(CodePlace {
                            function: metadata.name().to_string(),
                            file: metadata.file().unwrap_or("?").to_string(),
                            line: metadata.line().unwrap_or(0),
                        });
                    }
                }
            }
        }
        let Some(narrator) = run.and_then(|id| RUNS.lock().get(&id).and_then(|n| n.upgrade()))
        else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let (text, result) = match server {
            Server::Postgres => {
                let text = fields.statement.unwrap_or_default();
                let result = command_tag(&text, fields.rows_affected, fields.rows_returned);
                (text, result)
            }
            Server::Redis => (
                fields.command.unwrap_or_default(),
                fields.reply.unwrap_or_default(),
            ),
        };
        narrator.emit(Event::Executed(Executed {
            server,
            by,
            code,
            text,
            result,
        }));
    }
}

/// Whether a span's target (its module path) is in one of the lab's crates.
fn is_ours(target: &str) -> bool {
    target.starts_with("lab_") || target.starts_with("idem")
}

/// The fields of our spans and of the statement and command events.
#[derive(Default)]
struct Fields {
    run: Option<u64>,
    name: Option<String>,
    /// sqlx gives the first words as `summary` and the whole text as `db.statement` only when
    /// they differ; the whole text wins.
    statement: Option<String>,
    rows_affected: u64,
    rows_returned: u64,
    command: Option<String>,
    reply: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "run" => self.run = Some(value),
            "rows_affected" => self.rows_affected = value,
            "rows_returned" => self.rows_returned = value,
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "name" => self.name = Some(value.to_string()),
            "summary" if self.statement.is_none() => self.statement = Some(one_line(value)),
            "db.statement" if !value.trim().is_empty() => self.statement = Some(one_line(value)),
            "command" => self.command = Some(value.to_string()),
            "reply" => self.reply = Some(value.to_string()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        // `%value` fields arrive here; only ours are read.
        match field.name() {
            "name" | "command" | "reply" => self.record_str(field, &format!("{value:?}")),
            _ => {}
        }
    }
}

/// A statement on one line, as a learner would type it into psql.
fn one_line(sql: &str) -> String {
    let mut line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    // sqlx marks a summary it shortened with " …"; the whole statement replaces it anyway.
    if let Some(stripped) = line.strip_suffix(" …") {
        line = stripped.to_string();
    }
    line
}

/// What psql prints after a statement (its command tag): `INSERT 0 1`, `UPDATE 1`, `SELECT 2`,
/// `BEGIN`. A `WITH` statement's tag is that of its final statement, which the first word does
/// not tell, so it gets the rows it returned.
pub fn command_tag(statement: &str, affected: u64, returned: u64) -> String {
    let verb = statement
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    match verb.as_str() {
        "INSERT" => format!("INSERT 0 {affected}"),
        "UPDATE" | "DELETE" | "MERGE" => format!("{verb} {affected}"),
        "SELECT" | "WITH" | "VALUES" | "TABLE" => format!("SELECT {returned}"),
        _ => verb,
    }
}

/// A Redis connection that reports every command it sends, with the reply, as an event for
/// [`RanLayer`] (target [`REDIS_TARGET`]). Wrap any connection: `Traced::new(manager)`. Costs
/// nothing when nobody listens: the line is built only if the event is enabled.
#[derive(Clone)]
pub struct Traced<C> {
    inner: C,
}

impl<C> Traced<C> {
    pub fn new(inner: C) -> Traced<C> {
        Traced { inner }
    }

    pub fn into_inner(self) -> C {
        self.inner
    }
}

impl<C: redis::aio::ConnectionLike + Send> redis::aio::ConnectionLike for Traced<C> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            tracing::debug!(target: REDIS_TARGET, command = %command_line(cmd), reply = %reply_line(&reply));
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let replies = self
                .inner
                .req_packed_commands(pipeline, offset, count)
                .await;
            if tracing::enabled!(target: REDIS_TARGET, tracing::Level::DEBUG) {
                let commands: Vec<String> = pipeline.cmd_iter().map(command_line).collect();
                let reply = match &replies {
                    Ok(values) => values.iter().map(value_line).collect::<Vec<_>>().join(", "),
                    Err(error) => format!("(error) {error}"),
                };
                tracing::debug!(target: REDIS_TARGET, command = %commands.join(" | "), reply = %reply);
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// The longest argument or reply shown whole; longer ones (a stored JSON record) are cut.
const SHOWN: usize = 80;

/// A command as redis-cli would take it: `SET "lab:1a2b:k" "{…}" NX PX 30000`.
pub fn command_line(cmd: &redis::Cmd) -> String {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => quoted_if_needed(bytes),
            // A cursor argument (SCAN's) is filled in by the client.
            _ => "0".to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn reply_line(reply: &redis::RedisResult<redis::Value>) -> String {
    match reply {
        Ok(value) => value_line(value),
        Err(error) => format!("(error) {error}"),
    }
}

/// A reply as redis-cli shows it, on one line: `OK`, `(nil)`, `(integer) 1`, `"text"`,
/// `1) "a" 2) "b"`.
fn value_line(value: &redis::Value) -> String {
    use redis::Value;
    match value {
        Value::Nil => "(nil)".into(),
        Value::Okay => "OK".into(),
        Value::Int(i) => format!("(integer) {i}"),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(bytes) => quoted(bytes),
        Value::Array(items) | Value::Set(items) => {
            if items.is_empty() {
                return "(empty array)".into();
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| format!("{}) {}", i + 1, value_line(item)))
                .collect::<Vec<_>>()
                .join(" ")
        }
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| format!("{} => {}", value_line(k), value_line(v)))
            .collect::<Vec<_>>()
            .join(" "),
        Value::Double(d) => format!("(double) {d}"),
        Value::Boolean(b) => format!("({b})"),
        Value::ServerError(error) => format!("(error) {error:?}"),
        other => format!("{other:?}"),
    }
}

fn quoted_if_needed(bytes: &[u8]) -> String {
    let plain = !bytes.is_empty()
        && bytes.len() <= SHOWN
        && bytes
            .iter()
            .all(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\\' && *b != b'\'');
    if plain {
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        quoted(bytes)
    }
}

/// A string in double quotes with redis-cli's escapes, cut at [`SHOWN`] characters.
fn quoted(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::from("\"");
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::{Registry, filter::filter_fn};

    #[test]
    fn commands_and_replies_read_as_in_redis_cli() {
        let mut cmd = redis::cmd("SET");
        cmd.arg("lab:1:k")
            .arg("{\"a\": 1}")
            .arg("NX")
            .arg("PX")
            .arg(30000);
        assert_eq!(
            command_line(&cmd),
            r#"SET lab:1:k "{\"a\": 1}" NX PX 30000"#
        );
        assert_eq!(value_line(&redis::Value::Okay), "OK");
        assert_eq!(value_line(&redis::Value::Nil), "(nil)");
        let array = redis::Value::Array(vec![
            redis::Value::BulkString(b"a".to_vec()),
            redis::Value::Int(2),
        ]);
        assert_eq!(value_line(&array), r#"1) "a" 2) (integer) 2"#);
        assert_eq!(quoted(&[b'x'; 100]).chars().count(), SHOWN + 3);
    }

    #[test]
    fn command_tags_are_psqls() {
        assert_eq!(command_tag("insert into t values (1)", 1, 0), "INSERT 0 1");
        assert_eq!(command_tag("UPDATE t SET a = 1", 2, 0), "UPDATE 2");
        assert_eq!(command_tag("SELECT 1", 0, 1), "SELECT 1");
        assert_eq!(command_tag("BEGIN", 0, 0), "BEGIN");
    }

    fn subscriber() -> impl Subscriber + Send + Sync {
        Registry::default().with(RanLayer.with_filter(filter_fn(RanLayer::wants)))
    }

    #[test]
    fn events_reach_their_own_run_with_service_and_function_and_backstage_is_left_out() {
        let (first, second) = (Narrator::recording(), Narrator::recording());
        tracing::subscriber::with_default(subscriber(), || {
            let _run = run_span(&first).entered();
            let _service = service_span("reports").entered();
            let _handler = tracing::info_span!("create_report").entered();
            tracing::debug!(target: SQL_TARGET, summary = "insert into reports …",
                "db.statement" = "\n\ninsert into reports\n  (key) values ($1)\n", rows_affected = 1u64, rows_returned = 1u64);
            {
                let _backstage = tracing::info_span!(BACKSTAGE_SPAN).entered();
                tracing::debug!(target: SQL_TARGET, summary = "SELECT count(*) FROM reports", rows_affected = 0u64, rows_returned = 1u64);
            }
            let _other = run_span(&second).entered();
            tracing::debug!(target: REDIS_TARGET, command = "GET k", reply = "(nil)");
        });
        let executed = |narrator: &Narrator| {
            narrator
                .events()
                .into_iter()
                .filter_map(|event| match event {
                    Event::Executed(executed) => Some(executed),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let first = executed(&first);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].text, "insert into reports (key) values ($1)");
        assert_eq!(first[0].result, "INSERT 0 1");
        assert_eq!(first[0].by.as_deref(), Some("reports"));
        assert_eq!(first[0].code.as_ref().unwrap().function, "create_report");
        let second = executed(&second);
        assert_eq!(second.len(), 1, "{second:?}");
        assert_eq!(
            (second[0].server, second[0].by.clone()),
            (Server::Redis, None)
        );
        assert_eq!(second[0].result, "(nil)");
    }
}
