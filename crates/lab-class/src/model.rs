//! What travels between a learner's `lab` and the board, and the rules a post must keep.
//!
//! Everything a post carries is checked here before the store sees it: the exercise and the
//! check must be in the lab's catalogue (a forged post cannot invent a column), every string has
//! a length limit and no control characters, and a display name is short plain text. The board
//! shows names as text, never as HTML (the page sets `textContent`), so a name like
//! `<img onerror=…>` is shown exactly as typed.

use serde::{Deserialize, Serialize};

/// The largest request body the board reads (a verdict with its schedule in both languages is a
/// few KiB; the longest the exercises tell, a burst of eight requests, about 9 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The lines of a schedule, per language.
pub const MAX_SCHEDULE_LINES: usize = 80;
/// One line of a schedule.
pub const MAX_SCHEDULE_LINE_CHARS: usize = 400;
/// A display name's length, in characters.
pub const MAX_NAME_CHARS: usize = 40;
/// The invariant's words, as the learner's lab rendered them.
pub const MAX_REASON_CHARS: usize = 1_000;
/// The replay line (`lab exercise check … --only race --seed 7`).
pub const MAX_REPLAY_CHARS: usize = 600;
/// A text key such as `fail.race.two_reports`.
pub const MAX_KEY_CHARS: usize = 120;

/// `POST /api/join`: the class code the instructor put on the projector, and a display name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub code: String,
    pub name: String,
}

/// What a join gives back: the learner's own token, which every post of theirs carries. It is
/// the learner's alone: the board keeps only its SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Joined {
    pub learner: i64,
    pub name: String,
    pub token: String,
}

/// The verdicts a cell can hold. A skipped check (`--target` cannot restart a service) is not
/// a result about the learner's code, so it never reaches the board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Pass,
    Fail,
    Unknown,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::Pass => "pass",
            Kind::Fail => "fail",
            Kind::Unknown => "unknown",
        }
    }

    pub fn from_word(word: &str) -> Option<Kind> {
        match word {
            "pass" => Some(Kind::Pass),
            "fail" => Some(Kind::Fail),
            "unknown" => Some(Kind::Unknown),
            _ => None,
        }
    }
}

/// One finished check, as a learner's `lab exercise check --class` sends it: never the
/// learner's code, nor their program's output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VerdictPost {
    pub exercise: String,
    pub check: String,
    pub verdict: Kind,
    /// The invariant's text key (`fail.race.two_reports`): what the board groups failures by.
    #[serde(default)]
    pub reason_key: Option<String>,
    /// The invariant's words in both of the lab's languages, so the board shows them in its own
    /// whatever the learner's is.
    #[serde(default)]
    pub reason: Option<Reason>,
    /// The line that replays the check's schedule.
    #[serde(default)]
    pub replay: Option<String>,
    /// The schedule that broke it, told step by step as the learner's lab told it.
    #[serde(default)]
    pub schedule: Option<Schedule>,
}

/// A check's schedule, a line per step, call or rows read, in English and Russian.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    pub en: Vec<String>,
    pub ru: Vec<String>,
}

/// The words of a broken invariant (or of why a check could not decide), in English and Russian.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    pub en: String,
    pub ru: String,
}

impl Reason {
    /// The words in `lang` (`en` or `ru`; English for any other).
    pub fn of(&self, lang: &str) -> &str {
        if lang == "ru" { &self.ru } else { &self.en }
    }
}

/// `POST /api/verified`: a verdict the instructor's own `lab class verify` reached.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifiedPost {
    /// The learner's display name, as the board shows it.
    pub learner: String,
    pub verdict: VerdictPost,
}

