//! The command line's own words (its errors, `doctor`, `serve`'s banner, what it says when it
//! stops) in the learner's language, from the `[cli]` section of `scenarios/common/<lang>.toml`.
//! Chosen once per process, as the narrative's language is (`--lang`, `LAB_LANG`, `LANG`).
//!
//! clap's own messages (an unknown flag, `--help`'s frame) stay in English: clap has no
//! translations.

use std::sync::{Arc, OnceLock};

use lab_core::text::COMMON;
use lab_core::{Lang, Msg, Texts};

struct Words {
    texts: Option<Arc<Texts>>,
    lang: Lang,
}

static WORDS: OnceLock<Words> = OnceLock::new();

/// Chooses the language and the texts (the library's, loaded once). A broken installation (no
/// texts) leaves the keys themselves to be shown; the command then fails on loading its
/// scenarios anyway.
pub fn init(lang: Lang, texts: Option<Arc<Texts>>) {
    let _ = WORDS.set(Words { texts, lang });
}

/// A message of the `[cli]` section (`key` without the `cli.`), rendered.
pub fn t(msg: impl Into<Msg>) -> String {
    let mut msg = msg.into();
    msg.key = format!("cli.{}", msg.key);
    match WORDS
        .get()
        .and_then(|w| w.texts.as_ref().map(|t| (t, w.lang)))
    {
        Some((texts, lang)) => texts.render(COMMON, lang, &msg),
        None => msg.key,
    }
}

/// A service's name as the narrative says it (`service.<name>` of the common texts).
pub fn service(name: &str) -> String {
    match WORDS
        .get()
        .and_then(|w| w.texts.as_ref().map(|t| (t, w.lang)))
    {
        Some((texts, lang)) => texts.render(COMMON, lang, &Msg::new(format!("service.{name}"))),
        None => name.to_string(),
    }
}

/// A list of the `[cli]` section (`key` without the `cli.`).
pub fn list(key: &str) -> Vec<String> {
    WORDS
        .get()
        .and_then(|w| w.texts.as_ref().map(|t| (t, w.lang)))
        .map(|(texts, lang)| texts.list(COMMON, lang, &format!("cli.{key}")))
        .unwrap_or_default()
}
