//! A template of an initialised PostgreSQL data directory, kept in the user's cache directory.
//!
//! `initdb` is most of a throwaway PostgreSQL's start: a second or two on a small machine,
//! against a few hundredths of a second for copying the directory it makes. So the first
//! throwaway server of a machine keeps a copy of its fresh data directory, and every later one
//! copies that instead of running `initdb` (see [`crate::postgres`]).
//!
//! # Where and under which name
//!
//! In the lab's cache directory: `LAB_CACHE_DIR`, else `$XDG_CACHE_HOME/lab`, else
//! `~/.cache/lab` ([`TemplatePlace`]); `LAB_NO_TEMPLATE=1` turns the cache off. One template
//! per server and `initdb` options: the name holds the server's version and a hash of its
//! `postgres --version` line, its path and the options, so another PostgreSQL (an upgrade,
//! `LAB_PG_BINDIR`) never gets a template it did not make.
//!
//! # Never half a template
//!
//! A template is built in a directory of its own next to where it goes, `.NAME.build-*`, and
//! moved into place with one `rename(2)`, which is atomic: a reader sees no template or a whole
//! one. Two `lab`s building at once each build their own; the first rename wins and the second
//! fails (the place is taken), and its loser removes its copy. No lock is needed, and nothing
//! waits for anyone else.
//!
//! A template also carries a manifest, written last: every directory and every file with its
//! size. A copy is checked against it as it is made, so a template that lost or changed a file
//! (a cleaner that trims `~/.cache`, a full disk) is noticed, thrown away and rebuilt from the
//! next `initdb`. A template whose copy does not start is thrown away too (by the caller).
//! Thrown away means renamed to `.trash-*` first, again atomically, then removed.
//!
//! What a killed `lab` leaves here (a half-built `.build-*` directory, whose owner file names
//! it, as the throwaway directories do; a `.trash-*` not yet removed) is removed by the next
//! `lab` that looks for a template.
//!
//! The cache is only ever a shortcut: when it cannot be created or written, or a template
//! cannot be used, the server is made with `initdb` as before, and nothing is reported.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::unistd::{Gid, Uid};
use tempfile::TempDir;

use crate::binaries::{self, PgBinaries};
use crate::copy::{self, copy_tree};

/// The manifest's file name, at the top of a template (and left out of its copies).
const MANIFEST: &str = "lab-template";

/// The manifest's first line: changing how templates are made means changing it.
const FORMAT: &str = "lab postgres template 1";

/// Where the template is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TemplatePlace {
    /// As the environment says: nowhere with `LAB_NO_TEMPLATE=1` (any value but empty and
    /// `0`), else in `LAB_CACHE_DIR`, `$XDG_CACHE_HOME/lab` or `~/.cache/lab`.
    #[default]
    FromEnv,
    /// In this cache directory.
    In(PathBuf),
    /// Nowhere: every server is made with `initdb`.
    Off,
}

impl TemplatePlace {
    /// The cache directory, if templates are kept.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        match self {
            TemplatePlace::FromEnv => cache_dir_from(|name| std::env::var_os(name)),
            TemplatePlace::In(dir) => Some(dir.clone()),
            TemplatePlace::Off => None,
        }
    }
}

/// The cache directory the variables given by `var` name, if any.
fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    // Set and empty counts as unset, as for the URLs.
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if set("LAB_NO_TEMPLATE").is_some_and(|v| v != "0") {
        return None;
    }
    if let Some(dir) = set("LAB_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    // The XDG base directory spec: a relative path is invalid and is to be ignored.
    if let Some(dir) = set("XDG_CACHE_HOME").map(PathBuf::from)
        && dir.is_absolute()
    {
        return Some(dir.join("lab"));
    }
    set("HOME").map(|home| PathBuf::from(home).join(".cache").join("lab"))
}

/// Why a template could not be copied.
#[derive(Debug)]
pub(crate) enum Unusable {
    /// There is none yet.
    Missing,
    /// It is not what its manifest says (or has none): it should be thrown away.
    Damaged,
    /// The copy failed or was cancelled: nothing says the template is at fault.
    Copy,
}

/// The template for one PostgreSQL and one set of `initdb` options, which may not exist yet.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    cache: PathBuf,
    /// The directory name: `postgres-<version>-<hash>`.
    name: String,
    /// The manifest's header: the format, the hash and the version line.
    header: String,
}