/// Why a request is refused (a 400 with these words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// A display name, trimmed: 1 to [`MAX_NAME_CHARS`] characters, none of them a control
/// character.
pub fn display_name(given: &str) -> Result<String, Invalid> {
    let name = given.trim();
    let chars = name.chars().count();
    if chars == 0 {
        return Err(Invalid("the name is empty".into()));
    }
    if chars > MAX_NAME_CHARS {
        return Err(Invalid(format!(
            "the name has {chars} characters; at most {MAX_NAME_CHARS}"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Invalid("the name has a control character".into()));
    }
    Ok(name.to_string())
}

fn text(field: &str, value: &Option<String>, max: usize) -> Result<(), Invalid> {
    let Some(value) = value else { return Ok(()) };
    let chars = value.chars().count();
    if chars > max {
        return Err(Invalid(format!(
            "{field} has {chars} characters; at most {max}"
        )));
    }
    // Line breaks are the only control characters the lab's own words use.
    if value.chars().any(|c| c.is_control() && c != '\n') {
        return Err(Invalid(format!("{field} has a control character")));
    }
    Ok(())
}

impl VerdictPost {
    /// Whether the post names a real exercise and check and keeps every limit.
    pub fn validate(&self) -> Result<(), Invalid> {
        let exercise = lab_exercises::find(&self.exercise)
            .ok_or_else(|| Invalid(format!("no exercise `{}`", short(&self.exercise))))?;
        if !exercise.checks().any(|check| check.name == self.check) {
            return Err(Invalid(format!(
                "{} has no check `{}`",
                exercise.name,
                short(&self.check)
            )));
        }
        if let Some(key) = &self.reason_key
            && (key.len() > MAX_KEY_CHARS
                || key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(Invalid(
                "reason_key is a text key: letters, digits, `_`, `.` and `-`".into(),
            ));
        }
        if let Some(reason) = &self.reason {
            text("reason.en", &Some(reason.en.clone()), MAX_REASON_CHARS)?;
            text("reason.ru", &Some(reason.ru.clone()), MAX_REASON_CHARS)?;
        }
        text("replay", &self.replay, MAX_REPLAY_CHARS)?;
        if let Some(schedule) = &self.schedule {
            for lines in [&schedule.en, &schedule.ru] {
                if lines.len() > MAX_SCHEDULE_LINES {
                    return Err(Invalid(format!(
                        "the schedule has {} lines; at most {MAX_SCHEDULE_LINES}",
                        lines.len()
                    )));
                }
                for line in lines {
                    text(
                        "a schedule's line",
                        &Some(line.clone()),
                        MAX_SCHEDULE_LINE_CHARS,
                    )?;
                    if line.contains('\n') {
                        return Err(Invalid("a schedule's line has a line break".into()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A value the learner sent, cut for an error message.
fn short(value: &str) -> String {
    let mut cut: String = value.chars().take(40).filter(|c| !c.is_control()).collect();
    if value.chars().count() > 40 {
        cut.push('…');
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post() -> VerdictPost {
        VerdictPost {
            exercise: "report-api".into(),
            check: "race".into(),
            verdict: Kind::Fail,
            reason_key: Some("fail.race.two_reports".into()),
            reason: Some(Reason {
                en: "two reports for one key".into(),
                ru: "два отчёта на один ключ".into(),
            }),
            replay: Some("lab exercise check report-api --only race --seed 7".into()),
            schedule: Some(Schedule {
                en: vec!["1. Two requests with one key, at once.".into()],
                ru: vec!["1. Два запроса с одним ключом, одновременно.".into()],
            }),
        }
    }

    #[test]
    fn a_post_names_a_real_check_and_keeps_its_limits() {
        assert_eq!(post().validate(), Ok(()));
        let unknown_exercise = VerdictPost {
            exercise: "nope".into(),
            ..post()
        };
        assert!(unknown_exercise.validate().is_err());
        let unknown_check = VerdictPost {
            check: "<script>".into(),
            ..post()
        };
        assert!(unknown_check.validate().is_err());
        let long_reason = VerdictPost {
            reason: Some(Reason {
                en: "x".into(),
                ru: "я".repeat(MAX_REASON_CHARS + 1),
            }),
            ..post()
        };
        assert!(long_reason.validate().is_err());
        let odd_key = VerdictPost {
            reason_key: Some("a key with spaces".into()),
            ..post()
        };
        assert!(odd_key.validate().is_err());
        let long_schedule = VerdictPost {
            schedule: Some(Schedule {
                en: vec!["a line".into(); MAX_SCHEDULE_LINES + 1],
                ru: Vec::new(),
            }),
            ..post()
        };
        assert!(long_schedule.validate().is_err());
        let escape = VerdictPost {
            replay: Some("lab \u{1b}[2J".into()),
            ..post()
        };
        assert!(escape.validate().is_err());
    }

    #[test]
    fn a_name_is_short_plain_text() {
        assert_eq!(display_name("  Аня  "), Ok("Аня".to_string()));
        assert_eq!(
            display_name("<img src=x onerror=alert(1)>"),
            Ok("<img src=x onerror=alert(1)>".to_string())
        );
        assert!(display_name("   ").is_err());
        assert!(display_name(&"я".repeat(MAX_NAME_CHARS + 1)).is_err());
        assert!(display_name("Ann\u{0}").is_err());
    }

    #[test]
    fn a_post_with_a_field_the_board_does_not_know_is_refused() {
        let with_code: Result<VerdictPost, _> = serde_json::from_str(
            r#"{"exercise":"report-api","check":"race","verdict":"pass","code":"print(1)"}"#,
        );
        assert!(with_code.is_err());
        let skipped: Result<VerdictPost, _> =
            serde_json::from_str(r#"{"exercise":"report-api","check":"race","verdict":"skipped"}"#);
        assert!(skipped.is_err());
    }
}
