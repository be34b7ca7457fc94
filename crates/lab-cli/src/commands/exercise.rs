//! `lab exercise`: list, start, check, hint, solution, verify. The engine is `lab-exercises`;
//! this module turns its reports into text (in the learner's language), JSON lines or JUnit,
//! and its verdicts into exit codes.

use std::path::{Path, PathBuf};

use colored::Colorize;
use lab_core::{Lang, Msg, Texts};
use lab_exercises::state::{self, Progress};
use lab_exercises::{
    CheckOptions, CheckReport, Checked, Exercise, Line, NotReady, Subject, Verdict,
};
use lab_infra::Needs;
use lab_scenarios::Library;

use crate::cli::ExerciseCommand;
use crate::exit::{self, Failure};
use crate::session::{Format, Mode, Session, SessionOptions};

/// How `check` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    Junit,
}

/// The words of the exercises, rendered in one language.
struct Words {
    texts: Texts,
    lang: Lang,
    color: bool,
    /// Draw a failed check's calls as lanes (`--diagram`).
    diagram: bool,
}

impl Words {
    fn new(options: &SessionOptions) -> Result<Words, Failure> {
        let texts = lab_exercises::texts().map_err(Failure::environment)?;
        Ok(Words {
            texts,
            lang: options.lang,
            color: options.color,
            diagram: false,
        })
    }

    /// A shared word (`exercises/common/*.toml`).
    fn common(&self, msg: impl Into<Msg>) -> String {
        self.texts
            .render(lab_exercises::COMMON, self.lang, &msg.into())
    }

    /// A word of one exercise.
    fn of(&self, exercise: &Exercise, msg: &Msg) -> String {
        self.texts.render(exercise.name, self.lang, msg)
    }

    /// A verdict's word, padded to the longest of the four in this language (before colour,
    /// which would count as width).
    fn verdict(&self, verdict: &Verdict) -> String {
        let width = ["pass", "fail", "unknown", "skipped"]
            .iter()
            .map(|w| {
                self.common(Msg::new(format!("verdict.{w}")))
                    .chars()
                    .count()
            })
            .max()
            .unwrap_or(0);
        let word = self.common(Msg::new(format!("verdict.{}", verdict.word())));
        let word = format!("{word:<width$}");
        if !self.color {
            return word;
        }
        match verdict {
            Verdict::Pass => word.green().bold().to_string(),
            Verdict::Fail(_) => word.red().bold().to_string(),
            Verdict::Unknown(_) => word.yellow().bold().to_string(),
            Verdict::Skipped(_) => word.dimmed().to_string(),
        }
    }
}

fn exercise(name: &str) -> Result<&'static Exercise, Failure> {
    lab_exercises::find(name).ok_or_else(|| {
        Failure::usage(lab_exercises::ExerciseError::Unknown(name.to_string()).to_string())
    })
}

fn default_dir(name: &str) -> PathBuf {
    PathBuf::from("lab-exercises").join(name)
}

fn check_lang(exercise: &Exercise, lang: &str) -> Result<(), Failure> {
    if exercise.langs.contains(&lang) {
        return Ok(());
    }
    Err(Failure::usage(
        lab_exercises::ExerciseError::NoLang {
            exercise: exercise.name.to_string(),
            lang: lang.to_string(),
            has: exercise.langs.join(", "),
        }
        .to_string(),
    ))
}

