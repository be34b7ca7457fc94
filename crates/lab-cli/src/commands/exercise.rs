//! `lab exercise`: list, start, check, watch, hint, solution, verify. The engine and its reports
//! are `lab-exercises`; this module turns flags into its options, prints what its reports
//! render, and turns verdicts and errors into exit codes.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use lab_core::Msg;
use lab_exercises::report::{self, Ending, Replay, Tally, Words};
use lab_exercises::state::{self, Progress};
use lab_exercises::{
    CheckOptions, CheckReport, Checked, ErrorKind, Exercise, ExerciseError, Subject, VerdictKind,
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

pub(super) fn find(name: &str) -> Result<&'static Exercise, Failure> {
    lab_exercises::find(name).ok_or_else(|| failure(ExerciseError::Unknown(name.to_string())))
}

fn default_dir(name: &str) -> PathBuf {
    PathBuf::from("lab-exercises").join(name)
}

/// Runs `lab exercise …`.
pub async fn exercise_command(
    options: SessionOptions,
    library: Result<Library, Failure>,
    command: &ExerciseCommand,
    junit: bool,
) -> Result<u8, Failure> {
    let mut words = Words::new(options.lang, options.color).map_err(Failure::environment)?;
    if options.keep {
        // `--keep` is a flag of every command; an exercise's run space holds the learner's
        // program's role and must not outlive it, so it is refused rather than ignored.
        return Err(Failure::usage(
            "--keep keeps a scenario's run (`lab run`); `lab exercise` always removes its run's \
             schema, keys and role: replay a check from its replay line to look again",
        ));
    }
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
            let exercise = find(name)?;
            exercise.has_lang(lang).map_err(failure)?;
            let dir = dir.clone().unwrap_or_else(|| default_dir(name));
            if matches!(command, ExerciseCommand::Start { .. }) {
                start(&words, exercise, lang, &dir)
            } else {
                solution(&words, exercise, lang, &dir)
            }
        }
        ExerciseCommand::Hint { name, level } => {
            let exercise = find(name)?;
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
            first,
            diagram,
            class,
        } => {
            words.diagram = *diagram;
            let exercise = find(name)?;
            exercise.known_checks(only).map_err(failure)?;
            exercise.known_checks(first).map_err(failure)?;
            let subject = match target {
                Some(url) => Subject::Target { url: url.clone() },
                None => program(exercise, dir.clone().unwrap_or_else(|| default_dir(name)))?,
            };
            let program_dir = match &subject {
                Subject::Program { dir, .. } => Some(dir.as_path()),
                Subject::Target { .. } => None,
            };
            let class = super::class::link(class, program_dir).await?;
            let check_options = CheckOptions {
                only: only.clone(),
                seed: seed.unwrap_or_else(clock_seed),
                repeat: *repeat,
                guest_env: Vec::new(),
                first: first.clone(),
                restarts_beside: false,
            };
            let output = match (junit, options.format) {
                (true, _) => Output::Junit,
                (false, Format::Json) => Output::Json,
                (false, Format::Text) => Output::Text,
            };
            let database_url = options
                .servers
                .database_url
                .as_ref()
                .map(|t| t.url().to_string());
            let replay = Replay::new(
                exercise,
                &subject,
                database_url.as_deref(),
                check_options.repeat,
            );
            let session = Session::open(options, library?, Mode::Headless);
            let run = Run {
                words: &words,
                exercise,
                options: &check_options,
                output,
                replay: &replay,
                class: class.as_ref(),
                settled: None,
            };
            run.check(&session, subject).await
        }
        ExerciseCommand::Watch {
            name,
            dir,
            only,
            seed,
            repeat,
            class,
        } => {
            let exercise = find(name)?;
            exercise.known_checks(only).map_err(failure)?;
            let dir = dir.clone().unwrap_or_else(|| default_dir(name));
            let subject = program(exercise, dir.clone())?;
            let class = super::class::link(class, Some(&dir)).await?;
            let check_options = CheckOptions {
                only: only.clone(),
                seed: seed.unwrap_or_else(clock_seed),
                repeat: *repeat,
                guest_env: Vec::new(),
                first: Vec::new(),
                restarts_beside: false,
            };
            let replay = Replay::new(exercise, &subject, None, check_options.repeat);
            let session = Session::open(options, library?, Mode::Headless);
            let run = Run {
                words: &words,
                exercise,
                options: &check_options,
                output: Output::Text,
                replay: &replay,
                class: class.as_ref(),
                settled: None,
            };
            watch(&session, &run, dir, subject).await
        }
        ExerciseCommand::Verify {
            name,
            seeds,
            design_seeds,
            python_venv,
            jobs,
        } => {
            let exercises: Vec<&'static Exercise> = match name {
                Some(name) => vec![find(name)?],
                None => lab_exercises::EXERCISES.to_vec(),
            };
            let plan = lab_exercises::verify::Plan {
                exercises,
                seeds: *seeds,
                design_seeds: design_seeds.unwrap_or(*seeds),
                python_venv: python_venv.clone(),
                jobs: usize::from(*jobs),
            };
            let session = Session::open(options, library?, Mode::Headless);
            verify(&session, &words, &plan).await
        }
    }
}

