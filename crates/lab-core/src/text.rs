//! Message catalogues: every sentence the lab shows, in Russian and English.
//!
//! Texts live in TOML files written by us (`scenarios/<name>/en.toml`, `scenarios/common/ru.toml`,
//! …) and are embedded into the binary. Tables nest with dots (`[step] claim = "…"` is the key
//! `step.claim`), arrays become numbered keys (`quiz.0`, `quiz.1`).
//!
//! Events carry a [`Msg`]: a key and named arguments, never a finished sentence. That keeps the
//! event stream language-free: `lab check` renders one recorded run in both languages.
//! Placeholders are `{name}`; `{{` and `}}` stand for literal braces. A word that agrees with a
//! number is `{name|forms}`: `{count|report|reports}` in English (one, other),
//! `{count|отчёт|отчёта|отчётов}` in Russian (one, few, many); it renders the form alone, so
//! the text says `{count} {count|report|reports}`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::Lang;

/// The scope consulted when a key is not found in a scenario's own catalogue.
pub const COMMON: &str = "common";

/// A sentence to show: the key of a text and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub key: String,
    pub args: Vec<(String, Arg)>,
}

/// One argument of a [`Msg`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// Shown as is, in every language (ids, JSON bodies, SQL, keys).
    Str(String),
    Int(i64),
    /// Another message, translated too (an outcome word, a worker's name).
    Msg(Msg),
}

impl Msg {
    pub fn new(key: impl Into<String>) -> Msg {
        Msg {
            key: key.into(),
            args: Vec::new(),
        }
    }

    /// Adds a named argument (builder style).
    pub fn arg(mut self, name: impl Into<String>, value: impl Into<Arg>) -> Msg {
        self.args.push((name.into(), value.into()));
        self
    }
}