/// Runs `lab exercise …`.
pub async fn exercise_command(
    options: SessionOptions,
    library: Result<Library, Failure>,
    command: &ExerciseCommand,
    junit: bool,
) -> Result<u8, Failure> {
    let mut words = Words::new(&options)?;
    match command {
        ExerciseCommand::List => list(&words),
        ExerciseCommand::Start {
            name,
            dir,
            language: lang,
        }
        | ExerciseCommand::Solution {
            name,
            dir,
            language: lang,
        } => {
            let exercise = exercise(name)?;
            check_lang(exercise, lang)?;
            let dir = dir.clone().unwrap_or_else(|| default_dir(name));
            if matches!(command, ExerciseCommand::Start { .. }) {
                start(&words, exercise, lang, &dir)
            } else {
                solution(&words, exercise, lang, &dir)
            }
        }
        ExerciseCommand::Hint { name, level } => {
            let exercise = exercise(name)?;
            let key = format!("hint.{level}");
            match words.texts.get(exercise.name, words.lang, &key) {
                Some(_) => say!("{}", words.of(exercise, &Msg::new(key))),
                None => say!(
                    "{}",
                    words.common(
                        Msg::new("hint.none")
                            .arg("level", i64::from(*level))
                            .arg("exercise", exercise.name)
                            .arg("count", 3)
                    )
                ),
            }
            Ok(exit::OK)
        }
        ExerciseCommand::Check {
            name,
            dir,
            target,
            only,
            seed,
            repeat,
            diagram,
        } => {
            words.diagram = *diagram;
            let exercise = exercise(name)?;
            known_checks(exercise, only)?;
            let subject = match target {
                Some(url) => Subject::Target { url: url.clone() },
                None => {
                    let dir = dir.clone().unwrap_or_else(|| default_dir(name));
                    let manifest = lab_exercises::Manifest::read(&dir).map_err(failure)?;
                    if manifest.exercise != exercise.name {
                        return Err(Failure::usage(format!(
                            "{} holds the exercise `{}`, not `{}`",
                            dir.display(),
                            manifest.exercise,
                            exercise.name
                        )));
                    }
                    Subject::Program { dir, manifest }
                }
            };
            let check_options = CheckOptions {
                only: only.clone(),
                seed: seed.unwrap_or_else(clock_seed),
                repeat: *repeat,
                guest_env: Vec::new(),
            };
            let output = match (junit, options.format) {
                (true, _) => Output::Junit,
                (false, Format::Json) => Output::Json,
                (false, Format::Text) => Output::Text,
            };
            let session = Session::open(options, library?, Mode::Headless);
            check(&session, &words, exercise, subject, &check_options, output).await
        }
        ExerciseCommand::Watch {
            name,
            dir,
            only,
            seed,
            repeat,
        } => {
            let exercise = exercise(name)?;
            known_checks(exercise, only)?;
            let dir = dir.clone().unwrap_or_else(|| default_dir(name));
            let manifest = lab_exercises::Manifest::read(&dir).map_err(failure)?;
            let check_options = CheckOptions {
                only: only.clone(),
                seed: seed.unwrap_or_else(clock_seed),
                repeat: *repeat,
                guest_env: Vec::new(),
            };
            let session = Session::open(options, library?, Mode::Headless);
            watch(&session, &words, exercise, dir, manifest, &check_options).await
        }
        ExerciseCommand::Verify {
            name,
            seeds,
            python_venv,
        } => {
            let exercises: Vec<&'static Exercise> = match name {
                Some(name) => vec![exercise(name)?],
                None => lab_exercises::EXERCISES.to_vec(),
            };
            let session = Session::open(options, library?, Mode::Headless);
            verify(&session, &words, &exercises, *seeds, python_venv.as_deref()).await
        }
    }
}

/// Every `--only` names a check of the exercise.
fn known_checks(exercise: &Exercise, only: &[String]) -> Result<(), Failure> {
    for check in only {
        if exercise.check(check).is_none() {
            let names: Vec<_> = exercise.checks.iter().map(|c| c.name).collect();
            return Err(Failure::usage(format!(
                "{} has no check `{check}` (it has: {})",
                exercise.name,
                names.join(", ")
            )));
        }
    }
    Ok(())
}

/// A seed from the clock, for a check run that was given none (printed in its replay lines).
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn list(words: &Words) -> Result<u8, Failure> {
    say!("{}", words.common("list.heading"));
    // One column for the names, as wide as the longest.
    let width = lab_exercises::EXERCISES
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(0);
    for exercise in lab_exercises::EXERCISES {
        let checks: Vec<&str> = exercise.checks.iter().map(|c| c.name).collect();
        let progress = match state::progress(&default_dir(exercise.name), &checks) {
            Progress::NotStarted => words.common("progress.not_started"),
            Progress::Started => words.common("progress.started"),
            Progress::Failing { failing, of } => words.common(
                Msg::new("progress.failing")
                    .arg("failing", failing)
                    .arg("of", of),
            ),
            Progress::Passed => words.common("progress.passed"),
        };
        say!(
            "  {:<width$} {} · {} · {}",
            exercise.name,
            words.common(Msg::new(format!("lesson.{}", exercise.lesson))),
            exercise.langs.join(", "),
            progress
        );
        say!(
            "  {:width$} {}",
            "",
            words.of(exercise, &Msg::new("summary"))
        );
    }
    Ok(exit::OK)
}

fn start(words: &Words, exercise: &Exercise, lang: &str, dir: &Path) -> Result<u8, Failure> {
    let written =
        lab_exercises::files::write_side(exercise.name, lang, "starter", dir).map_err(failure)?;
    let shown = dir.display().to_string();
    say!(
        "{}",
        words.common(
            Msg::new("start.written")
                .arg("count", written.len())
                .arg("dir", shown.as_str())
        )
    );
    if lang == "python" {
        say!(
            "  {}",
            words.common(Msg::new("start.python_setup").arg("dir", shown.as_str()))
        );
    }
    say!(
        "  {}",
        words.common(
            Msg::new("start.check")
                .arg("exercise", exercise.name)
                .arg("dir", shown.as_str())
        )
    );
    say!(
        "{}",
        words.common(Msg::new("start.readme").arg("dir", shown.as_str()))
    );
    Ok(exit::OK)
}