/// The program in `dir`, if its manifest is `exercise`'s.
fn program(exercise: &Exercise, dir: PathBuf) -> Result<Subject, Failure> {
    let manifest = lab_exercises::Manifest::read(&dir).map_err(failure)?;
    if manifest.exercise != exercise.name {
        return Err(failure(ExerciseError::OtherExercise {
            dir,
            found: manifest.exercise,
            wanted: exercise.name.to_string(),
        }));
    }
    Ok(Subject::Program { dir, manifest })
}

/// A seed from the clock, for a check run that was given none (printed in its replay lines).
pub(super) fn clock_seed() -> u64 {
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
        let checks: Vec<&str> = exercise.checks().map(|c| c.name).collect();
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
        lab_exercises::files::write_side(exercise, lang, "starter", dir).map_err(failure)?;
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
    lab_exercises::files::write_side(exercise, lang, "solution", &beside).map_err(failure)?;
    say!(
        "{}",
        words.common(Msg::new("solution.written").arg("dir", beside.display().to_string()))
    );
    Ok(exit::OK)
}

/// The exit code of a set of verdicts: a failure wins over an undecided check.
pub(super) fn exit_code(reports: &[CheckReport]) -> u8 {
    let any = |kind| reports.iter().any(|r| r.verdict.kind() == kind);
    if any(VerdictKind::Fail) {
        exit::DRIFT
    } else if any(VerdictKind::Unknown) {
        exit::UNDECIDED
    } else {
        exit::OK
    }
}

/// One `check` (or each round of `watch`): what to check, and how to tell it.
struct Run<'a> {
    words: &'a Words,
    exercise: &'static Exercise,
    options: &'a CheckOptions,
    output: Output,
    replay: &'a Replay,
    /// The class board each finished check's verdict goes to (`--class`).
    class: Option<&'a super::class::ClassLink>,
    /// `watch`'s run that began at a save before it settled: nothing of it is told (printed,
    /// posted to the board, recorded) until it has; a run whose save went on is told nothing.
    settled: Option<&'a Settled>,
}

/// Whether the save that began a run has settled (no other change for [`SETTLE`]), or went on.
struct Settled(tokio::sync::watch::Sender<Option<Told>>);

/// What becomes of a run's verdicts once its save has settled or gone on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Told,
    /// The save went on: the run is one of code that is no longer there.
    Untold,
}

impl Settled {
    fn new(settled: bool) -> Settled {
        Settled(tokio::sync::watch::Sender::new(
            settled.then_some(Told::Told),
        ))
    }

    fn is_decided(&self) -> bool {
        self.0.borrow().is_some()
    }