impl Template {
    /// The template for `bins` and `initdb_args` in the cache `place` names, which is created
    /// if needed; `None` when templates are off or the cache cannot be created. Also removes
    /// what killed `lab`s left in the cache.
    pub(crate) async fn find(
        place: &TemplatePlace,
        bins: &PgBinaries,
        initdb_args: &[&str],
    ) -> Option<Template> {
        let cache = place.cache_dir()?;
        let version = binaries::version_of(&bins.postgres).await?;
        let postgres = bins.postgres.clone();
        let args = initdb_args.join(" ");
        // A few file-system calls, still off the runtime.
        tokio::task::spawn_blocking(move || {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&cache)
                .ok()?;
            sweep(&cache);
            // The same server under two names (a symlink on PATH) shares one template.
            let postgres = fs::canonicalize(&postgres).unwrap_or(postgres);
            let hash = fnv1a(
                [FORMAT, &version, &postgres.to_string_lossy(), &args]
                    .join("\n")
                    .as_bytes(),
            );
            // "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)": the number, for people.
            let number: String = version
                .split_whitespace()
                .nth(2)
                .unwrap_or("unknown")
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect();
            Some(Template {
                cache,
                name: format!("postgres-{number}-{hash:016x}"),
                header: format!("{FORMAT}\n{hash:016x}\n{version}\n"),
            })
        })
        .await
        .ok()
        .flatten()
    }

    /// Where the template is (or will be).
    pub(crate) fn path(&self) -> PathBuf {
        self.cache.join(&self.name)
    }

    /// Copies the template to `data` (which must not exist), handing it to `owner`, and checks
    /// the copy against the manifest. `hold` is the directory `data` is in: it is kept until
    /// the copy has stopped, even if this future is dropped.
    pub(crate) async fn copy_to(
        &self,
        data: &Path,
        owner: Option<(Uid, Gid)>,
        hold: Arc<TempDir>,
    ) -> Result<(), Unusable> {
        let template = self.path();
        let header = self.header.clone();
        let data = data.to_path_buf();
        copy::blocking(move |stop| {
            let _hold = hold;
            let manifest = match fs::read_to_string(template.join(MANIFEST)) {
                Ok(manifest) => manifest,
                Err(e) if e.kind() == io::ErrorKind::NotFound && !template.exists() => {
                    return Err(Unusable::Missing);
                }
                // A directory under the template's name without a readable manifest: a
                // template that was damaged, or something that never was one.
                Err(_) => return Err(Unusable::Damaged),
            };
            // A manifest for another server, or a cut-off one.
            let Some(listed) = manifest.strip_prefix(&header) else {
                return Err(Unusable::Damaged);
            };
            let mut listed: Vec<&str> = listed.lines().collect();
            if !listed.iter().any(|l| l.ends_with(" PG_VERSION")) {
                return Err(Unusable::Damaged);
            }
            let mut copied =
                match copy_tree(&template, &data, owner, Some(OsStr::new(MANIFEST)), stop) {
                    Ok(copied) => copied,
                    // What went missing while copying was not there to copy.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Unusable::Damaged),
                    Err(_) => return Err(Unusable::Copy),
                };
            listed.sort_unstable();
            copied.sort_unstable();
            // A file missing, added or of another size.
            if copied != listed {
                return Err(Unusable::Damaged);
            }
            Ok(())
        })
        .await
        // The copy panicked.
        .unwrap_or(Err(Unusable::Copy))
    }

    /// Keeps a copy of the fresh data directory `data` as the template, unless another `lab`
    /// got there first. `hold` is the directory `data` is in (see [`Template::copy_to`]).
    /// Returns whether this call put the template in place.
    pub(crate) async fn build_from(&self, data: &Path, hold: Arc<TempDir>) -> io::Result<bool> {
        let (cache, name, header) = (self.cache.clone(), self.name.clone(), self.header.clone());
        let template = self.path();
        let data = data.to_path_buf();
        copy::blocking(move |stop| {
            let _hold = hold;
            // Removed with whatever is left in it when dropped: on every way out but the rename.
            let staging = tempfile::Builder::new()
                .prefix(&format!(".{name}.build-"))
                .tempdir_in(&cache)?;
            // Names this lab as the builder, so that the next one removes the directory if this
            // one is killed before it is done.
            crate::leftovers::claim(staging.path())?;
            let copy = staging.path().join("data");
            let listing = copy_tree(&data, &copy, None, None, stop)?;
            let mut manifest = header;
            for line in listing {
                manifest.push_str(&line);
                manifest.push('\n');
            }
            // Written last: a directory without its manifest is never taken for a template.
            fs::write(copy.join(MANIFEST), manifest)?;
            match fs::rename(&copy, &template) {
                Ok(()) => Ok(true),
                // The place is taken: another lab's template, whole, since it came by rename.
                Err(e) if matches!(errno(&e), Some(Errno::ENOTEMPTY | Errno::EEXIST)) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
        .unwrap_or_else(|| Err(io::Error::other("building the template panicked")))
    }

    /// Throws the template away: renamed out of the way at once (the next `lab` no longer
    /// finds it), then removed.
    pub(crate) async fn discard(&self) {
        let (cache, template) = (self.cache.clone(), self.path());
        // Finishes even if this future is dropped; what a killed lab leaves, `sweep` removes.
        let _ = tokio::task::spawn_blocking(move || {
            let trash = cache.join(format!(".trash-{}", uuid::Uuid::new_v4().simple()));
            // Fails when another lab threw it away first: nothing to do then.
            if fs::rename(&template, &trash).is_ok() {
                let _ = fs::remove_dir_all(&trash);
            }
        })
        .await;
    }
}

fn errno(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw)
}

/// Removes what killed `lab`s left in `cache`: templates thrown away but not yet removed, and
/// builds whose builder is gone.
fn sweep(cache: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let stale = if name.starts_with(".trash-") {
            true
        } else if name.starts_with(".postgres-") && name.contains(".build-") {
            crate::leftovers::is_abandoned(&entry.path())
        } else {
            false
        };
        if stale {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// 64-bit FNV-1a: a stable hash (std's may change between Rust releases) for a cache key.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_cache_directory_comes_from_the_environment() {
        let dir = |vars: &[(&str, &str)]| cache_dir_from(env(vars));
        assert_eq!(
            dir(&[("HOME", "/home/a")]),
            Some(PathBuf::from("/home/a/.cache/lab"))
        );
        assert_eq!(
            dir(&[("HOME", "/home/a"), ("XDG_CACHE_HOME", "/c")]),
            Some(PathBuf::from("/c/lab"))
        );
        // A relative XDG_CACHE_HOME is invalid: ignored.
        assert_eq!(
            dir(&[("HOME", "/home/a"), ("XDG_CACHE_HOME", "c")]),
            Some(PathBuf::from("/home/a/.cache/lab"))
        );
        assert_eq!(
            dir(&[
                ("HOME", "/home/a"),
                ("XDG_CACHE_HOME", "/c"),
                ("LAB_CACHE_DIR", "/t")
            ]),
            Some(PathBuf::from("/t"))
        );
        assert_eq!(
            dir(&[("LAB_CACHE_DIR", "/t"), ("LAB_NO_TEMPLATE", "1")]),
            None
        );
        assert_eq!(
            dir(&[("LAB_CACHE_DIR", "/t"), ("LAB_NO_TEMPLATE", "0")]),
            Some(PathBuf::from("/t"))
        );
        assert_eq!(
            dir(&[("LAB_CACHE_DIR", "/t"), ("LAB_NO_TEMPLATE", "")]),
            Some(PathBuf::from("/t"))
        );
        assert_eq!(dir(&[]), None);
    }

    #[test]
    fn the_hash_is_fnv1a() {
        // The published test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_sweep_removes_trash_and_abandoned_builds_only() {
        let cache = tempfile::tempdir().unwrap();
        let path = |name: &str| cache.path().join(name);
        for name in [
            ".trash-1",
            ".postgres-15-0.build-dead",
            ".postgres-15-0.build-live",
            "postgres-15-0",
        ] {
            fs::create_dir(path(name)).unwrap();
        }
        // An owner that exists, with a start time it never had: gone.
        fs::write(
            path(".postgres-15-0.build-dead").join(crate::leftovers::OWNER_FILE),
            format!("{} 1\n", std::process::id()),
        )
        .unwrap();
        crate::leftovers::claim(&path(".postgres-15-0.build-live")).unwrap();
        sweep(cache.path());
        let mut left: Vec<String> = fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".postgres-15-0.build-live", "postgres-15-0"]);
    }
}