fn solution(words: &Words, exercise: &Exercise, lang: &str, dir: &Path) -> Result<u8, Failure> {
    let mut beside = dir.as_os_str().to_owned();
    beside.push("-solution");
    let beside = PathBuf::from(beside);
    lab_exercises::files::write_side(exercise.name, lang, "solution", &beside).map_err(failure)?;
    say!(
        "{}",
        words.common(Msg::new("solution.written").arg("dir", beside.display().to_string()))
    );
    Ok(exit::OK)
}

/// The exit code of a set of verdicts: a failure wins over an undecided check.
fn exit_code(reports: &[CheckReport]) -> u8 {
    if reports
        .iter()
        .any(|r| matches!(r.verdict, Verdict::Fail(_)))
    {
        exit::DRIFT
    } else if reports
        .iter()
        .any(|r| matches!(r.verdict, Verdict::Unknown(_)))
    {
        exit::UNDECIDED
    } else {
        exit::OK
    }
}

async fn check(
    session: &Session,
    words: &Words,
    exercise: &'static Exercise,
    subject: Subject,
    options: &CheckOptions,
    output: Output,
) -> Result<u8, Failure> {
    session
        .run_with_servers(exercise.needs, async |servers| {
            check_once(servers, words, exercise, subject, options, output).await
        })
        .await
}

/// One check run on servers already up: its heading, a report per check as each ends, the
/// learner's progress recorded, the summary; its exit code.
async fn check_once(
    servers: &lab_infra::Servers,
    words: &Words,
    exercise: &'static Exercise,
    subject: Subject,
    options: &CheckOptions,
    output: Output,
) -> Result<u8, Failure> {
    let program_dir = match &subject {
        Subject::Program { dir, .. } => Some(dir.clone()),
        Subject::Target { .. } => None,
    };
    if output == Output::Text {
        let shown = match &subject {
            Subject::Program { dir, manifest } => words.common(
                Msg::new("check.subject_program")
                    .arg("dir", dir.display().to_string())
                    .arg("lang", manifest.lang.as_str()),
            ),
            Subject::Target { url } => {
                words.common(Msg::new("check.subject_target").arg("url", url.as_str()))
            }
        };
        say!(
            "{}",
            words.common(
                Msg::new("check.heading")
                    .arg("exercise", exercise.name)
                    .arg("subject", shown)
            )
        );
    }
    let replay_base = match &subject {
        Subject::Program { dir, .. } => {
            format!("lab exercise check {} {}", exercise.name, dir.display())
        }
        Subject::Target { url } => format!("lab exercise check {} --target {url}", exercise.name),
    };
    let mut print = |report: &CheckReport| match output {
        Output::Text => print_text(words, exercise, report, &replay_base),
        Output::Json => print_json(words, exercise, report, &replay_base),
        Output::Junit => {}
    };
    let checked = lab_exercises::check(exercise, subject, servers, options, &mut print)
        .await
        .map_err(failure)?;
    let reports = match checked {
        Checked::Reports(reports) => reports,
        Checked::NotReady(not_ready) => {
            print_not_ready(words, &not_ready);
            return Ok(exit::UNDECIDED);
        }
    };
    if let Some(dir) = &program_dir {
        let verdicts: Vec<(&str, &str)> =
            reports.iter().map(|r| (r.name, r.verdict.word())).collect();
        // Progress is a convenience: a read-only folder does not fail the check.
        let _ = state::State::record(dir, &verdicts);
    }
    match output {
        Output::Text => print_summary(words, &reports),
        Output::Json => {}
        Output::Junit => print_junit(words, exercise, &reports, &replay_base)?,
    }
    Ok(exit_code(&reports))
}