    fn is_untold(&self) -> bool {
        *self.0.borrow() == Some(Told::Untold)
    }

    fn decide(&self, told: Told) {
        self.0.send_replace(Some(told));
    }

    async fn decided(&self) -> Told {
        // The sender is `self`, alive while this waits: the wait ends only by a decision.
        let mut decided = self.0.subscribe();
        let told = decided
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|t| *t);
        told.unwrap_or(Told::Told)
    }
}

impl Run<'_> {
    /// Starts the servers, checks, and tells every check, whatever ends the run.
    async fn check(&self, session: &Session, subject: Subject) -> Result<u8, Failure> {
        let reports = RefCell::new(Vec::new());
        let ended = session
            .run_with_servers(self.exercise.needs, async |servers| {
                self.check_on(servers, subject, &reports).await
            })
            .await;
        let reports = reports.into_inner();
        match ended {
            Ok(code) => Ok(code),
            Err(failure) => {
                let ending = if failure.is_interruption() {
                    Ending::Interrupted
                } else {
                    Ending::Error {
                        kind: if failure.code == exit::USAGE {
                            ErrorKind::Usage
                        } else {
                            ErrorKind::Environment
                        },
                        message: failure.message(),
                    }
                };
                self.tell_ending(&reports, &ending);
                Err(failure)
            }
        }
    }

    /// One check run on servers already up: its heading, each check as it ends, the learner's
    /// progress recorded, the ending; its exit code.
    async fn check_on(
        &self,
        servers: &lab_infra::Servers,
        subject: Subject,
        reports: &RefCell<Vec<CheckReport>>,
    ) -> Result<u8, Failure> {
        let program_dir = match &subject {
            Subject::Program { dir, .. } => Some(dir.clone()),
            Subject::Target { .. } => None,
        };
        // The checks run while their verdicts are told, in this order, by the second half:
        // held, in `watch`, until the save has settled.
        let (told, mut to_tell) = tokio::sync::mpsc::unbounded_channel::<CheckReport>();
        let checking = async {
            let mut tell = |report: &CheckReport| {
                let _ = told.send(report.clone());
            };
            let checked = lab_exercises::check(
                self.exercise,
                subject.clone(),
                servers,
                self.options,
                &mut tell,
            )
            .await;
            drop(told);
            checked
        };
        let telling = async {
            if let Some(settled) = self.settled
                && settled.decided().await == Told::Untold
            {
                while to_tell.recv().await.is_some() {}
                return;
            }
            if self.output == Output::Text {
                say!(
                    "{}",
                    report::text::heading(self.words, self.exercise, &subject)
                );
            }
            // The board's replay lines name neither the folder nor a database URL.
            let portable = Replay::portable(self.exercise, self.options.repeat);
            let sender = self.class.map(super::class::ClassLink::sender);
            while let Some(report) = to_tell.recv().await {
                if let (Some(sender), Some(class)) = (&sender, self.class)
                    && let Some(post) =
                        class
                            .languages
                            .verdict_post(self.exercise, &report, &portable)
                {
                    sender.send(post);
                }
                self.tell(&report);
                reports.borrow_mut().push(report);
                if self.all_told(&reports.borrow()) {
                    break;
                }
            }
            // The verdicts reach the board (or not, said in one line) before the run's ending.
            if let Some(sender) = sender {
                sender.finish().await;
            }
            // Every check told: the summary comes now, while the worlds close (the program
            // stopped, the schema dropped), in text; JSON's and JUnit's endings wait for how
            // the run ended.
            if self.output == Output::Text && self.all_told(&reports.borrow()) {
                self.tell_done(program_dir.as_deref(), &reports.borrow());
            }
        };
        let (checked, ()) = tokio::join!(checking, telling);
        if self.settled.is_some_and(Settled::is_untold) {
            return Ok(exit::OK);
        }
        let checked = checked.map_err(failure)?;
        let reports = reports.borrow();
        match checked {
            Checked::Reports(_) => {
                // In text, told already once every check was.
                if self.output != Output::Text || !self.all_told(&reports) {
                    self.tell_done(program_dir.as_deref(), &reports);
                }
                Ok(exit_code(&reports))
            }
            Checked::NotReady(not_ready) => {
                self.tell_ending(&reports, &Ending::NotReady(&not_ready));
                Ok(exit::UNDECIDED)
            }
        }
    }

    /// Whether every selected check has been told.
    fn all_told(&self, reports: &[CheckReport]) -> bool {
        report::not_run(self.exercise, self.options, reports).is_empty()
    }

    /// The ending of a run whose checks all ran: the learner's progress recorded (in the
    /// program's folder), and the summary.
    fn tell_done(&self, program_dir: Option<&Path>, reports: &[CheckReport]) {
        if let Some(dir) = program_dir {
            let verdicts: Vec<(&str, VerdictKind)> =
                reports.iter().map(|r| (r.name, r.verdict.kind())).collect();
            // Progress is a convenience: a read-only folder does not fail the check.
            let _ = state::State::record(dir, &verdicts);
        }
        self.tell_ending(reports, &Ending::Done);
    }

    /// One check's verdict, in the run's output (JUnit's come with the ending).
    fn tell(&self, report: &CheckReport) {
        match self.output {
            Output::Text => {
                for line in report::text::check(self.words, self.exercise, report, self.replay) {
                    say!("{line}");
                }
            }
            Output::Json => say!(
                "{}",
                report::json::check(self.words, self.exercise, report, self.replay)
            ),
            Output::Junit => {}
        }
    }

    /// The end of the run, in the run's output: the summary, or why the checks left did not
    /// run; JSON's closing lines; the whole JUnit document.
    fn tell_ending(&self, reports: &[CheckReport], ending: &Ending) {
        let not_run = report::not_run(self.exercise, self.options, reports);
        let tally = Tally::of(reports, not_run.len());
        match self.output {
            Output::Text => match ending {
                Ending::Done => say!("{}", report::text::summary(self.words, &tally)),
                Ending::NotReady(not_ready) => {
                    for line in report::text::not_ready(self.words, not_ready) {
                        say!("{line}");
                    }
                }
                // Said on stderr by the failure itself.
                Ending::Error { .. } | Ending::Interrupted => {}
            },
            Output::Json => {
                for line in
                    report::json::ending(self.words, self.exercise, &not_run, &tally, ending)
                {
                    say!("{line}");
                }
            }
            Output::Junit => say!(
                "{}",
                report::junit::document(
                    self.words,
                    self.exercise,
                    reports,
                    &not_run,
                    ending,
                    self.replay
                )
            ),
        }
    }
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

