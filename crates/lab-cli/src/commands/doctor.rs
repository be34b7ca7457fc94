//! `lab doctor`: which servers would be used, their versions, and what is missing.
//!
//! Given URLs are checked for real (connect, ask the version), each on its own so a failure is
//! reported against the server it concerns. Throwaway servers are not started: doctor names the
//! programs that would be run and their versions.

use faultproxy::client::ToxiproxyClient;
use lab_infra::servers::Plan;
use lab_infra::{Needs, ServerOptions, Servers};
use lab_scenarios::FaultUse;
use serde_json::json;

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure};

/// What doctor found about one component: what would be used, or why it cannot be.
type Finding = Result<String, String>;

/// Connects to one given server and describes it.
async fn check_given(options: &ServerOptions, needs: Needs) -> Finding {
    let servers = Servers::start(options, needs)
        .await
        .map_err(|e| e.to_string())?;
    let found = if let Some(pg) = &servers.postgres {
        format!(
            "given: {} (PostgreSQL {})",
            lab_infra::url::redact(&pg.url),
            pg.version
        )
    } else if let Some(r) = &servers.redis {
        format!(
            "given: {} (Redis {})",
            lab_infra::url::redact(&r.url),
            r.version
        )
    } else {
        String::new()
    };
    servers.shutdown().await;
    Ok(found)
}

pub async fn doctor(global: &Global) -> Result<u8, Failure> {
    // What a killed lab left behind is removed first, and reported.
    let removed = lab_infra::leftovers::sweep_async().await;
    let files = match lab_scenarios::library::scenarios_dir() {
        Some(dir) => dir.display().to_string(),
        None => "built into this lab".to_string(),
    };
    let options = ServerOptions::new(global.database_url.clone(), global.redis_url.clone());
    let Plan {
        mut postgres,
        mut redis,
    } = Servers::plan(&options).await;
    if options.database_url.is_some() {
        let only = Needs {
            postgres: true,
            redis: false,
        };
        postgres = check_given(&options, only).await;
    }
    if options.redis_url.is_some() {
        let only = Needs {
            postgres: false,
            redis: true,
        };
        redis = check_given(&options, only).await;
    }
    let toxiproxy: Finding = match &session::toxiproxy_url(global)? {
        None => Ok("embedded (in-process, one per scenario run that breaks a hop)".to_string()),
        Some(url) => ToxiproxyClient::new(url)
            .version()
            .await
            .map(|v| format!("given: {url} (Toxiproxy {v})"))
            .map_err(|e| e.to_string()),
    };

    let all = session::resolve(&[])?;
    let needs = session::needs(&all);
    let usable = (postgres.is_ok() || !needs.postgres)
        && (redis.is_ok() || !needs.redis)
        && toxiproxy.is_ok();
    let scenario_needs = |s: &lab_scenarios::Entry| {
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
            parts.push(format!("services: {}", names.join(", ")));
        }
        match requires.faults {
            FaultUse::None => {}
            FaultUse::Toxics(_) => {
                parts.push("fault proxy (toxics: a given Toxiproxy works too)".to_string())
            }
            FaultUse::OneShot(_) => {
                parts.push("fault proxy (one-shot faults: embedded only)".to_string())
            }
        }
        parts
    };

    match global.format {
        FormatArg::Json => {
            let finding = |f: &Finding, needed: bool| match f {
                Ok(s) => json!({"ok": true, "uses": s}),
                Err(e) => json!({"ok": false, "needed": needed, "problem": e}),
            };
            say!(
                "{}",
                json!({
                    "postgres": finding(&postgres, needs.postgres),
                    "redis": finding(&redis, needs.redis),
                    "toxiproxy": finding(&toxiproxy, true),
                    "scenarios": all.iter().map(|s| json!({
                        "scenario": s.name,
                        "needs": scenario_needs(s),
                        "external_toxiproxy": !matches!(s.requires().faults, FaultUse::OneShot(_)),
                    })).collect::<Vec<_>>(),
                    "scenario_files": files,
                    "removed_leftovers": removed.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
                    "usable": usable,
                })
            );
        }
        FormatArg::Text | FormatArg::Junit => {
            let line = |name: &str, state: &Finding, needed: bool| match state {
                Ok(s) => say!("  ok       {name:<11} {s}"),
                Err(e) if needed => say!("  MISSING  {name:<11} {e}"),
                Err(e) => say!("  -        {name:<11} {e} (no scenario needs it yet)"),
            };
            say!("lab doctor");
            line("PostgreSQL", &postgres, needs.postgres);
            line("Redis", &redis, needs.redis);
            line("Toxiproxy", &toxiproxy, true);
            say!("  ok       {:<11} {files}", "scenarios");
            for dir in &removed {
                say!(
                    "  removed  {:<11} {} (left behind by a lab that was killed)",
                    "temp dir",
                    dir.display()
                );
            }
            say!();
            say!("Scenarios and what they need:");
            for s in &all {
                say!("  {:<12} {}", s.name, scenario_needs(s).join(", "));
            }
            if !usable {
                say!();
                say!(
                    "Missing servers: install postgresql and redis-server, pass --database-url/--redis-url, \
                     or run `docker compose up -d` and use the URLs from the README."
                );
            }
        }
    }
    Ok(if usable { exit::OK } else { exit::ENVIRONMENT })
}
