//! `lab bench coordinator`: the `idem` coordinator on Redis, next to a bare Redis client that
//! sends exactly the round trips idem sends on that path (`lab_bench::coordinator`, where the
//! rows and the round trips are explained), on the session's Redis, printed as a table or as
//! JSON lines.
//!
//! Everything the bench writes lives under its prefix (`lab:bench:<8 hex>:`), and is deleted at
//! the end, however the bench ended (an error, Ctrl-C), by `SCAN MATCH` of that prefix on every
//! node; nothing else is read, written or flushed. With `--redis-url` of a cluster node the
//! cleanup scans every master.
//!
//! `--python PATH` runs `crates/idem/tests/python/bench.py` (idempotency-kit 0.4.1 and raw
//! redis-py) on the same Redis, under a prefix of its own below the bench's, and adds its rows.

use std::path::Path as FsPath;

use anyhow::anyhow;
use lab_bench::coordinator::{self, Plan, Row};
use lab_bench::warm_up;
use lab_core::Msg;
use lab_infra::servers::RedisServer;
use lab_infra::{Needs, Origin, Servers};

use super::{Bar, print_table, progress, ratio_cell};
use crate::exit::{self, Failure};
use crate::session::{Format, Session};
use crate::words::t;

pub async fn run(
    session: Session,
    ops: u64,
    concurrency: &[u32],
    python: Option<&FsPath>,
) -> Result<u8, Failure> {
    if let Some(python) = python
        && !tokio::fs::try_exists(python).await.unwrap_or(false)
    {
        return Err(Failure::usage(t(
            Msg::new("bench.no_python").arg("path", python.display().to_string())
        )));
    }
    let plan = Plan::new(ops, concurrency);
    // The Python rows, if any, run after the bar is full.
    let bar = progress(session.color(), plan.calls());
    // The bench names each side as it starts it; the first is named here already, for the bar
    // drawn while the servers start.
    bar.set_message("idem");
    let hook = Bar(bar.clone());
    let needs = Needs {
        postgres: false,
        redis: true,
    };
    let masters = parking_lot::Mutex::new(Vec::new());
    let (rows, about) = session
        .with_servers(
            needs,
            async |servers| {
                let redis = redis_of(servers)?;
                let link = coordinator::connect(redis).await?;
                // Known before anything is written, for the cleanup below.
                *masters.lock() = link.masters().to_vec();
                let mut rows = coordinator::idem_rows(&link, &plan, &hook).await?;
                if let Some(python) = python {
                    rows.extend(coordinator::python_rows(python, &redis.url, &plan, &hook).await?);
                }
                Ok(rows)
            },
            async |servers, ended| {
                bar.finish_and_clear();
                // Whatever happened (an error, Ctrl-C), the bench's keys go.
                let redis = redis_of(servers)?;
                let nodes = masters.lock().clone();
                let deleted = coordinator::delete_prefix(redis, &nodes, &plan.prefix).await;
                let rows = ended.into_result()?;
                let about = About {
                    url: lab_infra::url::redact(&redis.url),
                    origin: redis.origin,
                    version: redis.version.clone(),
                    cluster: !masters.lock().is_empty(),
                    deleted: deleted?,
                };
                Ok((rows, about))
            },
        )
        .await?;
    if session.format() == Format::Json {
        for row in &rows {
            say!("{}", serde_json::to_string(row).expect("a row serialises"));
        }
    } else {
        print_rows(&rows, &about, &plan.prefix, ops, python.is_some());
    }
    Ok(exit::OK)
}

/// The Redis of the bench's servers.
fn redis_of(servers: &Servers) -> Result<&RedisServer, Failure> {
    servers.redis.as_ref().ok_or_else(|| {
        Failure::environment(anyhow!(t(
            Msg::new("bench.no_server").arg("server", "Redis")
        )))
    })
}

/// What the table's title and its last line say about the Redis measured on.
struct About {
    url: String,
    origin: Origin,
    version: String,
    cluster: bool,
    deleted: u64,
}

/// The table for people.
fn print_rows(rows: &[Row], about: &About, prefix: &str, ops: u64, python: bool) {
    let origin = match about.origin {
        Origin::Given => t("bench.given"),
        Origin::Throwaway => t("bench.throwaway"),
    };
    let cluster = if about.cluster {
        format!(", {}", t("bench.cluster"))
    } else {
        String::new()
    };
    say!(
        "{}",
        t(Msg::new("bench.coordinator_title")
            .arg("url", about.url.as_str())
            .arg("origin", origin)
            .arg("version", about.version.as_str())
            .arg("ops", ops.to_string())
            .arg("warm", warm_up(ops).to_string())
            .arg("cluster", cluster))
    );
    say!();
    let header: Vec<String> = [
        "col_bench",
        "col_path",
        "col_policy",
        "col_concurrency",
        "col_ops_per_sec",
        "col_p50",
        "col_p99",
        "col_raw",
        "col_ratio",
    ]
    .iter()
    .map(|key| t(Msg::new(format!("bench.{key}"))))
    .collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.bench.clone(),
                r.path.clone(),
                r.policy.clone(),
                r.concurrency.to_string(),
                format!("{:.0}", r.ops_per_sec),
                format!("{:.0}", r.p50_us),
                format!("{:.0}", r.p99_us),
                format!("{:.0}", r.raw_ops_per_sec),
                ratio_cell(r.ratio_to_raw()),
            ]
        })
        .collect();
    print_table(&header, &cells, 3);
    say!();
    say!("{}", t("bench.raw_means"));
    if python {
        say!("{}", t("bench.python_raw_means"));
    }
    say!(
        "{}",
        t(Msg::new("bench.cleaned")
            .arg("count", about.deleted.to_string())
            .arg("prefix", prefix))
    );
}
