//! `lab run NAME...`: run scenarios, narrated, on one set of servers.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

use lab_core::gate::Pause;
use lab_core::narrator::SharedSink;
use lab_core::render::{JsonRenderer, Renderer, TextRenderer, WriteSink};
use lab_core::text::COMMON;
use lab_core::{Gate, Lang, Msg, Narrator};
use lab_infra::url::redact;
use lab_infra::{Origin, Servers};
use lab_scenarios::{KeptRun, Library, RunConfig, ScenarioError};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::{FormatArg, Global, exit};
use crate::session::{self, Failure, Guarded, Interrupts};

/// The gate for `--step`: prompts in the learner's language, answers from stdin.
pub(super) fn gate(global: &Global, library: &Library, lang: Lang) -> Gate {
    if !global.step {
        return Gate::default();
    }
    let texts = library.texts.clone();
    Gate::stepping(
        BufReader::new(tokio::io::stdin()),
        Box::new(move |pause| {
            let key = match pause {
                Pause::Step => "gate.step",
                Pause::Service => "gate.service",
                Pause::Predict => "gate.predict",
                Pause::Reveal => "gate.reveal",
            };
            texts.render(COMMON, lang, &Msg::new(key))
        }),
    )
}

/// The live renderer on stdout.
pub(super) fn sink(global: &Global, library: &Library, lang: Lang, color: bool) -> SharedSink {
    let renderer = match global.format {
        FormatArg::Text => Renderer::Text(TextRenderer::new(library.texts.clone(), lang, color)),
        FormatArg::Json => Renderer::Json(JsonRenderer::new(library.texts.clone(), lang)),
    };
    Arc::new(Mutex::new(WriteSink::new(renderer, std::io::stdout())))
}

/// Tells how to look at a kept run (on stderr: run ids are not part of the narrative). A
/// password in a URL is not printed; psql asks for it (or reads PGPASSWORD).
fn print_kept(kept: &KeptRun) {
    eprintln!("lab: kept schema {}", kept.schema);
    if let Some(url) = &kept.pg_url {
        eprintln!(
            "  psql '{}' -c '\\dt' -c 'SELECT * FROM tasks' -c 'SELECT * FROM reports'",
            redact(url)
        );
    }
    if let Some(url) = &kept.redis_url {
        eprintln!("lab: kept keys {}*", kept.prefix);
        eprintln!(
            "  redis-cli -u '{}' --scan --pattern '{}*'",
            redact(url),
            kept.prefix
        );
    }
}

pub async fn run(
    global: &Global,
    names: &[String],
    interrupts: &mut Interrupts,
) -> Result<u8, Failure> {
    let scenarios = session::resolve(names)?;
    let lang = session::lang(global);
    let color = session::color(global);
    let library = session::library()?;
    let gate = gate(global, &library, lang);
    let needs = session::needs(&scenarios);

    let Some(servers) = session::start_servers(global, needs, &library, lang, interrupts).await?
    else {
        return Ok(session::interrupted());
    };

    let sink = sink(global, &library, lang, color);
    let config = RunConfig {
        keep: global.keep,
        toxiproxy_url: global.toxiproxy_url.clone(),
        proxies: Default::default(),
    };
    let work = async {
        let mut all_passed = true;
        for scenario in &scenarios {
            let narrator = Narrator::new(Some(sink.clone()), gate.clone());
            let report =
                lab_scenarios::run(scenario, &servers, narrator, &library, &config).await?;
            if let Some(kept) = &report.kept {
                print_kept(kept);
            }
            all_passed &= report.passed;
        }
        Ok::<bool, ScenarioError>(all_passed)
    };
    let outcome = session::guarded(work, interrupts, &gate).await;
    // Proxies a cancelled run left on a given Toxiproxy.
    config.proxies.delete_left_over().await;
    // Whatever happened, runs that did not finish leave nothing behind (unless --keep).
    if !global.keep {
        servers.clean_abandoned_runs().await;
    }
    let code = match outcome {
        Guarded::Finished(Ok(true)) => Ok(exit::OK),
        Guarded::Finished(Ok(false)) => Ok(exit::DRIFT),
        Guarded::Finished(Err(ScenarioError::Quit(_))) | Guarded::Quit => {
            eprintln!("lab: stopped; servers and temporary files are cleaned up");
            Ok(exit::OK)
        }
        Guarded::Interrupted => Ok(session::interrupted()),
        Guarded::Finished(Err(e)) => Err(session::scenario_failure(e)),
    };
    if global.keep && matches!(code, Ok(exit::OK) | Ok(exit::DRIFT)) {
        wait_before_stopping_kept(&servers, interrupts).await;
    }
    servers.shutdown().await;
    code
}

/// With `--keep` on throwaway servers, the data would vanish with the servers: keep them up
/// until the learner presses Enter (or closes stdin, or presses Ctrl-C).
async fn wait_before_stopping_kept(servers: &Servers, interrupts: &mut Interrupts) {
    let throwaway = servers
        .postgres
        .as_ref()
        .is_some_and(|p| p.origin == Origin::Throwaway)
        || servers
            .redis
            .as_ref()
            .is_some_and(|r| r.origin == Origin::Throwaway);
    if !throwaway {
        return;
    }
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "lab: --keep with throwaway servers: they stop now, with the data; to inspect a run \
             afterwards, run in a terminal (lab waits for Enter) or pass --database-url/--redis-url"
        );
        return;
    }
    eprintln!("lab: the throwaway servers stay up for inspection; press Enter to stop them");
    let mut line = String::new();
    let mut stdin = BufReader::new(tokio::io::stdin());
    let never_quits = Gate::default();
    let _ = session::guarded(stdin.read_line(&mut line), interrupts, &never_quits).await;
}
