//! `lab doctor`: which servers would be used, their versions, and what is missing.

use faultproxy::client::ToxiproxyClient;
use lab_infra::servers::Plan;
use lab_infra::{Needs, ServerOptions, Servers};
use lab_scenarios::FaultUse;

use crate::cli::{Global, exit};
use crate::session::{self, Failure};

pub async fn doctor(global: &Global) -> Result<u8, Failure> {
    let options = ServerOptions {
        database_url: global.database_url.clone(),
        redis_url: global.redis_url.clone(),
    };
    let Plan {
        mut postgres,
        mut redis,
    } = Servers::plan(&options);

    // Given URLs are checked for real: connect and ask the server its version.
    let given = Needs {
        postgres: options.database_url.is_some(),
        redis: options.redis_url.is_some(),
    };
    if given != Needs::default() {
        match Servers::start(&options, given).await {
            Ok(servers) => {
                if let Some(pg) = &servers.postgres {
                    postgres = Ok(format!(
                        "given: {} (PostgreSQL {})",
                        lab_infra::url::redact(&pg.url),
                        pg.version
                    ));
                }
                if let Some(r) = &servers.redis {
                    redis = Ok(format!(
                        "given: {} (Redis {})",
                        lab_infra::url::redact(&r.url),
                        r.version
                    ));
                }
                servers.shutdown().await;
            }
            Err(e) => {
                // Attribute the failure to the server it is about.
                let message = e.to_string();
                if given.postgres && message.contains("PostgreSQL") {
                    postgres = Err(message);
                } else {
                    redis = Err(message);
                }
            }
        }
    }

    let all = session::resolve(&[])?;
    let needs = session::needs(&all);
    let line = |name: &str, state: &Result<String, String>, needed: bool| match state {
        Ok(s) => println!("  ok       {name:<11} {s}"),
        Err(e) if needed => println!("  MISSING  {name:<11} {e}"),
        Err(e) => println!("  -        {name:<11} {e} (no scenario needs it yet)"),
    };
    println!("lab doctor");
    line("PostgreSQL", &postgres, needs.postgres);
    line("Redis", &redis, needs.redis);
    let toxiproxy = match &global.toxiproxy_url {
        None => Ok("embedded (in-process, one per scenario run that breaks a hop)".to_string()),
        Some(url) => ToxiproxyClient::new(url)
            .version()
            .await
            .map(|v| format!("given: {url} (Toxiproxy {v})"))
            .map_err(|e| e.to_string()),
    };
    line("Toxiproxy", &toxiproxy, true);
    println!();
    println!("Scenarios and what they need:");
    for s in &all {
        let mut parts = Vec::new();
        if s.needs.postgres {
            parts.push("PostgreSQL");
        }
        if s.needs.redis {
            parts.push("Redis");
        }
        match s.faults {
            FaultUse::None => {}
            FaultUse::Toxics => parts.push("fault proxy (toxics: a given Toxiproxy works too)"),
            FaultUse::OneShot => parts.push("fault proxy (one-shot faults: embedded only)"),
        }
        println!("  {:<12} {}", s.name, parts.join(", "));
    }
    let usable = (postgres.is_ok() || !needs.postgres)
        && (redis.is_ok() || !needs.redis)
        && toxiproxy.is_ok();
    if usable {
        Ok(exit::OK)
    } else {
        println!();
        println!(
            "Missing servers: install postgresql and redis-server, pass --database-url/--redis-url, \
             or run `docker compose up -d` and use the URLs from the README."
        );
        Ok(exit::ENVIRONMENT)
    }
}
