//! `lab bench`: how fast the protections are, measured against the fastest thing that could do
//! the same work, in the same run, on the same servers.
//!
//! ```text
//! lab bench coordinator   idem on Redis (new keys, replays; compatible, hardened policy)
//!                         vs a bare Redis client sending the same round trips      coordinator.rs
//! lab bench report-api    POST /reports over HTTP (N requests, K keys, C clients)
//!                         vs the same transaction sent directly through sqlx       report_api.rs
//! ```
//!
//! The measuring lives in the `lab-bench` crate (`crates/lab-bench`), which returns typed rows
//! and prints nothing; what it measures and how is told there. This module is the command
//! around it: the session and its servers (started, or given by URL, and closed however the
//! bench ends), the usage checks of the flags, the progress bar (indicatif, fed through
//! [`lab_bench::Progress`]), and the output: a table for people on stdout, or with
//! `--format json` one object per row. The bar counts calls on stderr, only on a terminal. A
//! [`BenchError`] becomes a [`Failure`] here, its message rendered in the learner's language.

mod coordinator;
mod report_api;

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::anyhow;
use colored::Colorize;
use indicatif::{ProgressBar, ProgressStyle};

use lab_bench::BenchError;
use lab_scenarios::Library;

use crate::cli::BenchCommand;
use crate::exit::{self, Failure};
use crate::session::{Mode, Session, SessionOptions};
use crate::words::t;

pub async fn bench(
    options: SessionOptions,
    library: Library,
    command: &BenchCommand,
) -> Result<u8, Failure> {
    let session = Session::open(options, library, Mode::Headless);
    match command {
        BenchCommand::Coordinator {
            ops,
            concurrency,
            python,
        } => coordinator::run(session, *ops, concurrency, python.as_deref()).await,
        BenchCommand::ReportApi {
            requests,
            keys,
            concurrency,
            target,
            pgbench,
        } => {
            let load = lab_bench::report_api::Load {
                requests: *requests,
                keys: *keys,
                concurrency: *concurrency,
            };
            report_api::run(session, load, target.as_deref(), *pgbench).await
        }
    }
}

/// A bench's error as the command's failure: a message of the bench's in the learner's
/// language, with the exit code its kind says (see [`BenchError`]); any other error in its own
/// words.
impl From<BenchError> for Failure {
    fn from(error: BenchError) -> Failure {
        match error {
            BenchError::Environment(msg) => Failure::environment(anyhow!(t(msg))),
            BenchError::Drift(msg) => Failure::new(exit::DRIFT, anyhow!(t(msg))),
            BenchError::BadUrl(error) => Failure::usage(error.to_string()),
            other => Failure::environment(other),
        }
    }
}

/// The progress bar as a bench's [`lab_bench::Progress`]: each call done moves it on, and the
/// side running is its message.
struct Bar(ProgressBar);

impl lab_bench::Progress for Bar {
    fn advance(&self, calls: u64) {
        self.0.inc(calls);
    }

    fn side(&self, name: &str) {
        self.0.set_message(name.to_string());
    }
}

/// A bar counting calls on stderr: only when stderr is a terminal and colour is on (it is drawn
/// with escape codes).
pub fn progress(color: bool, total: u64) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() && color {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} · {msg} · {elapsed}")
            .expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Prints rows as a table: a bold header, columns right-aligned except the first `left` ones.
pub fn print_table(header: &[String], rows: &[Vec<String>], left: usize) {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let pad = widths[c].saturating_sub(cell.chars().count());
                if c < left {
                    format!("{cell}{}", " ".repeat(pad))
                } else {
                    format!("{}{cell}", " ".repeat(pad))
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    say!("  {}", line(header).bold());
    for row in rows {
        say!("  {}", line(row));
    }
}

/// A ratio to the limit, coloured: green from half the limit on, yellow below.
pub fn ratio_cell(ratio: f64) -> String {
    let text = format!("{ratio:.2}");
    if ratio >= 0.5 {
        text.green().to_string()
    } else {
        text.yellow().to_string()
    }
}
