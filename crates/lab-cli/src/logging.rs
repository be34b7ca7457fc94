//! The process's `tracing` subscriber: what runs is told to its run (always), and the
//! structured log lines go to stderr (with `--log`).
//!
//! Two layers over one registry, each with its own filter, so one does not widen the other:
//! - [`RanLayer`] turns the SQL statements and Redis commands of a run into events of its
//!   narrator (`--show-sql`, `--show-commands`, `--format json`, `lab explain`);
//! - with `--log`, a formatter prints the lab's own log lines: the services' and the workers'
//!   `info` lines, each with the spans it happened in (`create_report{key=…}`), and the time
//!   since start, so a held answer shows as the gap it is. `LAB_LOG` (`target=level,…`, e.g.
//!   `lab_services=debug,sqlx::query=debug`) replaces the default choice.
//!
//! Nothing sensitive is logged: connection URLs never appear in a log line (the only URLs the
//! services log are their peers' on 127.0.0.1, which carry no password).

use std::str::FromStr;

use lab_core::trace::RanLayer;
use tracing_subscriber::filter::{Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, Registry};

/// What `--log` prints when `LAB_LOG` is not set: the lab's own crates at `info`.
const DEFAULT_LOG: &str = "lab_services=info,lab_scenarios=info,idem=info";

/// Installs the subscriber for this process. `LAB_LOG` that does not parse is an error the
/// caller reports as a usage error.
///
/// `runs_scenarios: false` leaves [`RanLayer`] out. It wants *every* span, so with it each
/// `#[tracing::instrument]` span of the libraries (idem's `coordinate` and each of its Redis
/// commands, at DEBUG) is created, recorded and entered on every poll. A command that runs no
/// scenario (`lab bench`) has nothing to tell a run, and measuring idem under that cost would
/// measure the lab's subscriber, not idem: an application's subscriber at INFO turns those spans
/// off at their call site.
pub fn install(log: bool, color: bool, runs_scenarios: bool) -> Result<(), String> {
    let ran = runs_scenarios.then(|| RanLayer.with_filter(filter_fn(RanLayer::wants)));
    let lines = if log {
        let wanted = std::env::var("LAB_LOG").unwrap_or_else(|_| DEFAULT_LOG.to_string());
        let targets = Targets::from_str(&wanted).map_err(|e| {
            crate::words::t(
                lab_core::Msg::new("lab_log")
                    .arg("value", format!("{wanted:?}"))
                    .arg("error", e.to_string()),
            )
        })?;
        Some(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color)
                .with_timer(tracing_subscriber::fmt::time::uptime())
                .with_filter(targets),
        )
    } else {
        None
    };
    // A second install (tests that call this twice) keeps the first; nothing to report.
    let _ = Registry::default().with(ran).with(lines).try_init();
    Ok(())
}