/// Whether a change to `path` is the learner's: not a virtual environment, a build's output,
/// bytecode, an editor's swap file, the lockfile a build rewrites, or the lab's own state file.
fn learners_change(path: &Path) -> bool {
    const IGNORED_DIRS: &[&str] = &[".venv", "target", "__pycache__", ".git", "node_modules"];
    if path
        .components()
        .any(|c| IGNORED_DIRS.iter().any(|d| c.as_os_str() == *d))
    {
        return false;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    !(name == state::FILE
        || name == "Cargo.lock"
        || name.ends_with(".pyc")
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.starts_with(".#"))
}

/// How long a burst of changes (an editor's save: a temporary file, a rename) settles before
/// the re-check: one check for one save.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// `lab exercise watch`: checks, then checks again whenever a file of the exercise changes,
/// on one set of servers, with a footer of keys (h a hint, r re-check, q quit), as rustlings'
/// watch mode. The keys are read a line at a time (a letter, then Enter).
async fn watch(
    session: &Session,
    words: &Words,
    exercise: &'static Exercise,
    dir: PathBuf,
    manifest: lab_exercises::Manifest,
    options: &CheckOptions,
) -> Result<u8, Failure> {
    use notify::Watcher as _;
    use tokio::io::AsyncBufReadExt as _;
    let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && !event.kind.is_access()
            && event.paths.iter().any(|p| learners_change(p))
        {
            let _ = changed.send(());
        }
    })
    .map_err(Failure::environment)?;
    watcher
        .watch(&dir, notify::RecursiveMode::Recursive)
        .map_err(Failure::environment)?;
    let mut keys = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut keys_open = true;
    let mut hint = 0;
    session
        .run_with_servers(exercise.needs, async |servers| {
            loop {
                let subject = Subject::Program {
                    dir: dir.clone(),
                    manifest: manifest.clone(),
                };
                check_once(servers, words, exercise, subject, options, Output::Text).await?;
                // What a run writes itself (bytecode, a build, the state file) is filtered out by
                // `learners_change`; a save that came during the run is kept, and checks again.
                crate::output::drained().await;
                eprintln!(
                    "{}",
                    words.common(Msg::new("watch.footer").arg("dir", dir.display().to_string()))
                );
                loop {
                    tokio::select! {
                        Some(()) = changes.recv() => {
                            tokio::time::sleep(SETTLE).await;
                            while changes.try_recv().is_ok() {}
                            break;
                        }
                        line = keys.next_line(), if keys_open => match line {
                            Ok(Some(line)) => match line.trim() {
                                "q" => return Ok(exit::OK),
                                "r" | "" => break,
                                "h" => {
                                    hint = hint % 3 + 1;
                                    say!("{}", words.of(exercise, &Msg::new(format!("hint.{hint}"))));
                                    crate::output::drained().await;
                                }
                                _ => {}
                            },
                            // No more keys (stdin closed): files alone drive it now.
                            _ => keys_open = false,
                        },
                    }
                }
            }
        })
        .await
}

/// An engine error as the CLI reports it: the learner's own mistakes (no manifest, a build that
/// fails, a folder that is taken) are usage; the rest is the environment.
fn failure(e: lab_exercises::ExerciseError) -> Failure {
    use lab_exercises::ExerciseError as E;
    match e {
        E::Infra(infra) => infra.into(),
        e @ (E::Unknown(_)
        | E::NoLang { .. }
        | E::Exists(_)
        | E::NoManifest(_)
        | E::Manifest { .. }
        | E::Target(_)) => Failure::usage(e.to_string()),
        e => Failure::environment(e),
    }
}

fn replay_line(report: &CheckReport, base: &str) -> String {
    match report.seed {
        Some(seed) => format!("{base} --only {} --seed {seed}", report.name),
        None => format!("{base} --only {}", report.name),
    }
}

fn outcome_word(words: &Words, outcome: lab_exercises::Outcome) -> String {
    words.common(Msg::new(format!("outcome.{}", outcome.word())))
}