impl From<&str> for Msg {
    fn from(key: &str) -> Msg {
        Msg::new(key)
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Arg {
        Arg::Str(s)
    }
}
impl From<&str> for Arg {
    fn from(s: &str) -> Arg {
        Arg::Str(s.to_string())
    }
}
impl From<&String> for Arg {
    fn from(s: &String) -> Arg {
        Arg::Str(s.clone())
    }
}
impl From<i64> for Arg {
    fn from(n: i64) -> Arg {
        Arg::Int(n)
    }
}
impl From<i32> for Arg {
    fn from(n: i32) -> Arg {
        Arg::Int(n.into())
    }
}
impl From<u32> for Arg {
    fn from(n: u32) -> Arg {
        Arg::Int(n.into())
    }
}
impl From<u16> for Arg {
    fn from(n: u16) -> Arg {
        Arg::Int(n.into())
    }
}
impl From<u64> for Arg {
    fn from(n: u64) -> Arg {
        Arg::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// A duration is told in whole milliseconds: every text that takes one says "ms" after it.
impl From<std::time::Duration> for Arg {
    fn from(d: std::time::Duration) -> Arg {
        Arg::Int(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

impl From<usize> for Arg {
    fn from(n: usize) -> Arg {
        Arg::Int(n as i64)
    }
}
impl From<Msg> for Arg {
    fn from(m: Msg) -> Arg {
        Arg::Msg(m)
    }
}

/// A catalogue file that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("texts for `{scope}` ({lang}) are not valid TOML: {source}")]
    Toml {
        scope: String,
        lang: Lang,
        #[source]
        source: toml::de::Error,
    },
    #[error("texts for `{scope}` ({lang}): `{key}` must be a string or a list of strings")]
    NotText {
        scope: String,
        lang: Lang,
        key: String,
    },
}

/// Every catalogue the lab has, by scope (a scenario name or [`COMMON`]) and language.
#[derive(Debug, Default, Clone)]
pub struct Texts {
    catalogs: HashMap<(String, Lang), BTreeMap<String, String>>,
}

impl Texts {
    pub fn new() -> Texts {
        Texts::default()
    }

    /// Adds (or extends) the catalogue of `scope` in `lang` from TOML source.
    pub fn add(&mut self, scope: &str, lang: Lang, source: &str) -> Result<(), TextError> {
        let table: toml::Table = toml::from_str(source).map_err(|source| TextError::Toml {
            scope: scope.to_string(),
            lang,
            source,
        })?;
        let catalog = self.catalogs.entry((scope.to_string(), lang)).or_default();
        flatten("", &toml::Value::Table(table), catalog).map_err(|key| TextError::NotText {
            scope: scope.to_string(),
            lang,
            key,
        })
    }

    /// The raw text of `key`: from the scope's own catalogue, else from [`COMMON`].
    pub fn get(&self, scope: &str, lang: Lang, key: &str) -> Option<&str> {
        [scope, COMMON].iter().find_map(|s| {
            self.catalogs
                .get(&(s.to_string(), lang))
                .and_then(|c| c.get(key))
                .map(String::as_str)
        })
    }

    /// The numbered entries `prefix.0`, `prefix.1`, … of a scope's list, in order.
    pub fn list(&self, scope: &str, lang: Lang, prefix: &str) -> Vec<String> {
        (0..)
            .map_while(|i| self.get(scope, lang, &format!("{prefix}.{i}")))
            .map(str::to_string)
            .collect()
    }

    /// The right option of a prediction (`<prefix>.answer`, a letter `a`, `b`, …) and its text.
    pub fn prediction(&self, scope: &str, lang: Lang, prefix: &str) -> Option<(char, String)> {
        let letter = self
            .get(scope, lang, &format!("{prefix}.answer"))?
            .trim()
            .chars()
            .next()?
            .to_ascii_lowercase();
        let index = (letter as usize).checked_sub('a' as usize)?;
        let option = self
            .list(scope, lang, &format!("{prefix}.options"))
            .into_iter()
            .nth(index)?;
        Some((letter, option))
    }

    /// Grades a learner's answer to a prediction: `Some(true)` when it names the right option
    /// (its letter, in either case, with or without a `)`), `None` when the scope has no answer
    /// key or the learner gave none.
    pub fn grade(&self, scope: &str, lang: Lang, prefix: &str, answer: &str) -> Option<bool> {
        let (right, _) = self.prediction(scope, lang, prefix)?;
        let given = answer.trim().trim_end_matches(')').trim();
        if given.is_empty() {
            return None;
        }
        Some(given.len() == 1 && given.eq_ignore_ascii_case(&right.to_string()))
    }

    /// The keys of one scope's catalogue (used by tests that compare languages).
    pub fn keys(&self, scope: &str, lang: Lang) -> Vec<&str> {
        self.catalogs
            .get(&(scope.to_string(), lang))
            .map(|c| c.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Renders a message. A missing key renders as `⟦key⟧` rather than failing, so a typo shows
    /// up in the narrative (and in `lab check`) instead of hiding a whole run.
    pub fn render(&self, scope: &str, lang: Lang, msg: &Msg) -> String {
        let Some(template) = self.get(scope, lang, &msg.key) else {
            return format!("⟦{}⟧", msg.key);
        };
        let mut out = String::with_capacity(template.len());
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    out.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    out.push('}');
                }
                '{' => {
                    let inside: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    if let Some((name, forms)) = inside.split_once('|') {
                        match msg.args.iter().find(|(n, _)| *n == name) {
                            Some((_, Arg::Int(n))) => out.push_str(plural(lang, *n, forms)),
                            _ => {
                                let _ = write!(out, "⟦{name}⟧");
                            }
                        }
                        continue;
                    }
                    let name = inside;
                    match msg.args.iter().find(|(n, _)| *n == name) {
                        Some((_, Arg::Str(s))) => out.push_str(s),
                        Some((_, Arg::Int(n))) => {
                            let _ = write!(out, "{n}");
                        }
                        Some((_, Arg::Msg(m))) => out.push_str(&self.render(scope, lang, m)),
                        None => {
                            let _ = write!(out, "⟦{name}⟧");
                        }
                    }
                }
                c => out.push(c),
            }
        }
        out
    }
}

/// The form of a word that agrees with `n`, from `forms` separated by `|`: English one, other;
/// Russian one (1, 21, 101), few (2–4, 22–24), many (0, 5–20, 25–30, 11–14). Missing forms fall
/// back to the last one given.
fn plural(lang: Lang, n: i64, forms: &str) -> &str {
    let forms: Vec<&str> = forms.split('|').collect();
    let n = n.unsigned_abs();
    let index = match lang {
        Lang::En => usize::from(n != 1),
        Lang::Ru => match (n % 10, n % 100) {
            (1, 11) => 2,
            (1, _) => 0,
            (2..=4, 12..=14) => 2,
            (2..=4, _) => 1,
            _ => 2,
        },
    };
    forms[index.min(forms.len() - 1)]
}

/// Flattens nested tables into dotted keys; returns the offending key on a non-text value.
fn flatten(
    prefix: &str,
    value: &toml::Value,
    into: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match value {
        toml::Value::String(s) => {
            into.insert(prefix.to_string(), s.clone());
        }
        toml::Value::Table(t) => {
            for (k, v) in t {
                flatten(&join(k), v, into)?;
            }
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&join(&i.to_string()), v, into)?;
            }
        }
        _ => return Err(prefix.to_string()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> Texts {
        let mut t = Texts::new();
        t.add(COMMON, Lang::En, "ok = \"ok\"\n[worker]\na = \"worker A\"")
            .unwrap();
        t.add(
            "demo",
            Lang::En,
            "[step]\nclaim = \"{who} claims task {task} ({{json}})\"\nquiz = [\"one\", \"two\"]",
        )
        .unwrap();
        t
    }

    #[test]
    fn a_word_agrees_with_its_number_in_each_language() {
        let mut t = Texts::new();
        t.add(COMMON, Lang::En, "n = \"{n} {n|session|sessions}\"")
            .unwrap();
        t.add(
            COMMON,
            Lang::Ru,
            "n = \"{n} {n|сессия|сессии|сессий}\"\nbad = \"{n|a|b}\"",
        )
        .unwrap();
        let en = |n: i64| t.render(COMMON, Lang::En, &Msg::new("n").arg("n", n));
        let ru = |n: i64| t.render(COMMON, Lang::Ru, &Msg::new("n").arg("n", n));
        assert_eq!(en(0), "0 sessions");
        assert_eq!(en(1), "1 session");
        assert_eq!(en(2), "2 sessions");
        assert_eq!(en(11), "11 sessions");
        assert_eq!(ru(1), "1 сессия");
        assert_eq!(ru(21), "21 сессия");
        assert_eq!(ru(2), "2 сессии");
        assert_eq!(ru(24), "24 сессии");
        assert_eq!(ru(0), "0 сессий");
        assert_eq!(ru(5), "5 сессий");
        assert_eq!(ru(11), "11 сессий");
        assert_eq!(ru(12), "12 сессий");
        assert_eq!(ru(111), "111 сессий");
        assert_eq!(ru(101), "101 сессия");
        assert_eq!(
            t.render(COMMON, Lang::Ru, &Msg::new("bad").arg("n", "x")),
            "⟦n⟧",
            "a word that agrees with no number shows the name"
        );
    }

    #[test]
    fn renders_arguments_nested_messages_and_braces() {
        let msg = Msg::new("step.claim")
            .arg("who", Msg::new("worker.a"))
            .arg("task", 42);
        assert_eq!(
            texts().render("demo", Lang::En, &msg),
            "worker A claims task 42 ({json})"
        );
    }

    #[test]
    fn missing_keys_and_arguments_are_visible() {
        let t = texts();
        assert_eq!(t.render("demo", Lang::En, &Msg::new("nope")), "⟦nope⟧");
        assert_eq!(
            t.render("demo", Lang::En, &Msg::new("step.claim").arg("who", "B")),
            "B claims task ⟦task⟧ ({json})"
        );
    }

    #[test]
    fn lists_and_common_fallback() {
        let t = texts();
        assert_eq!(t.list("demo", Lang::En, "step.quiz"), vec!["one", "two"]);
        assert_eq!(t.get("demo", Lang::En, "ok"), Some("ok"));
        assert_eq!(t.get("demo", Lang::Ru, "ok"), None);
    }

    #[test]
    fn rejects_non_text_values() {
        let mut t = Texts::new();
        let err = t.add("x", Lang::En, "n = 3").unwrap_err();
        assert!(err.to_string().contains("`n`"), "{err}");
    }
}
