//! The files under `scenarios/`: what the lab says, and what it expects.
//!
//! ```text
//! scenarios/common/{en,ru}.toml        texts every scenario shares (labels, services, outcomes)
//! scenarios/<name>/{en,ru}.toml        the scenario's title, story, steps, questions
//! scenarios/<name>/expected.json       {"facts": {...}}: the facts the run must measure
//! scenarios/<name>/expected.{en,ru}.txt the narrative, rendered without colour
//! ```
//!
//! `lab check` must notice an edited file without a rebuild, so the library is read from the
//! checkout the binary was built from (or `LAB_SCENARIOS_DIR`) when it exists. A binary copied
//! elsewhere falls back to the copies embedded at build time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lab_core::text::COMMON;
use lab_core::{Facts, Lang, Texts};

use crate::CATALOGUE;

/// Where the scenario files are read from.
#[derive(Debug, Clone)]
pub enum Source {
    Dir(PathBuf),
    Embedded,
}

/// The scenario files, loaded.
#[derive(Clone)]
pub struct Library {
    pub source: Source,
    pub texts: Arc<Texts>,
    expected: std::collections::HashMap<String, Facts>,
}

/// The files of one scope, embedded at build time.
struct Embedded {
    name: &'static str,
    en: &'static str,
    ru: &'static str,
    expected: Option<&'static str>,
    narrative_en: Option<&'static str>,
    narrative_ru: Option<&'static str>,
}

macro_rules! embed {
    (common) => {
        Embedded {
            name: "common",
            en: include_str!("../../../scenarios/common/en.toml"),
            ru: include_str!("../../../scenarios/common/ru.toml"),
            expected: None,
            narrative_en: None,
            narrative_ru: None,
        }
    };
    ($name:literal) => {
        Embedded {
            name: $name,
            en: include_str!(concat!("../../../scenarios/", $name, "/en.toml")),
            ru: include_str!(concat!("../../../scenarios/", $name, "/ru.toml")),
            expected: Some(include_str!(concat!(
                "../../../scenarios/",
                $name,
                "/expected.json"
            ))),
            narrative_en: Some(include_str!(concat!(
                "../../../scenarios/",
                $name,
                "/expected.en.txt"
            ))),
            narrative_ru: Some(include_str!(concat!(
                "../../../scenarios/",
                $name,
                "/expected.ru.txt"
            ))),
        }
    };
}

static EMBEDDED: &[Embedded] = &[
    embed!(common),
    embed!("duplicate"),
    embed!("idempotent"),
    embed!("timeout"),
    embed!("concurrent"),
    embed!("lease"),
    embed!("lease-stale"),
];

/// A file that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Text(#[from] lab_core::text::TextError),
    #[error("{what} is not valid: {reason}")]
    Expected { what: String, reason: String },
}

/// The expected facts file: `{"facts": {...}}`.
#[derive(serde::Deserialize, serde::Serialize)]
struct ExpectedFile {
    facts: Facts,
}

/// Renders an expected facts file (what `--bless` writes).
pub fn expected_json(facts: &Facts) -> String {
    let file = ExpectedFile {
        facts: facts.clone(),
    };
    serde_json::to_string_pretty(&file).expect("facts serialise") + "\n"
}

fn parse_expected(what: &str, text: &str) -> Result<Facts, LibraryError> {
    serde_json::from_str::<ExpectedFile>(text)
        .map(|f| f.facts)
        .map_err(|e| LibraryError::Expected {
            what: what.to_string(),
            reason: e.to_string(),
        })
}

/// The directory of the checkout this binary was built from, if it is still there.
fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LAB_SCENARIOS_DIR") {
        return Some(PathBuf::from(dir));
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    dir.join("common/en.toml").is_file().then_some(dir)
}

impl Library {
    /// Loads from the checkout if there is one, else from the embedded copies.
    pub fn load() -> Result<Library, LibraryError> {
        match default_dir() {
            Some(dir) => Library::from_dir(&dir),
            None => Library::embedded(),
        }
    }

    /// Loads from a `scenarios/` directory.
    pub fn from_dir(dir: &Path) -> Result<Library, LibraryError> {
        let read = |path: PathBuf| {
            std::fs::read_to_string(&path).map_err(|source| LibraryError::Read { path, source })
        };
        let mut texts = Texts::new();
        let mut expected = std::collections::HashMap::new();
        let scopes = std::iter::once(COMMON).chain(CATALOGUE.iter().map(|s| s.name));
        for scope in scopes {
            for lang in Lang::ALL {
                let source = read(dir.join(scope).join(format!("{}.toml", lang.code())))?;
                texts.add(scope, lang, &source)?;
            }
            if scope != COMMON {
                let path = dir.join(scope).join("expected.json");
                // A new scenario has no expectations until `lab check NAME --bless`.
                let facts = match std::fs::read_to_string(&path) {
                    Ok(text) => parse_expected(&path.display().to_string(), &text)?,
                    Err(_) => Facts::new(),
                };
                expected.insert(scope.to_string(), facts);
            }
        }
        Ok(Library {
            source: Source::Dir(dir.to_path_buf()),
            texts: Arc::new(texts),
            expected,
        })
    }

    /// Loads the copies embedded at build time.
    pub fn embedded() -> Result<Library, LibraryError> {
        let mut texts = Texts::new();
        let mut expected = std::collections::HashMap::new();
        for e in EMBEDDED {
            texts.add(e.name, Lang::En, e.en)?;
            texts.add(e.name, Lang::Ru, e.ru)?;
            if let Some(text) = e.expected {
                expected.insert(e.name.to_string(), parse_expected(e.name, text)?);
            }
        }
        Ok(Library {
            source: Source::Embedded,
            texts: Arc::new(texts),
            expected,
        })
    }

    /// The facts a scenario must measure.
    pub fn expected_facts(&self, scenario: &str) -> Facts {
        self.expected.get(scenario).cloned().unwrap_or_default()
    }

    /// The expected narrative of a scenario in one language (`None` if not recorded yet).
    pub fn expected_narrative(&self, scenario: &str, lang: Lang) -> Option<String> {
        match &self.source {
            Source::Dir(dir) => std::fs::read_to_string(
                dir.join(scenario)
                    .join(format!("expected.{}.txt", lang.code())),
            )
            .ok(),
            Source::Embedded => EMBEDDED
                .iter()
                .find(|e| e.name == scenario)
                .and_then(|e| match lang {
                    Lang::En => e.narrative_en,
                    Lang::Ru => e.narrative_ru,
                })
                .map(str::to_string),
        }
    }

    /// Writes a scenario's expectations (`lab check --bless`). Only with a directory source.
    pub fn bless(
        &self,
        scenario: &str,
        facts: &Facts,
        narratives: &[(Lang, String)],
    ) -> Result<PathBuf, LibraryError> {
        let Source::Dir(dir) = &self.source else {
            return Err(LibraryError::Expected {
                what: "--bless".to_string(),
                reason: "this lab binary has no scenarios/ directory to write to; run it from a checkout or set LAB_SCENARIOS_DIR".to_string(),
            });
        };
        let scenario_dir = dir.join(scenario);
        let write = |path: PathBuf, text: &str| {
            std::fs::write(&path, text).map_err(|source| LibraryError::Write { path, source })
        };
        write(scenario_dir.join("expected.json"), &expected_json(facts))?;
        for (lang, text) in narratives {
            write(
                scenario_dir.join(format!("expected.{}.txt", lang.code())),
                text,
            )?;
        }
        Ok(scenario_dir)
    }
}