/// The schedule of a check, as lines of text.
fn schedule_lines(words: &Words, exercise: &Exercise, report: &CheckReport) -> Vec<String> {
    let mut lines = Vec::new();
    let mut step = 0;
    for line in &report.schedule {
        match line {
            Line::Step(msg) => {
                step += 1;
                lines.push(format!("{step}. {}", words.of(exercise, msg)));
            }
            Line::Call(call) => {
                let key = match &call.key {
                    Some(key) => format!("  Idempotency-Key: {}", shown_key(words, key)),
                    None => String::new(),
                };
                let sender = words.of(exercise, &lab_exercises::verdict::who(&call.who));
                lines.push(format!(
                    "   {sender} → POST {}{key}  {}",
                    call.path, call.body
                ));
                let answer = match call.status {
                    Some(status) => format!("{status} {}", call.answer),
                    None => call.answer.clone(),
                };
                lines.push(format!(
                    "   ← {answer}  ({})",
                    outcome_word(words, call.outcome)
                ));
            }
            Line::Task(task) => {
                let report = task
                    .report_id
                    .map_or_else(|| "NULL".to_string(), |id| id.to_string());
                let lease = words.common(if task.leased {
                    "check.leased"
                } else {
                    "check.not_leased"
                });
                lines.push(format!(
                    "   {}",
                    words.common(
                        Msg::new("check.task")
                            .arg("task", task.id)
                            .arg("status", task.status.as_str())
                            .arg("attempts", i64::from(task.attempts))
                            .arg("report", report)
                            .arg("lease", lease)
                    )
                ));
            }
            Line::Charges { order, charges } => {
                let msg = if charges.is_empty() {
                    Msg::new("check.no_charges").arg("order", order.as_str())
                } else {
                    let shown: Vec<String> = charges
                        .iter()
                        .map(|c| {
                            let key = c
                                .key
                                .as_deref()
                                .map_or_else(|| words.common("check.no_key"), str::to_string);
                            format!("{} ({} RUB, {key})", c.charge_id, money(c.amount))
                        })
                        .collect();
                    Msg::new("check.charges")
                        .arg("order", order.as_str())
                        .arg("charges", shown.join(", "))
                };
                lines.push(format!("   {}", words.common(msg)));
            }
            Line::Rows { task_id, rows } => {
                if rows.is_empty() {
                    lines.push(format!(
                        "   {}",
                        words.common(Msg::new("check.no_rows").arg("task", *task_id))
                    ));
                } else {
                    let shown: Vec<String> = rows
                        .iter()
                        .map(|r| match &r.idempotency_key {
                            Some(key) => format!("#{} ({}, {key})", r.id, r.report_type),
                            None => format!(
                                "#{} ({}, {})",
                                r.id,
                                r.report_type,
                                words.common("check.no_key")
                            ),
                        })
                        .collect();
                    lines.push(format!(
                        "   {}",
                        words.common(
                            Msg::new("check.rows")
                                .arg("task", *task_id)
                                .arg("rows", shown.join(", "))
                        )
                    ));
                }
            }
        }
    }
    lines
}

/// Kopecks as roubles: 1990 → 19.90.
fn money(kopecks: i64) -> String {
    format!("{}.{:02}", kopecks / 100, kopecks % 100)
}

/// A key as a schedule shows it: quoted (an empty or blank key must be visible), and a long
/// one cut, with its length.
fn shown_key(words: &Words, key: &str) -> String {
    const SHOWN: usize = 40;
    if key.chars().count() <= SHOWN {
        return format!("{key:?}");
    }
    let start: String = key.chars().take(SHOWN).collect();
    let length = words.common(Msg::new("check.key_length").arg("n", key.chars().count()));
    format!("\"{start}…\" {length}")
}

/// The calls of a schedule as lanes, one per caller and one for the service, time going down:
/// `●──▶` a call, `◀──●` an answer, `◀┄┄✗` an answer that never arrived (as `lab run
/// --diagram` draws a scenario).
fn lanes(words: &Words, exercise: &Exercise, report: &CheckReport) -> Vec<String> {
    const LANE: usize = 4;
    let mut callers: Vec<&str> = Vec::new();
    for line in &report.schedule {
        if let Line::Call(call) = line
            && !callers.contains(&call.who.as_str())
        {
            callers.push(&call.who);
        }
    }
    if callers.is_empty() {
        return Vec::new();
    }
    let service = callers.len();
    let mut out = Vec::new();
    let mut names: Vec<String> = callers
        .iter()
        .map(|who| words.of(exercise, &lab_exercises::verdict::who(who)))
        .collect();
    names.push(words.common("diagram.service"));
    for (i, name) in names.iter().enumerate() {
        out.push(format!("{}┌ {name}", "│   ".repeat(i)));
    }
    let blank = || -> Vec<char> {
        (0..=service * LANE)
            .map(|i| if i % LANE == 0 { '│' } else { ' ' })
            .collect()
    };
    let mut step = 0;
    for line in &report.schedule {
        match line {
            Line::Step(_) => {
                step += 1;
                out.push(format!("{}  {step}.", blank().iter().collect::<String>()));
            }
            Line::Call(call) => {
                let at = callers.iter().position(|c| *c == call.who).unwrap_or(0);
                let mut cells = blank();
                cells[at * LANE] = '●';
                for cell in &mut cells[at * LANE + 1..service * LANE - 1] {
                    *cell = '─';
                }
                cells[service * LANE - 1] = '▶';
                let key = call
                    .key
                    .as_deref()
                    .map(|k| format!(" {}", shown_key(words, k)));
                out.push(format!(
                    "{}  POST {}{}",
                    cells.iter().collect::<String>(),
                    call.path,
                    key.unwrap_or_default()
                ));
                let mut cells = blank();
                cells[at * LANE + 1] = '◀';
                let (fill, end) = match call.status {
                    Some(_) => ('─', '●'),
                    None => ('┄', '✗'),
                };
                for cell in &mut cells[at * LANE + 2..service * LANE] {
                    *cell = fill;
                }
                cells[service * LANE] = end;
                let answer = call
                    .status
                    .map_or_else(|| call.answer.clone(), |s| s.to_string());
                out.push(format!(
                    "{}  {answer} ({})",
                    cells.iter().collect::<String>(),
                    outcome_word(words, call.outcome)
                ));
            }
            Line::Rows { .. } | Line::Task(_) | Line::Charges { .. } => {}
        }
    }
    out
}

