//! One module per command. Each returns an exit code or a [`Failure`]; this one turns the
//! command line's flags into typed [`SessionOptions`] and hands each command what it needs.

mod bench;
mod check;
mod class;
mod doctor;
mod exercise;
mod explain;
mod list;
mod page;
mod proxy;
mod run;
mod serve;
pub mod servers;
mod soak;
mod web_run;

use lab_core::{Lang, Msg};
use lab_infra::ServerOptions;
use lab_scenarios::Library;
use lab_scenarios::library::LibraryError;

use crate::cli::{Cli, ColorArg, Command, FormatArg, Global, LangArg};
use crate::exit::{self, Failure};
use crate::session::{Format, SessionOptions};
use crate::words::t;

/// The language: `--lang`, else the environment.
pub fn lang(global: &Global) -> Lang {
    match global.lang {
        Some(LangArg::En) => Lang::En,
        Some(LangArg::Ru) => Lang::Ru,
        None => Lang::from_env(),
    }
}

/// Runs the command. A failure is reported by the caller, once everything is stopped.
pub async fn dispatch(cli: Cli, library: Result<Library, LibraryError>) -> Result<u8, Failure> {
    let junit = cli.global.format == FormatArg::Junit;
    if junit
        && !matches!(
            cli.command,
            Command::Check { .. } | Command::Exercise(crate::cli::ExerciseCommand::Check { .. })
        )
    {
        return Err(Failure::usage(t("junit_elsewhere")));
    }
    let options = options(&cli.global, &cli.command)?;
    // The scenario files, loaded once (before the runtime started); a broken installation is an
    // environment problem for every command that needs them.
    let library = library.map_err(Failure::environment);
    match &cli.command {
        Command::List { knobs } => list::list(&options, &library?, *knobs),
        Command::Run {
            names,
            set,
            diagram,
            artifacts,
            export,
            web,
            web_bind,
            no_open,
        } => {
            let pictures = run::Pictures {
                diagram: *diagram,
                artifacts: artifacts.clone(),
                export: *export,
            };
            let selection = run::Selection::new(names, set)?;
            match web.then(|| web_run::Web {
                bind: web_bind.unwrap_or_else(|| (std::net::Ipv4Addr::LOCALHOST, 0).into()),
                open: !no_open,
            }) {
                Some(web) => web_run::run(options, library?, selection, &pictures, &web).await,
                None => run::run(options, library?, selection, &pictures).await,
            }
        }
        Command::Check { names, bless } => {
            check::check(options, library?, names, *bless, junit).await
        }
        Command::Doctor => doctor::doctor(&options).await,
        Command::Servers { action } => servers::servers(&options, *action).await,
        Command::Explain { names } => explain::explain(options, library?, names).await,
        Command::Serve { port_base } => serve::serve(options, library?, *port_base).await,
        Command::Proxy(args) => proxy::proxy(&options, args).await,
        Command::Class(args) => class::class(options, library?, args).await,
        Command::Soak {
            target,
            iterations,
            seed,
            protections,
        } => soak::soak(options, library?, *target, *iterations, *seed, *protections).await,
        Command::Bench(bench) => bench::bench(options, library?, bench).await,
        Command::Exercise(command) => {
            exercise::exercise_command(options, library, command, junit).await
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut command, "lab", &mut std::io::stdout());
            Ok(exit::OK)
        }
    }
}

/// The flags every command shares, checked and typed: a URL that is not one is a usage error
/// here, before anything starts (for a command that uses servers; `lab list` does not care).
fn options(global: &Global, command: &Command) -> Result<SessionOptions, Failure> {
    let uses_servers = !matches!(
        command,
        Command::List { .. } | Command::Proxy(_) | Command::Completions { .. }
    );
    let servers = if uses_servers {
        ServerOptions::new(global.database_url.clone(), global.redis_url.clone())?
    } else {
        ServerOptions::default()
    };
    Ok(SessionOptions {
        lang: lang(global),
        color: color(global),
        format: match global.format {
            FormatArg::Json => Format::Json,
            FormatArg::Text | FormatArg::Junit => Format::Text,
        },
        step: global.step,
        quiz: global.quiz,
        answers: global.answers,
        show_sql: global.show_sql,
        show_commands: global.show_commands,
        keep: global.keep,
        servers,
        toxiproxy_url: toxiproxy_url(global)?,
    })
}

/// Applies `--color` and tells whether stdout gets colour. `auto` follows `colored`: colour only
/// on a terminal, never with `NO_COLOR` set, always with `CLICOLOR_FORCE`.
fn color(global: &Global) -> bool {
    match global.color {
        ColorArg::Always => colored::control::set_override(true),
        ColorArg::Never => colored::control::set_override(false),
        ColorArg::Auto => {}
    }
    colored::control::SHOULD_COLORIZE.should_colorize()
}

/// `--toxiproxy-url` (or `TOXIPROXY_URL`; empty counts as unset), checked: a URL that is not an
/// http(s) URL is a usage error.
fn toxiproxy_url(global: &Global) -> Result<Option<String>, Failure> {
    let Some(given) = global
        .toxiproxy_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
    else {
        return Ok(None);
    };
    let bad = |reason: &str| {
        Failure::usage(t(Msg::new("toxiproxy_url")
            .arg("url", given)
            .arg("reason", reason)))
    };
    let parsed = url::Url::parse(given).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(&t("url_scheme")));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad(&t("url_no_host")));
    }
    Ok(Some(given.trim_end_matches('/').to_string()))
}
