//! `lab doctor`: which servers would be used, their versions, and what is missing.
//!
//! Given URLs are checked for real (connect, ask the version), each on its own so a failure is
//! reported against the server it concerns. Throwaway servers are not started: doctor names the
//! programs that would be run and their versions.

use faultproxy::client::ToxiproxyClient;
use lab_core::Msg;
use lab_infra::servers::Plan;
use lab_infra::{Needs, ServerOptions, Servers};
use lab_scenarios::{Entry, FaultUse};
use serde_json::json;

use crate::exit::{self, Failure};
use crate::select;
use crate::session::{Format, SessionOptions};
use crate::words::t;

/// What doctor found about one component: what would be used, or why it cannot be.
type Finding = Result<String, String>;

/// Connects to one given server and describes it.
async fn check_given(options: &ServerOptions, needs: Needs) -> Finding {
    let servers = Servers::start(options, needs)
        .await
        .map_err(|e| e.to_string())?;
    let found = if let Some(pg) = &servers.postgres {
        t(Msg::new("doctor.given")
            .arg("url", pg.target.redacted())
            .arg("server", "PostgreSQL")
            .arg("version", pg.version.as_str()))
    } else if let Some(r) = &servers.redis {
        t(Msg::new("doctor.given")
            .arg("url", lab_infra::url::redact(&r.url))
            .arg("server", "Redis")
            .arg("version", r.version.as_str()))
    } else {
        String::new()
    };
    servers.shutdown().await;
    Ok(found)
}

/// What doctor found: each server, the scenario files, what a killed lab left behind.
struct Findings {
    postgres: Finding,
    redis: Finding,
    toxiproxy: Finding,
    files: String,
    removed: Vec<std::path::PathBuf>,
}

pub async fn doctor(options: &SessionOptions) -> Result<u8, Failure> {
    // What a killed lab left behind is removed first, and reported.
    let removed = lab_infra::leftovers::sweep_async().await;
    let files = match lab_scenarios::library::scenarios_dir() {
        Some(dir) => dir.display().to_string(),
        None => t("doctor.builtin_files"),
    };
    let servers = &options.servers;
    let Plan {
        mut postgres,
        mut redis,
    } = Servers::plan(servers).await;
    if servers.database_url.is_some() {
        postgres = check_given(servers, Needs::POSTGRES).await;
    }
    if servers.redis_url.is_some() {
        let only = Needs {
            postgres: false,
            redis: true,
        };
        redis = check_given(servers, only).await;
    }
    let toxiproxy: Finding = match &options.toxiproxy_url {
        None => Ok(t("doctor.embedded_proxy")),
        Some(url) => ToxiproxyClient::new(url)
            .version()
            .await
            .map(|v| {
                t(Msg::new("doctor.given")
                    .arg("url", url.as_str())
                    .arg("server", "Toxiproxy")
                    .arg("version", v))
            })
            .map_err(|e| e.to_string()),
    };
    let findings = Findings {
        postgres,
        redis,
        toxiproxy,
        files,
        removed,
    };
    let all = select::scenarios(&[])?;
    let needs = select::needs(&all);
    let usable = (findings.postgres.is_ok() || !needs.postgres)
        && (findings.redis.is_ok() || !needs.redis)
        && findings.toxiproxy.is_ok();
    match options.format {
        Format::Json => print_json(&findings, &all, needs, usable),
        Format::Text => print_text(&findings, &all, needs, usable),
    }
    Ok(if usable { exit::OK } else { exit::ENVIRONMENT })
}

/// What a scenario needs, in words.
fn scenario_needs(s: &Entry) -> Vec<String> {
    let requires = s.requires();
    let servers = requires.servers();
    let mut parts = Vec::new();
    if servers.postgres {
        parts.push("PostgreSQL".to_string());
    }
    if servers.redis {
        parts.push("Redis".to_string());
    }
    if !requires.services.is_empty() {
        let names: Vec<&str> = requires.services.iter().map(|s| s.name).collect();
        parts.push(t(Msg::new("doctor.services").arg("names", names.join(", "))));
    }
    match requires.faults {
        FaultUse::None => {}
        FaultUse::Toxics(_) => parts.push(t("doctor.toxics")),
        FaultUse::OneShot(_) => parts.push(t("doctor.one_shot")),
    }
    parts
}

fn print_json(findings: &Findings, all: &[Entry], needs: Needs, usable: bool) {
    let finding = |f: &Finding, needed: bool, command: String| match f {
        Ok(s) => json!({"ok": true, "uses": s}),
        Err(e) => json!({"ok": false, "needed": needed, "problem": e, "get_one": command}),
    };
    let [(_, _, _, _, postgres), (_, _, _, _, redis)] = hints(findings, needs);
    say!(
        "{}",
        json!({
            "postgres": finding(&findings.postgres, needs.postgres, postgres),
            "redis": finding(&findings.redis, needs.redis, redis),
            "toxiproxy": finding(&findings.toxiproxy, true, String::new()),
            "scenarios": all.iter().map(|s| json!({
                "scenario": s.name,
                "needs": scenario_needs(s),
                "external_toxiproxy": !matches!(s.requires().faults, FaultUse::OneShot(_)),
            })).collect::<Vec<_>>(),
            "scenario_files": findings.files,
            "removed_leftovers": findings
                .removed
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>(),
            "usable": usable,
        })
    );
}

fn print_text(findings: &Findings, all: &[Entry], needs: Needs, usable: bool) {
    let (ok, missing) = (t("doctor.ok"), t("doctor.missing"));
    let line = |name: &str, state: &Finding, needed: bool| match state {
        Ok(s) => say!("  {ok:<8} {name:<11} {s}"),
        Err(e) if needed => say!("  {missing:<8} {name:<11} {e}"),
        Err(e) => say!("  {:<8} {name:<11} {e} {}", "-", t("doctor.unneeded")),
    };
    say!("lab doctor");
    line("PostgreSQL", &findings.postgres, needs.postgres);
    line("Redis", &findings.redis, needs.redis);
    line("Toxiproxy", &findings.toxiproxy, true);
    say!("  {ok:<8} {:<11} {}", t("doctor.files"), findings.files);
    for dir in &findings.removed {
        say!(
            "  {:<8} {:<11} {}",
            t("doctor.removed"),
            t("doctor.temp_dir"),
            t(Msg::new("doctor.left_behind").arg("dir", dir.display().to_string()))
        );
    }
    say!();
    say!("{}", t("doctor.needs"));
    for s in all {
        say!("  {:<12} {}", s.name, scenario_needs(s).join(", "));
    }
    if !usable {
        say!();
        for (server, finding, needed, flag, command) in hints(findings, needs) {
            if finding.is_err() && needed {
                say!(
                    "{}",
                    t(Msg::new("doctor.hint")
                        .arg("server", server)
                        .arg("command", command)
                        .arg("flag", flag))
                );
            }
        }
    }
}

/// For each server: its finding, whether a scenario needs it, the flag that gives one, and the
/// one command that gets one where this `lab` runs.
fn hints(
    findings: &Findings,
    needs: Needs,
) -> [(&'static str, &Finding, bool, &'static str, String); 2] {
    use lab_infra::binaries::{command_for_postgres, command_for_redis};
    [
        (
            "PostgreSQL",
            &findings.postgres,
            needs.postgres,
            "--database-url",
            command_for_postgres(),
        ),
        (
            "Redis",
            &findings.redis,
            needs.redis,
            "--redis-url",
            command_for_redis(),
        ),
    ]
}