fn print_text(words: &Words, exercise: &Exercise, report: &CheckReport, replay_base: &str) {
    let title = words.of(exercise, &Msg::new(format!("check.{}.title", report.name)));
    // One column for the check names, as wide as the exercise's longest.
    let width = exercise
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    say!(
        "  {} {:<width$} {title}",
        words.verdict(&report.verdict),
        report.name
    );
    let Some(reason) = report.verdict.reason() else {
        return;
    };
    let label = match report.verdict {
        Verdict::Fail(_) => words.common("check.broke"),
        _ => words.common("check.why"),
    };
    say!("      {label} {}", words.of(exercise, reason));
    if matches!(report.verdict, Verdict::Skipped(_)) {
        return;
    }
    for line in schedule_lines(words, exercise, report) {
        say!("      {line}");
    }
    if words.diagram {
        for line in lanes(words, exercise, report) {
            say!("      {line}");
        }
    }
    say!(
        "      {} {}",
        words.common("check.replay"),
        replay_line(report, replay_base)
    );
    if let Some(output) = &report.output {
        say!("      {}", words.common("check.output"));
        for line in output.lines() {
            say!("        | {line}");
        }
    }
}

fn print_json(words: &Words, exercise: &Exercise, report: &CheckReport, replay_base: &str) {
    let schedule: Vec<serde_json::Value> = report
        .schedule
        .iter()
        .map(|line| match line {
            Line::Step(msg) => serde_json::json!({"step": words.of(exercise, msg)}),
            Line::Call(call) => serde_json::json!({"call": call}),
            Line::Rows { task_id, rows } => {
                serde_json::json!({"rows": {"task_id": task_id, "reports": rows}})
            }
            Line::Task(task) => serde_json::json!({"task": task}),
            Line::Charges { order, charges } => {
                serde_json::json!({"charges": {"order_id": order, "charges": charges}})
            }
        })
        .collect();
    let value = serde_json::json!({
        "exercise": exercise.name,
        "check": report.name,
        "verdict": report.verdict.word(),
        "reason": report.verdict.reason().map(|m| words.of(exercise, m)),
        "schedule": schedule,
        "seed": report.seed,
        "replay": replay_line(report, replay_base),
        "output": report.output,
    });
    say!("{value}");
}

fn print_summary(words: &Words, reports: &[CheckReport]) {
    let count = |word: &str| reports.iter().filter(|r| r.verdict.word() == word).count();
    say!(
        "{}",
        words.common(
            Msg::new("check.summary")
                .arg("passed", count("pass"))
                .arg("failed", count("fail"))
                .arg("unknown", count("unknown"))
                .arg("skipped", count("skipped"))
                .arg("total", reports.len())
        )
    );
}

fn print_junit(
    words: &Words,
    exercise: &Exercise,
    reports: &[CheckReport],
    replay_base: &str,
) -> Result<(), Failure> {
    use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus};
    let mut suite = quick_junit::TestSuite::new(format!("exercise {}", exercise.name));
    for report in reports {
        let status = match &report.verdict {
            Verdict::Pass => TestCaseStatus::success(),
            Verdict::Skipped(reason) => {
                let mut skipped = TestCaseStatus::skipped();
                skipped.set_message(words.of(exercise, reason));
                skipped
            }
            Verdict::Fail(reason) | Verdict::Unknown(reason) => {
                let kind = if matches!(report.verdict, Verdict::Fail(_)) {
                    NonSuccessKind::Failure
                } else {
                    NonSuccessKind::Error
                };
                let mut failed = TestCaseStatus::non_success(kind);
                failed.set_message(words.of(exercise, reason));
                let mut description = schedule_lines(words, exercise, report).join("\n");
                description.push_str(&format!("\nreplay: {}", replay_line(report, replay_base)));
                failed.set_description(description);
                failed
            }
        };
        let mut case = TestCase::new(report.name, status);
        case.set_classname(format!("lab.exercise.{}", exercise.name));
        suite.add_test_case(case);
    }
    let mut junit = quick_junit::Report::new(format!("lab exercise check {}", exercise.name));
    junit.add_test_suite(suite);
    let xml = junit
        .to_string()
        .map_err(|e| Failure::environment(anyhow::anyhow!("JUnit: {e}")))?;
    say!("{xml}");
    Ok(())
}