/// How long a burst of changes (an editor's save: a temporary file, a rename) must be quiet
/// before a run's verdicts are told: one check for one save.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// The quiet that ends one write's events (a truncation, the bytes, the close: microseconds
/// apart) before a save's run begins; the rest of a longer save is caught by [`SETTLE`].
const BURST: std::time::Duration = std::time::Duration::from_millis(20);

/// What began a run of `watch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Begun {
    /// Nothing left to settle: the first run, a key, or changes that have already settled.
    Settled,
    /// A save, that may go on for a few more writes: the run's verdicts wait for it to settle.
    Save,
}

/// `lab exercise watch`: checks, then checks again whenever a file of the exercise changes,
/// on one set of servers, with a footer of keys (h a hint, r re-check, q quit), as rustlings'
/// watch mode. The keys are read a line at a time (a letter, then Enter).
async fn watch(
    session: &Session,
    run: &Run<'_>,
    dir: PathBuf,
    subject: Subject,
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
    let words = run.words;
    session
        .run_with_servers(run.exercise.needs, async |servers| {
            // The checks that failed (or could not decide) last time run first, so the verdict
            // the learner is working on comes first after a save; the rest follow.
            let mut failed_last: Vec<String> = Vec::new();
            // What began the next run: the start, a key (both settled), or a save.
            let mut begun_by = Begun::Settled;
            loop {
                let reports = RefCell::new(Vec::new());
                let options = CheckOptions {
                    first: std::mem::take(&mut failed_last),
                    // A restart (crash) costs its world a second start of the program: beside
                    // the rest, it costs no time of theirs.
                    restarts_beside: true,
                    ..run.options.clone()
                };
                let settled = Settled::new(begun_by == Begun::Settled);
                let this_run = Run {
                    options: &options,
                    settled: Some(&settled),
                    ..*run
                };
                // A save begins its run at once: the program starts (and a Rust one builds) while
                // the save settles, and the verdicts are told once it has. A change within
                // SETTLE means the save went on: the run goes on to its end untold (dropped
                // halfway, a database statement of its own could be cut between being queued
                // and being sent, and hold its connection), and the next one waits for the
                // changes to settle first.
                let checking = this_run.check_on(servers, subject.clone(), &reports);
                tokio::pin!(checking);
                let quiet = tokio::time::sleep(SETTLE);
                tokio::pin!(quiet);
                let ended = loop {
                    tokio::select! {
                        ended = &mut checking => break ended,
                        () = &mut quiet, if !settled.is_decided() => settled.decide(Told::Told),
                        Some(()) = changes.recv(), if !settled.is_decided() => {
                            settled.decide(Told::Untold);
                        }
                    }
                };
                if settled.is_untold() {
                    // Its failure too is of code that is no longer there.
                    drop(ended);
                    tokio::time::sleep(SETTLE).await;
                    while changes.try_recv().is_ok() {}
                    failed_last = options.first.clone();
                    begun_by = Begun::Settled;
                    continue;
                }
                ended?;
                failed_last = reports
                    .borrow()
                    .iter()
                    .filter(|report| {
                        matches!(report.verdict.kind(), VerdictKind::Fail | VerdictKind::Unknown)
                    })
                    .map(|report| report.name.to_string())
                    .collect();
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
                            // One write of a file is several events (a truncation, the bytes,
                            // the close): the run begins once they have come.
                            while let Ok(Some(())) =
                                tokio::time::timeout(BURST, changes.recv()).await
                            {}
                            begun_by = Begun::Save;
                            break;
                        }
                        line = keys.next_line(), if keys_open => match line {
                            Ok(Some(line)) => match line.trim() {
                                "q" => return Ok(exit::OK),
                                "r" | "" => {
                                    begun_by = Begun::Settled;
                                    break;
                                }
                                "h" => {
                                    hint = hint % 3 + 1;
                                    say!("{}", words.of(run.exercise, &Msg::new(format!("hint.{hint}"))));
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

/// An engine error as the CLI reports it: the learner's own mistakes are usage (exit 2), the
/// rest the environment (exit 3); a server's own error keeps its words.
pub(super) fn failure(e: ExerciseError) -> Failure {
    match e {
        ExerciseError::Infra(infra) => infra.into(),
        e if e.kind() == ErrorKind::Usage => Failure::usage(e.to_string()),
        e => Failure::environment(e),
    }
}

/// `lab exercise verify`: every project of the plan, on one set of servers.
async fn verify(
    session: &Session,
    words: &Words,
    plan: &lab_exercises::verify::Plan,
) -> Result<u8, Failure> {
    let scratch = tempfile::tempdir().map_err(Failure::environment)?;
    let needs = plan
        .exercises
        .iter()
        .fold(Needs::default(), |needs, e| needs.union(e.needs));
    let tally = session
        .run_with_servers(needs, async |servers| {
            lab_exercises::verify::verify(servers, words, plan, scratch.path(), &mut |line| {
                say!("{line}")
            })
            .await
            .map_err(failure)
        })
        .await?;
    Ok(if tally.disagreements == 0 {
        exit::OK
    } else {
        exit::DRIFT
    })
}
