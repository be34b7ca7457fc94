//! The languages the lab speaks, and how the default one is picked.

use std::fmt;
use std::str::FromStr;

/// A language of the narrative. Every text exists in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lang {
    En,
    Ru,
}

impl Lang {
    /// Both languages, in the order `lab check` compares them.
    pub const ALL: [Lang; 2] = [Lang::En, Lang::Ru];

    /// The code used in flags and file names (`en`, `ru`).
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ru => "ru",
        }
    }

    /// The default when `--lang` is not given: `LAB_LANG` if set, else Russian when `LANG` starts
    /// with `ru`, else English. Without `LANG`, `LC_ALL` or `LC_MESSAGES` stand in for it.
    pub fn from_env() -> Lang {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Lang::from_env`] over any variable lookup, so it can be tested without touching the
    /// process environment.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Lang {
        if let Some(lang) = var("LAB_LANG").and_then(|v| v.parse().ok()) {
            return lang;
        }
        let locale = ["LANG", "LC_ALL", "LC_MESSAGES"]
            .iter()
            .filter_map(|name| var(name))
            .find(|value| !value.is_empty())
            .unwrap_or_default();
        if locale.starts_with("ru") {
            Lang::Ru
        } else {
            Lang::En
        }
    }
}

impl FromStr for Lang {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "en" => Ok(Lang::En),
            "ru" => Ok(Lang::Ru),
            other => Err(format!(
                "unknown language `{other}` (expected `ru` or `en`)"
            )),
        }
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(vars: &[(&str, &str)]) -> Lang {
        Lang::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn lab_lang_wins_over_locale() {
        assert_eq!(
            pick(&[("LAB_LANG", "en"), ("LANG", "ru_RU.UTF-8")]),
            Lang::En
        );
        assert_eq!(pick(&[("LAB_LANG", "ru"), ("LANG", "C.UTF-8")]), Lang::Ru);
    }

    #[test]
    fn russian_locale_means_russian() {
        assert_eq!(pick(&[("LANG", "ru_RU.UTF-8")]), Lang::Ru);
        // LANG decides, as the CLI documents; LC_ALL only stands in when LANG is unset.
        assert_eq!(
            pick(&[("LC_ALL", "C.UTF-8"), ("LANG", "ru_RU.UTF-8")]),
            Lang::Ru
        );
        assert_eq!(pick(&[("LC_ALL", "ru_RU.UTF-8")]), Lang::Ru);
        assert_eq!(pick(&[("LANG", "de_DE.UTF-8")]), Lang::En);
        assert_eq!(pick(&[]), Lang::En);
    }

    #[test]
    fn bad_lab_lang_falls_back_to_locale() {
        assert_eq!(pick(&[("LAB_LANG", "fr"), ("LANG", "ru_RU")]), Lang::Ru);
    }
}