fn print_not_ready(words: &Words, not_ready: &NotReady) {
    let (said, output) = match not_ready {
        NotReady::Exited {
            status,
            output,
            port,
        } => (
            words.common(
                Msg::new("check.not_ready_exited")
                    .arg("status", status.as_str())
                    .arg("port", i64::from(*port)),
            ),
            output,
        ),
        NotReady::Silent {
            waited,
            output,
            port,
        } => (
            words.common(
                Msg::new("check.not_ready_silent")
                    .arg("port", i64::from(*port))
                    .arg("seconds", waited.as_secs() as i64),
            ),
            output,
        ),
    };
    say!("{said}");
    if output.trim().is_empty() {
        say!("  {}", words.common("check.no_output"));
    }
    for line in output.lines() {
        say!("  | {line}");
    }
}

/// What `verify` expects of one check: the starter fails its TODOs' checks and passes the rest;
/// the solution passes all.
fn expected(exercise: &Exercise, side: &str, check: &str) -> &'static str {
    if side == "starter" && exercise.starter_fails.contains(&check) {
        "fail"
    } else {
        "pass"
    }
}

async fn verify(
    session: &Session,
    words: &Words,
    exercises: &[&'static Exercise],
    seeds: u32,
    python_venv: Option<&Path>,
) -> Result<u8, Failure> {
    say!(
        "{}",
        words.common(Msg::new("verify.heading").arg("seeds", i64::from(seeds)))
    );
    let mut bad = 0;
    for exercise in exercises {
        bad += readme_disagreements(words, exercise);
    }
    let scratch = tempfile::tempdir().map_err(Failure::environment)?;
    let mut runs = 0;
    let needs = exercises
        .iter()
        .fold(Needs::default(), |needs, e| needs.union(e.needs));
    session
        .run_with_servers(needs, async |servers| {
            for exercise in exercises {
                for lang in exercise.langs {
                    for side in ["starter", "solution"] {
                        let project = Project {
                            exercise,
                            lang,
                            side,
                            dir: scratch
                                .path()
                                .join(format!("{}-{lang}-{side}", exercise.name)),
                        };
                        // One Cargo target folder per side, shared by the exercises (their
                        // crates have different names), so the dependencies build once per
                        // side. Never one for a starter and its solution: they are one crate
                        // (one name, one version) in two folders, and Cargo, which hashes a
                        // workspace's own crate by its path inside the workspace, would take
                        // one's build for the other's.
                        let target = scratch.path().join(format!("cargo-target-{side}"));
                        let env =
                            vec![("CARGO_TARGET_DIR".to_string(), target.display().to_string())];
                        let (disagreements, checked) =
                            verify_project(servers, words, &project, seeds, python_venv, env)
                                .await?;
                        bad += disagreements;
                        runs += checked;
                    }
                }
                // The payment service's solutions in both languages, on one Redis.
                if exercise.name == lab_exercises::charge_once::EXERCISE.name {
                    bad += verify_cross_replay(servers, words, exercise, scratch.path()).await?;
                    runs += 1;
                }
            }
            Ok(())
        })
        .await?;
    say!(
        "{}",
        words.common(
            Msg::new("verify.summary")
                .arg("bad", bad as i64)
                .arg("runs", runs as i64)
        )
    );
    Ok(if bad == 0 { exit::OK } else { exit::DRIFT })
}

/// The Python and the Rust solution of `exercise`, as `verify` wrote them, on one Redis:
/// each replays the other's Charges (`idem` is wire-compatible with idempotency-kit). One
/// disagreement if they do not.
async fn verify_cross_replay(
    servers: &lab_infra::Servers,
    words: &Words,
    exercise: &'static Exercise,
    scratch: &Path,
) -> Result<usize, Failure> {
    let side = |lang: &str| -> Result<(PathBuf, lab_exercises::Manifest), Failure> {
        let dir = scratch.join(format!("{}-{lang}-solution", exercise.name));
        let manifest = lab_exercises::Manifest::read(&dir).map_err(failure)?;
        Ok((dir, manifest))
    };
    let env = vec![(
        "CARGO_TARGET_DIR".to_string(),
        scratch.join("cargo-target-solution").display().to_string(),
    )];
    let checked = lab_exercises::cross_replay(servers, side("python")?, side("rust")?, &env)
        .await
        .map_err(failure)?;
    let report = match checked {
        Checked::Reports(mut reports) => reports.remove(0),
        Checked::NotReady(not_ready) => {
            print_not_ready(words, &not_ready);
            return Ok(1);
        }
    };
    let title = words.of(exercise, &Msg::new(format!("check.{}.title", report.name)));
    say!("  {} {title}", words.verdict(&report.verdict));
    if matches!(report.verdict, Verdict::Pass) {
        return Ok(0);
    }
    if let Some(reason) = report.verdict.reason() {
        say!("      {}", words.of(exercise, reason));
    }
    for line in schedule_lines(words, exercise, &report) {
        say!("      {line}");
    }
    Ok(1)
}

/// The checks an exercise's READMEs do not name (each one is a disagreement, said).
fn readme_disagreements(words: &Words, exercise: &Exercise) -> usize {
    let mut bad = 0;
    for file in ["README.md", "README.ru.md"] {
        let path = format!("{}/common/{file}", exercise.name);
        let text = lab_exercises::files::text(&path).unwrap_or_default();
        for check in exercise.checks {
            if !text.contains(&format!("`{}`", check.name)) {
                bad += 1;
                say!(
                    "  {}",
                    words.common(
                        Msg::new("verify.docs")
                            .arg("exercise", exercise.name)
                            .arg("file", file)
                            .arg("check", check.name)
                    )
                );
            }
        }
    }
    bad
}

/// One side of one exercise in one language, written out for `verify`.
struct Project<'a> {
    exercise: &'static Exercise,
    lang: &'a str,
    side: &'a str,
    dir: PathBuf,
}

