//! The lab's side of an exercise: its own services around the learner's program, the calls it
//! holds inside them while it stages something, and its reads of Redis.
//!
//! The lab's services are the bundled ones (`lab_services`), started from their specs as a
//! scenario starts them; the checks hold a call at one of their checkpoints to make a moment
//! happen (a charge made and not yet answered, a report committed and not yet answered).

use std::time::Duration;

use lab_core::{Checkpoints, Msg};
use lab_services::admin::Admin;
use lab_services::provider::{self, ProviderConfig};
use lab_services::spec::{RunningService, ServiceEnv, ServiceSpec};
use tokio::task::JoinHandle;

use crate::call::{Call, send};
use crate::error::ExerciseError;
use crate::verdict::{ChargeRow, Line, Sent};

/// How long the lab waits for a moment it stages (a call held at a checkpoint, a fault fired, a
/// commit): far longer than a working program needs, so reaching it is the only way on, and
/// missing it is an unknown, never a pass.
pub const STAGING_LIMIT: Duration = Duration::from_secs(30);

/// Starts one of the lab's services on a loopback port of its own.
pub fn launch(
    spec: &'static ServiceSpec,
    env: ServiceEnv,
) -> Result<RunningService, ExerciseError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(ExerciseError::io("127.0.0.1"))?;
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(ExerciseError::io("127.0.0.1"))?;
    lab_services::spec::launch(spec, env, listener).map_err(|e| ExerciseError::Service {
        service: spec.title,
        reason: e.to_string(),
    })
}

/// The lab's payment provider, as the checks read it: the oracle of the payments exercises.
pub struct LabProvider {
    url: String,
    http: reqwest::Client,
}

impl LabProvider {
    /// The provider at `url` (started with the rig's checkpoints).
    pub fn at(url: String) -> LabProvider {
        LabProvider {
            url,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Switches its deduplication by key; the step that says so.
    pub async fn dedup(&self, on: bool) -> Result<Line, ExerciseError> {
        self.admin()
            .configure(&ProviderConfig { dedup_by_key: on })
            .await
            .map_err(ExerciseError::http("provider's switch"))?;
        Ok(Line::Step(Msg::new(if on {
            "step.provider_dedup"
        } else {
            "step.provider_no_dedup"
        })))
    }

    /// The charges it made for `order`, as a schedule line too.
    pub async fn charges(&self, order: &str) -> Result<(Vec<ChargeRow>, Line), ExerciseError> {
        let charges: Vec<ChargeRow> = self
            .admin()
            .charges(None)
            .await
            .map_err(ExerciseError::http("provider's charges"))?
            .into_iter()
            .filter(|c| c.order_id == order)
            .map(|c| ChargeRow {
                charge_id: c.charge_id,
                amount: c.amount,
                currency: c.currency,
                key: c.key,
            })
            .collect();
        let line = Line::Charges {
            order: order.to_string(),
            charges: charges.clone(),
        };
        Ok((charges, line))
    }

    /// Every `POST /charges` it answered, oldest first: the key each caller sent, and the charge
    /// it got back.
    pub async fn requests(&self) -> Result<Vec<provider::ChargeCall>, ExerciseError> {
        self.admin()
            .charge_calls()
            .await
            .map_err(ExerciseError::http("provider's requests"))
    }

    fn admin(&self) -> Admin<'_> {
        Admin::new(&self.http, &self.url)
    }
}

/// A call held at a checkpoint of one of the lab's services, or what happened instead.
pub enum Reached {
    Held {
        hold: lab_core::checkpoint::Hold,
        call: JoinHandle<Sent>,
    },
    /// It answered without getting there.
    Answered(Sent),
    /// It neither got there nor answered within [`STAGING_LIMIT`].
    Never,
}

/// Sends `call`, holding the first caller that reaches `point`; returns once the call is held
/// there, or has answered without getting there.
pub async fn send_held(
    http: &reqwest::Client,
    checkpoints: &Checkpoints,
    point: &str,
    call: Call,
) -> Reached {
    let hold = checkpoints.hold(point);
    let client = http.clone();
    let mut first = tokio::spawn(async move { send(&client, call).await });
    tokio::select! {
        entered = hold.entered(STAGING_LIMIT) => match entered {
            Ok(()) => Reached::Held { hold, call: first },
            Err(_) => {
                first.abort();
                Reached::Never
            }
        },
        answered = &mut first => match answered {
            Ok(sent) => Reached::Answered(sent),
            Err(_) => Reached::Never,
        },
    }
}

/// Every key on the server `conn` talks to that matches `pattern` (`SCAN MATCH`, never
/// `KEYS`: a shared Redis is not blocked while the lab looks).
pub async fn scan(
    conn: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, ExerciseError> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        found.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// One Redis key as the lab read it: how long it still lives, and its value as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRead {
    /// `PTTL`: milliseconds left, `-1` for a key without expiry, `-2` for one that is gone.
    pub pttl: i64,
    /// The value, whatever its type, as text: a string's bytes, a hash's fields and values, a
    /// list's, a set's or a sorted set's members, one per line (lossy UTF-8; empty for a stream
    /// or a key that is gone).
    pub value: String,
}

/// Reads `key`: its `PTTL` and its value as text (see [`KeyRead`]).
pub async fn read_key(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Result<KeyRead, ExerciseError> {
    let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await?;
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await?;
    let parts: Vec<Vec<u8>> = match kind.as_str() {
        "string" => {
            let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(conn).await?;
            value.into_iter().collect()
        }
        "hash" => redis::cmd("HGETALL").arg(key).query_async(conn).await?,
        "list" => {
            redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await?
        }
        "set" => redis::cmd("SMEMBERS").arg(key).query_async(conn).await?,
        "zset" => {
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await?
        }
        _ => Vec::new(),
    };
    let value = parts
        .iter()
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(KeyRead { pttl, value })
}

/// `key` as a literal inside a SCAN pattern.
pub fn glob_escape(key: &str) -> String {
    let mut escaped = String::with_capacity(key.len());
    for c in key.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The `host:port` of a Redis URL: a fault proxy's upstream.
pub fn redis_address(url: &str, what: &'static str) -> Result<String, ExerciseError> {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port().unwrap_or(6379))))
        .ok_or_else(|| ExerciseError::RedisNotTcp {
            what,
            url: url.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_literal_in_a_scan_pattern() {
        assert_eq!(glob_escape("pay-1"), "pay-1");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn a_redis_url_gives_its_address_or_says_why_not() {
        assert_eq!(
            redis_address("redis://127.0.0.1:6400/0", "x").unwrap(),
            "127.0.0.1:6400"
        );
        assert_eq!(
            redis_address("redis://localhost", "x").unwrap(),
            "localhost:6379"
        );
        assert!(matches!(
            redis_address("unix:///tmp/redis.sock", "charge-once"),
            Err(ExerciseError::RedisNotTcp { .. })
        ));
    }
}
