//! One module per command. Each returns an exit code or a [`Failure`].

mod bench;
mod check;
mod doctor;
mod explain;
mod list;
mod page;
pub mod proxy;
mod run;
mod serve;
mod soak;

use crate::cli::{Cli, Command};
use crate::session::Failure;
use crate::words::t;

/// Runs the command and turns any failure into one line on stderr and its exit code.
pub async fn dispatch(cli: Cli) -> u8 {
    crate::words::init(crate::session::lang(&cli.global));
    let junit_elsewhere = cli.global.format == crate::cli::FormatArg::Junit
        && !matches!(cli.command, Command::Check { .. });
    let result = match &cli.command {
        _ if junit_elsewhere => Err(Failure::usage(t("junit_elsewhere"))),
        Command::List { knobs } => list::list(&cli.global, *knobs),
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
            let web = web.then(|| run::Web {
                bind: web_bind.unwrap_or_else(|| (std::net::Ipv4Addr::LOCALHOST, 0).into()),
                open: !no_open,
            });
            run::run(&cli.global, names, set, &pictures, web.as_ref()).await
        }
        Command::Check { names, bless } => check::check(&cli.global, names, *bless).await,
        Command::Doctor => doctor::doctor(&cli.global).await,
        Command::Explain { names } => explain::explain(&cli.global, names).await,
        Command::Serve { port_base } => serve::serve(&cli.global, *port_base).await,
        Command::Proxy(args) => proxy::proxy(&cli.global, args).await,
        Command::Soak {
            target,
            iterations,
            seed,
            protections,
        } => soak::soak(&cli.global, *target, *iterations, *seed, *protections).await,
        Command::Bench(bench) => bench::bench(&cli.global, bench).await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut command, "lab", &mut std::io::stdout());
            Ok(crate::cli::exit::OK)
        }
    };
    match result {
        Ok(code) => code,
        Err(Failure { code, error }) => {
            // After whatever the command printed before it failed.
            crate::output::drain();
            eprintln!("{} {}", t("error_prefix"), one_line(&error));
            code
        }
    }
}

/// An error and its causes on one line, each said once: many errors already include their
/// cause's text in their own message, and printing the chain as well would repeat it.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