/// Writes `project` out and checks it with seeds 1..=`seeds`: how many verdicts disagreed with
/// what its side must do, and how many check runs there were.
async fn verify_project(
    servers: &lab_infra::Servers,
    words: &Words,
    project: &Project<'_>,
    seeds: u32,
    python_venv: Option<&Path>,
    guest_env: Vec<(String, String)>,
) -> Result<(usize, usize), Failure> {
    let Project {
        exercise,
        lang,
        side,
        dir,
    } = project;
    lab_exercises::files::write_side(exercise.name, lang, side, dir).map_err(failure)?;
    if *lang == "python" {
        let venv = python_venv.ok_or_else(|| {
            Failure::usage(
                "verify needs --python-venv DIR: a venv with the Python exercises' requirements",
            )
        })?;
        let venv = std::path::absolute(venv).map_err(Failure::environment)?;
        std::os::unix::fs::symlink(&venv, dir.join(".venv")).map_err(Failure::environment)?;
    }
    let manifest = lab_exercises::Manifest::read(dir).map_err(failure)?;
    let said = |key: &str| {
        Msg::new(key.to_string())
            .arg("exercise", exercise.name)
            .arg("lang", *lang)
            .arg("side", *side)
    };
    let mut bad = 0;
    // The manifest says what the project is.
    if manifest.exercise != exercise.name || manifest.lang != *lang {
        bad += 1;
        say!("  {}", words.common(said("verify.manifest")));
    }
    for seed in 1..=u64::from(seeds) {
        let options = CheckOptions {
            only: Vec::new(),
            seed,
            repeat: 3,
            guest_env: guest_env.clone(),
        };
        let subject = Subject::Program {
            dir: dir.clone(),
            manifest: manifest.clone(),
        };
        let checked = lab_exercises::check(exercise, subject, servers, &options, &mut |_| {})
            .await
            .map_err(failure)?;
        let reports = match checked {
            Checked::Reports(reports) => reports,
            Checked::NotReady(not_ready) => {
                print_not_ready(words, &not_ready);
                return Err(Failure::environment(anyhow::anyhow!(
                    "{} ({lang}, {side}) never answered",
                    exercise.name
                )));
            }
        };
        let mut as_expected = true;
        for report in &reports {
            let want = expected(exercise, side, report.name);
            if report.verdict.word() == want {
                continue;
            }
            as_expected = false;
            bad += 1;
            let msg = said("verify.bad")
                .arg("seed", seed as i64)
                .arg("check", report.name)
                .arg("got", report.verdict.word())
                .arg("expected", want);
            say!("  {}", words.common(msg));
            if let Some(reason) = report.verdict.reason() {
                say!("      {}", words.of(exercise, reason));
            }
            for line in schedule_lines(words, exercise, report) {
                say!("      {line}");
            }
        }
        if as_expected {
            say!(
                "  {}",
                words.common(said("verify.ok").arg("seed", seed as i64))
            );
        }
    }
    Ok((bad, seeds as usize))
}
