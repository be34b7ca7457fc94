//! `lab bench report-api`: N requests over K Idempotency-Keys at concurrency C against the report
//! service, then the count of reports, which must be exactly K; and the same transaction sent
//! directly through sqlx (and, with `--pgbench`, through pgbench). The measuring is
//! `lab_bench::report_api`, where the sides are explained; here are the flags' checks, the
//! session's PostgreSQL, and the output: a table for people or one JSON object per side. The
//! exit code says whether the protection held: exactly K reports on each side, or drift (1).

use std::sync::Arc;

use anyhow::anyhow;
use lab_bench::Progress;
use lab_bench::report_api::{Load, ROUNDS, Report, Side};
use lab_core::Msg;
use lab_infra::Needs;

use super::{Bar, print_table, progress, ratio_cell};
use crate::exit::{self, Failure};
use crate::session::{Format, Session};
use crate::words::t;

pub async fn run(
    session: Session,
    load: Load,
    target: Option<&str>,
    pgbench: bool,
) -> Result<u8, Failure> {
    let target = target.map(check_target).transpose()?;
    let pgbench = match pgbench {
        true => Some(
            lab_infra::binaries::find_pgbench()
                .await
                .ok_or_else(|| Failure::environment(anyhow!(t("bench.no_pgbench"))))?,
        ),
        false => None,
    };
    let sides = if pgbench.is_some() { 3 } else { 2 };
    let bar = progress(session.color(), load.calls(sides));
    let hook: Arc<dyn Progress> = Arc::new(Bar(bar.clone()));
    let report = session
        .with_servers(
            Needs::POSTGRES,
            async |servers| {
                let report = lab_bench::report_api::run(
                    servers,
                    load,
                    target.as_deref(),
                    pgbench.as_deref(),
                    hook.clone(),
                )
                .await?;
                Ok(report)
            },
            async |_, ended| {
                bar.finish_and_clear();
                ended.into_result()
            },
        )
        .await?;
    // Exactly K reports on each side, or the protection failed (drift, exit 1). A target whose
    // reports cannot be counted is said so, and does not fail the bench; pgbench draws its keys
    // at random, so it may not reach every one of them.
    let exact = report.exact();
    if session.format() == Format::Json {
        for row in report.rows() {
            say!("{}", serde_json::to_string(&row).expect("a row serialises"));
        }
    } else {
        print_text(&report, exact);
    }
    Ok(if exact { exit::OK } else { exit::DRIFT })
}

/// The table for people, and what its rows mean.
fn print_text(report: &Report, exact: bool) {
    let load = report.load;
    let direct_rate = report.sqlx.sample.ops_per_sec();
    say!(
        "{}",
        t(Msg::new("bench.report_title")
            .arg("requests", load.requests.to_string())
            .arg("keys", load.keys.to_string())
            .arg("concurrency", load.concurrency.to_string())
            .arg("target", report.target_shown()))
    );
    say!();
    let header: Vec<String> = [
        "col_via",
        "col_requests_per_sec",
        "col_p50",
        "col_p99",
        "col_created",
        "col_replayed",
        "col_reports",
        "col_ratio_sqlx",
        "col_cpu_own",
        "col_cpu_postgres",
    ]
    .iter()
    .map(|key| t(Msg::new(format!("bench.{key}"))))
    .collect();
    let cells: Vec<Vec<String>> = report
        .sides()
        .map(|side| {
            vec![
                side.via.name().to_string(),
                format!("{:.0}", side.sample.ops_per_sec()),
                format!("{:.0}", side.sample.percentile_us(50.0)),
                format!("{:.0}", side.sample.percentile_us(99.0)),
                side.created.to_string(),
                side.replayed.to_string(),
                side.reports
                    .map_or_else(|| "?".to_string(), |n| n.to_string()),
                ratio_cell(side.sample.ops_per_sec() / direct_rate.max(f64::MIN_POSITIVE)),
                format!("{:.0}", side.per_request_us(side.cpu.own)),
                side.cpu.database.map_or_else(
                    || "-".to_string(),
                    |cpu| format!("{:.0}", side.per_request_us(cpu)),
                ),
            ]
        })
        .collect();
    print_table(&header, &cells, 1);
    say!();
    say!("{}", t("bench.report_means"));
    say!(
        "{}",
        t(Msg::new("bench.report_turns").arg("rounds", ROUNDS.to_string()))
    );
    if let Some(pgbench) = &report.pgbench {
        let of = |side: &Side| {
            format!(
                "{:.2}",
                side.sample.ops_per_sec() / pgbench.sample.ops_per_sec().max(f64::MIN_POSITIVE)
            )
        };
        say!(
            "{}",
            t(Msg::new("bench.report_pgbench")
                .arg("http", of(&report.http))
                .arg("sqlx", of(&report.sqlx)))
        );
    }
    if report.target.is_some() {
        say!("{}", t("bench.report_direct_elsewhere"));
    }
    if report.http.reports.is_none() {
        say!("{}", t("bench.report_uncounted"));
    }
    let keys = load.keys.to_string();
    say!(
        "{}",
        t(if exact {
            Msg::new("bench.report_exact").arg("keys", keys)
        } else {
            Msg::new("bench.report_not_exact").arg("keys", keys)
        })
    );
}

/// `--target`: an http URL, without a trailing slash.
fn check_target(given: &str) -> Result<String, Failure> {
    let parsed = url::Url::parse(given).map_err(|e| {
        Failure::usage(t(Msg::new("bench.bad_target")
            .arg("url", given)
            .arg("reason", e.to_string())))
    })?;
    if parsed.scheme() != "http" || parsed.host_str().is_none_or(str::is_empty) {
        let reason = match parsed.scheme() {
            "https" => t("bench.plain_http"),
            _ => t("url_scheme"),
        };
        return Err(Failure::usage(t(Msg::new("bench.bad_target")
            .arg("url", given)
            .arg("reason", reason))));
    }
    Ok(given.trim_end_matches('/').to_string())
}
