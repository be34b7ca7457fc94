//! `lab exercise verify`, for maintainers: the exercises judge what they claim to judge.
//!
//! Every project below is written out from the embedded files and checked over several seeds,
//! and each verdict is held to what that project must get:
//!
//! | project                                      | must get                                        |
//! |----------------------------------------------|-------------------------------------------------|
//! | a starter, in each language                  | a fail on exactly the checks its TODOs are about ([`crate::CheckSpec::starter_fails`]), a pass on the others |
//! | a solution, in each language                 | a pass on every check                           |
//! | a correct design (`exercises/<name>/designs/<design>/`, no `[fails]` in its `expect.toml`) | a pass on every check: any correct design passes, not only ours |
//! | a broken design (`[fails]` names checks and causes) | a fail on each named check, whose line names that cause (`broke.<key>`), and a pass on every other: no verdict names a cause the code does not have |
//!
//! And besides: each README names every check; every line a report renders has its text in both
//! languages (a missing one shows as `⟦key⟧`); the charge-once solutions in Python and Rust
//! replay each other's Charges on one Redis (`idem` is wire-compatible with idempotency-kit).
//!
//! Each disagreement is told as it is found, and counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lab_core::Msg;
use lab_infra::Servers;
use serde::Deserialize;

use crate::error::ExerciseError;
use crate::exercise::{CheckOptions, Checked, Exercise, Subject};
use crate::guest::Guest;
use crate::manifest::Manifest;
use crate::report::{Words, text};
use crate::rig::Program;
use crate::verdict::{CheckReport, Verdict, VerdictKind};

/// What a project is, for `verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    Starter,
    Solution,
    /// A design of `exercises/<name>/designs/`, by its folder's name.
    Design(String),
}

impl Side {
    fn word(&self) -> String {
        match self {
            Side::Starter => "starter".into(),
            Side::Solution => "solution".into(),
            Side::Design(name) => format!("design {name}"),
        }
    }
}

/// A design's `expect.toml`: what the lab must say of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// One line: the design, and for a broken one its flaw.
    pub about: String,
    /// Each check it must fail, and the key (under `broke.`) its failing line must carry.
    #[serde(default)]
    pub fails: BTreeMap<String, String>,
}

/// A design an exercise carries, as embedded.
#[derive(Debug, Clone)]
pub struct Design {
    pub name: String,
    pub expect: Expect,
    /// `rust` when the design is a Cargo project, else `python`.
    pub lang: &'static str,
}

/// The designs of `exercise`, in name order; an `expect.toml` that does not parse, or names a
/// check the exercise does not have, is an error (of the repository, so of the environment).
pub fn designs(exercise: &Exercise) -> Result<Vec<Design>, ExerciseError> {
    let prefix = format!("{}/designs", exercise.name);
    let mut designs = Vec::new();
    for (path, bytes) in crate::files::under(&prefix) {
        let Some(name) = path.strip_suffix("/expect.toml") else {
            continue;
        };
        let bad = |reason: String| ExerciseError::Manifest {
            path: PathBuf::from(format!("exercises/{prefix}/{path}")),
            reason,
        };
        let source = std::str::from_utf8(bytes).map_err(|e| bad(e.to_string()))?;
        let expect: Expect = toml::from_str(source).map_err(|e| bad(e.message().to_string()))?;
        for check in expect.fails.keys() {
            if exercise.check(check).is_none() {
                return Err(bad(format!("names no check of {}: {check}", exercise.name)));
            }
        }
        let is_cargo = crate::files::under(&format!("{prefix}/{name}"))
            .iter()
            .any(|(path, _)| *path == "Cargo.toml");
        designs.push(Design {
            name: name.to_string(),
            expect,
            lang: if is_cargo { "rust" } else { "python" },
        });
    }
    designs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(designs)
}

/// What a run of `verify` covers.
#[derive(Debug, Clone)]
pub struct Plan {
    pub exercises: Vec<&'static Exercise>,
    /// Seeds for the starters and solutions, and for the designs.
    pub seeds: u32,
    pub design_seeds: u32,
    /// A venv with the Python exercises' requirements, linked into each Python project.
    pub python_venv: Option<PathBuf>,
    /// How many Python projects are checked at once; the Rust ones, once built, beside them,
    /// half as many (at least one). Each has a run space of its own on the shared
    /// servers, and a check waits far more than it computes (for holds, leases, a program's
    /// start), so a few at a time use a small machine's cores without changing a verdict: the
    /// checks stage their moments from state, never from how fast the machine is.
    pub jobs: usize,
}

/// How a run of `verify` went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub disagreements: usize,
    pub runs: usize,
}

/// One project to check, and what it must get.
struct Unit<'a> {
    project: Project<'a>,
    /// The design's expectations; `None` for a starter or a solution.
    design: Option<Design>,
}

/// One check of one project with one seed: what `verify` schedules. A project's seeds are
/// checked at once like any two projects (each check has a run space and ports of its own; the
/// project's folder is only read), so a starter's five seeds do not wait for each other.
struct Job {
    unit: usize,
    seed: u64,
}

/// Runs `plan` on `servers` in `scratch`, telling each line to `say`: the projects are checked
/// `plan.jobs` at a time, the Python ones first, and each one's lines are told together.
pub async fn verify(
    servers: &Servers,
    words: &Words,
    plan: &Plan,
    scratch: &Path,
    say: &mut dyn FnMut(String),
) -> Result<Tally, ExerciseError> {
    use futures_util::stream::{self, StreamExt as _};

    say(words.common(
        Msg::new("verify.heading")
            .arg("seeds", plan.seeds)
            .arg("design_seeds", plan.design_seeds),
    ));
    let mut tally = Tally::default();
    let mut units = Vec::new();
    for exercise in &plan.exercises {
        tally.disagreements += readme_disagreements(words, exercise, say);
        for lang in exercise.langs {
            for side in [Side::Starter, Side::Solution] {
                let dir = scratch.join(format!("{}-{lang}-{}", exercise.name, side.word()));
                // One Cargo target folder per side, shared by the exercises (their crates have
                // different names), so the dependencies build once per side. Never one for a
                // starter and its solution: they are one crate (one name, one version) in two
                // folders, and Cargo, which hashes a workspace's own crate by its path inside
                // the workspace, would take one's build for the other's. Two builds in one
                // folder at once wait for each other (Cargo locks it).
                let target = cargo_target(scratch, &side);
                crate::files::write_side(exercise, lang, &side.word(), &dir)?;
                let project = Project {
                    exercise,
                    lang,
                    side,
                    dir,
                    target: Some(target),
                };
                units.push(Unit {
                    project,
                    design: None,
                });
            }
        }
        for design in designs(exercise)? {
            let dir = scratch.join(format!("{}-design-{}", exercise.name, design.name));
            let mut sources = vec![(format!("{}/designs/{}", exercise.name, design.name), "")];
            let rust = design.lang == "rust";
            if rust && exercise.rust_uses_idem {
                sources.push(("vendor/idem".to_string(), "vendor/idem"));
            }
            crate::files::write_project(&sources, exercise.needs.postgres, &dir)?;
            let project = Project {
                exercise,
                lang: design.lang,
                side: Side::Design(design.name.clone()),
                dir,
                // A Rust design is a crate of its own name (never a solution's), so it shares
                // the solutions' target folder and their built dependencies without taking
                // their builds (see the sides' folders above).
                target: rust.then(|| cargo_target(scratch, &Side::Solution)),
            };
            units.push(Unit {
                project,
                design: Some(design),
            });
        }
    }
    // The Rust projects are built one after another while the Python ones are checked: the
    // solutions and the designs in one Cargo target folder, then the starters in another. A
    // side's checks start once every build in its folder is done (the solutions' while the
    // starters build): a check starts a program that is built, and no build holds the folder
    // whose lock the program's `cargo run` takes (waiting for it, the program might miss its
    // start's deadline).
    units.sort_by_key(|unit| unit.project.lang == "rust");
    let mut jobs = Vec::new();
    for (index, unit) in units.iter().enumerate() {
        let seeds = match unit.design {
            None => plan.seeds,
            Some(_) => plan.design_seeds,
        };
        jobs.extend((1..=u64::from(seeds)).map(|seed| Job { unit: index, seed }));
    }
    // Each project's folder gets what its checks read (its venv) before any of them starts.
    let programs = units
        .iter()
        .map(|unit| unit.project.program(plan))
        .collect::<Result<Vec<Program>, ExerciseError>>()?;
    let (solutions_built, are_solutions_built) = tokio::sync::watch::channel(false);
    let (starters_built, are_starters_built) = tokio::sync::watch::channel(false);
    let builds = async {
        let rust = |starter: bool| {
            units.iter().filter(move |unit| {
                unit.project.lang == "rust" && (unit.project.side == Side::Starter) == starter
            })
        };
        for unit in rust(false) {
            build(&unit.project, plan).await;
        }
        let _ = solutions_built.send(true);
        // The starters' folder is seeded with the solutions' built dependencies (see
        // `seed_starter_target`).
        let starters: Vec<&Project> = rust(true).map(|unit| &unit.project).collect();
        if !starters.is_empty() {
            seed_starter_target(scratch, &starters).await;
        }
        for project in starters {
            build(project, plan).await;
        }
        let _ = starters_built.send(true);
    };
    let run_job = |index: usize| {
        let Job { unit, seed } = jobs[index];
        let (unit, program) = (&units[unit], &programs[unit]);
        let mut built = match unit.project.side {
            Side::Starter => are_starters_built.clone(),
            _ => are_solutions_built.clone(),
        };
        async move {
            if unit.project.lang == "rust" {
                let _ = built.wait_for(|built| *built).await;
            }
            let mut lines = Vec::new();
            let mut say = |line| lines.push(line);
            let design = unit.design.as_ref();
            let tally = verify_seed(
                servers,
                words,
                &unit.project,
                program,
                design,
                seed,
                &mut say,
            )
            .await;
            (index, tally, lines)
        }
    };
    // The Python jobs run `plan.jobs` at a time, each slot taking the next job as soon as its
    // own is done (a quick design does not wait for a slow one beside it). The Rust ones run
    // beside them as their builds are done, half as many at a time (at least one): they mostly
    // wait on their programs, and would otherwise all wait for the last build and the last
    // Python job. Their lines are told in the jobs' order all the same.
    let is_rust = |index: &usize| units[jobs[*index].unit].project.lang == "rust";
    let (rust_jobs, python_jobs): (Vec<usize>, Vec<usize>) = (0..jobs.len()).partition(is_rust);
    let python = stream::iter(python_jobs)
        .map(run_job)
        .buffer_unordered(plan.jobs.max(1));
    let rust = stream::iter(rust_jobs)
        .map(run_job)
        .buffer_unordered((plan.jobs / 2).max(1));
    let mut results = stream::select(python, rust);
    let mut done = std::collections::BTreeMap::new();
    let mut next = 0;
    let tell = async {
        while let Some((index, unit_tally, lines)) = results.next().await {
            done.insert(index, (unit_tally, lines));
            while let Some((unit_tally, lines)) = done.remove(&next) {
                next += 1;
                for line in lines {
                    say(line);
                }
                tally = tally.add(unit_tally?);
            }
        }
        Ok::<(), ExerciseError>(())
    };
    let ((), told) = futures_util::future::join(builds, tell).await;
    told?;
    for exercise in &plan.exercises {
        if exercise.name == crate::charge_once::EXERCISE.name
            && exercise.langs.contains(&"python")
            && exercise.langs.contains(&"rust")
        {
            tally.disagreements +=
                verify_cross_replay(servers, words, exercise, scratch, say).await?;
            tally.runs += 1;
        }
    }
    say(words.common(
        Msg::new("verify.summary")
            .arg("bad", tally.disagreements)
            .arg("runs", tally.runs),
    ));
    Ok(tally)
}

/// The Cargo target folder of `side`'s Rust projects in `scratch` (a design's is the
/// solutions').
fn cargo_target(scratch: &Path, side: &Side) -> PathBuf {
    scratch.join(format!("cargo-target-{}", side.word()))
}

/// Builds a Rust project ahead of its check. A build that fails here fails again in its
/// check, which tells it.
async fn build(project: &Project<'_>, plan: &Plan) {
    if let Ok(program) = project.program(plan) {
        let env = project.options(1).guest_env;
        if let Ok(guest) = Guest::new(&program.dir, program.manifest, 0, env) {
            let _ = guest.build().await;
        }
    }
}

/// Seeds the starters' Cargo target folder with the dependencies the solutions' builds made,
/// so that they are not built twice (a starter's dependencies are a solution's: about 150 s of
/// a two-core machine's CPU a side). The starters keep a folder of their own (see the sides'
/// folders in [`verify`]); the copy keeps the files' times, which Cargo compares, and then each
/// starter's own files are dated now, newer than anything copied: Cargo builds every crate of
/// the starters' own again (each one, and its vendored `idem`) and reuses what came from
/// crates.io, whose builds it knows by version and features, not by time. Best effort: a copy
/// that fails leaves the folder to be built from nothing, as before.
async fn seed_starter_target(scratch: &Path, starters: &[&Project<'_>]) {
    let solution = cargo_target(scratch, &Side::Solution);
    let starter = cargo_target(scratch, &Side::Starter);
    let from = solution.join("debug");
    let into = starter.join("debug");
    if !from.is_dir() || starter.exists() {
        return;
    }
    let copied = async {
        std::fs::create_dir_all(&into).ok()?;
        // Dependencies' builds, build scripts' outputs, and Cargo's records of both: what
        // Cargo needs to find them built. Not the solutions' programs nor their incremental
        // caches.
        let parts: Vec<PathBuf> = ["deps", "build", ".fingerprint"]
            .iter()
            .map(|part| from.join(part))
            .filter(|part| part.exists())
            .collect();
        let status = tokio::process::Command::new("cp")
            .arg("-a")
            .args(&parts)
            .arg(&into)
            .kill_on_drop(true)
            .status()
            .await
            .ok()?;
        status.success().then_some(())
    };
    let dated = copied.await.is_some()
        && starters
            .iter()
            .all(|project| date_now(&project.dir).is_ok());
    if !dated {
        let _ = std::fs::remove_dir_all(&starter);
    }
}

/// Sets the modification time of every file under `dir` to now (links are left alone: a
/// project's are links to what it uses, never its sources).
fn date_now(dir: &Path) -> std::io::Result<()> {
    let now = std::time::SystemTime::now();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            date_now(&path)?;
        } else if kind.is_file() {
            std::fs::File::options()
                .write(true)
                .open(&path)?
                .set_modified(now)?;
        }
    }
    Ok(())
}

impl Tally {
    fn add(self, other: Tally) -> Tally {
        Tally {
            disagreements: self.disagreements + other.disagreements,
            runs: self.runs + other.runs,
        }
    }
}

/// One project written out for `verify`.
struct Project<'a> {
    exercise: &'static Exercise,
    lang: &'a str,
    side: Side,
    dir: PathBuf,
    /// The Cargo target folder of a Rust project.
    target: Option<PathBuf>,
}

impl Project<'_> {
    fn said(&self, key: &str) -> Msg {
        Msg::new(key.to_string())
            .arg("exercise", self.exercise.name)
            .arg("lang", self.lang)
            .arg("side", self.side.word())
    }

    /// The project as the lab checks it: its venv linked in, its manifest read.
    fn program(&self, plan: &Plan) -> Result<Program, ExerciseError> {
        if self.lang == "python" {
            let venv = plan
                .python_venv
                .as_ref()
                .ok_or_else(|| ExerciseError::Service {
                    service: "exercise verify",
                    reason:
                        "it needs --python-venv DIR: a venv with the Python exercises' requirements"
                            .into(),
                })?;
            let venv = std::path::absolute(venv).map_err(ExerciseError::io(venv))?;
            let link = self.dir.join(".venv");
            std::os::unix::fs::symlink(&venv, &link).map_err(ExerciseError::io(&link))?;
        }
        let manifest = Manifest::read(&self.dir)?;
        Ok(Program {
            dir: self.dir.clone(),
            manifest,
        })
    }

    fn options(&self, seed: u64) -> CheckOptions {
        CheckOptions {
            only: Vec::new(),
            seed,
            repeat: CheckOptions::REPEAT,
            guest_env: self
                .target
                .iter()
                .map(|t| ("CARGO_TARGET_DIR".to_string(), t.display().to_string()))
                .collect(),
            first: order_of(self.exercise, seed),
            // The shuffled seeds run as `watch` does, the restarting checks beside the rest: a
            // verdict must not depend on it.
            restarts_beside: seed > 1,
        }
    }

    /// The project checked with `seed`: its reports, or `None` (told) if it never answered.
    async fn check(
        &self,
        servers: &Servers,
        words: &Words,
        program: &Program,
        seed: u64,
        say: &mut dyn FnMut(String),
    ) -> Result<Option<Vec<CheckReport>>, ExerciseError> {
        let subject = Subject::Program {
            dir: program.dir.clone(),
            manifest: program.manifest.clone(),
        };
        let checked = crate::check(
            self.exercise,
            subject,
            servers,
            &self.options(seed),
            &mut |_| {},
        )
        .await?;
        match checked {
            Checked::Reports(reports) => Ok(Some(reports)),
            Checked::NotReady(not_ready) => {
                say(format!(
                    "  {}",
                    words.common(self.said("verify.not_ready").arg("seed", seed))
                ));
                for line in text::not_ready(words, &not_ready) {
                    say(format!("      {line}"));
                }
                Ok(None)
            }
        }
    }
}

/// One project with one seed: a starter fails exactly its TODOs' checks and a solution passes
/// them all (and, with seed 1, its manifest names it); a design gets the verdicts its
/// `expect.toml` names.
async fn verify_seed(
    servers: &Servers,
    words: &Words,
    project: &Project<'_>,
    program: &Program,
    design: Option<&Design>,
    seed: u64,
    say: &mut dyn FnMut(String),
) -> Result<Tally, ExerciseError> {
    let mut tally = Tally {
        disagreements: 0,
        runs: 1,
    };
    if design.is_none()
        && seed == 1
        && (program.manifest.exercise != project.exercise.name
            || program.manifest.lang != project.lang)
    {
        tally.disagreements += 1;
        say(format!(
            "  {}",
            words.common(project.said("verify.manifest"))
        ));
    }
    let Some(reports) = project.check(servers, words, program, seed, say).await? else {
        tally.disagreements += 1;
        return Ok(tally);
    };
    let mut bad = 0;
    for report in &reports {
        let cause = design.and_then(|design| design.expect.fails.get(report.name));
        let fails = match design {
            Some(_) => cause.is_some(),
            None => {
                let spec = project.exercise.check(report.name).expect("a check it has");
                project.side == Side::Starter && spec.starter_fails
            }
        };
        let expected = if fails {
            VerdictKind::Fail
        } else {
            VerdictKind::Pass
        };
        bad += judge_one(words, project, seed, report, expected, cause, say);
    }
    tally.disagreements += bad;
    if bad == 0 {
        say(format!(
            "  {}",
            words.common(project.said("verify.ok").arg("seed", seed))
        ));
    } else {
        tell_order(words, project.exercise, seed, say);
    }
    Ok(tally)
}

/// The order the checks run in with `seed`: the exercise's own with seed 1 (as `lab exercise
/// check` runs them), a shuffle of it with every other seed. A verdict must not depend on which
/// checks ran before it in the same program (`watch` runs the ones that failed last first), and
/// the shuffled orders hold it to that.
fn order_of(exercise: &Exercise, seed: u64) -> Vec<String> {
    use rand::SeedableRng as _;
    use rand::seq::SliceRandom as _;
    if seed <= 1 {
        return Vec::new();
    }
    let mut names: Vec<String> = exercise.checks().map(|c| c.name.to_string()).collect();
    names.shuffle(&mut rand::rngs::ChaCha8Rng::seed_from_u64(seed));
    names
}

/// After a run that disagreed with a shuffled order: the order, for the maintainer who replays
/// it (`lab exercise check` runs the exercise's order).
fn tell_order(words: &Words, exercise: &Exercise, seed: u64, say: &mut dyn FnMut(String)) {
    let order = order_of(exercise, seed);
    if !order.is_empty() {
        say(format!(
            "      {}",
            words.common(Msg::new("verify.order").arg("order", order.join(",")))
        ));
    }
}

/// One report held to what it must be; the disagreements found (told).
fn judge_one(
    words: &Words,
    project: &Project<'_>,
    seed: u64,
    report: &CheckReport,
    expected: VerdictKind,
    cause: Option<&String>,
    say: &mut dyn FnMut(String),
) -> usize {
    let exercise = project.exercise;
    let rendered: Vec<String> = words
        .reason(exercise, &report.verdict)
        .into_iter()
        .chain(text::schedule(words, exercise, report))
        .collect();
    let mut disagreements = Vec::new();
    if report.verdict.kind() != expected {
        disagreements.push(
            project
                .said("verify.bad")
                .arg("seed", seed)
                .arg("check", report.name)
                .arg("got", report.verdict.word())
                .arg("expected", expected.word()),
        );
    } else if let (Some(cause), Verdict::Fail(msg)) = (cause, &report.verdict)
        && msg.key != format!("broke.{cause}")
    {
        disagreements.push(
            project
                .said("verify.cause")
                .arg("seed", seed)
                .arg("check", report.name)
                .arg("got", msg.key.trim_start_matches("broke."))
                .arg("expected", cause.as_str()),
        );
    }
    if let Some(line) = rendered.iter().find(|line| line.contains('⟦')) {
        disagreements.push(
            project
                .said("verify.no_text")
                .arg("seed", seed)
                .arg("check", report.name)
                .arg("line", line.as_str()),
        );
    }
    for disagreement in &disagreements {
        say(format!("  {}", words.common(disagreement.clone())));
    }
    if !disagreements.is_empty() {
        for line in &rendered {
            say(format!("      {line}"));
        }
    }
    disagreements.len()
}

/// The Python and the Rust solution of charge-once, as `verify` wrote them, on one Redis: each
/// replays the other's Charges. One disagreement if they do not.
async fn verify_cross_replay(
    servers: &Servers,
    words: &Words,
    exercise: &'static Exercise,
    scratch: &Path,
    say: &mut dyn FnMut(String),
) -> Result<usize, ExerciseError> {
    let side = |lang: &str| -> Result<Program, ExerciseError> {
        let dir = scratch.join(format!("{}-{lang}-solution", exercise.name));
        let manifest = Manifest::read(&dir)?;
        Ok(Program { dir, manifest })
    };
    let options = CheckOptions {
        only: Vec::new(),
        seed: 1,
        repeat: CheckOptions::REPEAT,
        guest_env: vec![(
            "CARGO_TARGET_DIR".to_string(),
            cargo_target(scratch, &Side::Solution).display().to_string(),
        )],
        first: Vec::new(),
        restarts_beside: false,
    };
    let checked =
        crate::charge_once::cross_replay(servers, side("python")?, side("rust")?, &options).await?;
    let report = match checked {
        Checked::Reports(mut reports) => reports.remove(0),
        Checked::NotReady(not_ready) => {
            for line in text::not_ready(words, &not_ready) {
                say(line);
            }
            return Ok(1);
        }
    };
    let title = words.of(exercise, &Msg::new(format!("check.{}.title", report.name)));
    say(format!(
        "  {} {title}",
        words.verdict(report.verdict.kind())
    ));
    if matches!(report.verdict, Verdict::Pass) {
        return Ok(0);
    }
    if let Some(reason) = words.reason(exercise, &report.verdict) {
        say(format!("      {reason}"));
    }
    for line in text::schedule(words, exercise, &report) {
        say(format!("      {line}"));
    }
    Ok(1)
}

/// The checks an exercise's READMEs do not name (each one a disagreement, told).
fn readme_disagreements(words: &Words, exercise: &Exercise, say: &mut dyn FnMut(String)) -> usize {
    let mut bad = 0;
    for file in ["README.md", "README.ru.md"] {
        let path = format!("{}/common/{file}", exercise.name);
        let text = crate::files::text(&path).unwrap_or_default();
        for check in exercise.checks() {
            if !text.contains(&format!("`{}`", check.name)) {
                bad += 1;
                say(format!(
                    "  {}",
                    words.common(
                        Msg::new("verify.docs")
                            .arg("exercise", exercise.name)
                            .arg("file", file)
                            .arg("check", check.name)
                    )
                ));
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_design_parses_and_names_only_checks_it_has() {
        for exercise in crate::EXERCISES {
            for design in designs(exercise).unwrap() {
                assert!(!design.expect.about.trim().is_empty(), "{}", design.name);
            }
        }
    }

    /// The package name in a Cargo.toml embedded under `prefix`.
    fn crate_name(prefix: &str) -> Option<String> {
        let (_, bytes) = crate::files::under(prefix)
            .into_iter()
            .find(|(path, _)| *path == "Cargo.toml")?;
        let manifest: toml::Table = toml::from_str(std::str::from_utf8(bytes).ok()?).ok()?;
        Some(manifest["package"]["name"].as_str()?.to_string())
    }

    /// A Rust design shares the solutions' Cargo target folder, which is safe only while its
    /// crate is named unlike every starter and solution (Cargo would take one's build for the
    /// other's) and unlike every other design.
    #[test]
    fn every_rust_design_is_a_crate_of_its_own_name() {
        let mut taken = std::collections::BTreeSet::new();
        for exercise in crate::EXERCISES {
            for lang in exercise.langs {
                for side in ["starter", "solution"] {
                    taken.extend(crate_name(&format!("{}/{lang}/{side}", exercise.name)));
                }
            }
        }
        let mut rust_designs = 0;
        for exercise in crate::EXERCISES {
            for design in designs(exercise).unwrap() {
                if design.lang != "rust" {
                    continue;
                }
                rust_designs += 1;
                let name = crate_name(&format!("{}/designs/{}", exercise.name, design.name))
                    .expect("a Rust design's Cargo.toml names its package");
                assert!(
                    taken.insert(name.clone()),
                    "{}: crate {name} is taken",
                    design.name
                );
            }
        }
        assert!(rust_designs > 0, "no Rust design to check");
    }

    #[test]
    fn a_design_naming_a_check_that_is_not_there_is_refused() {
        let expect: Expect =
            toml::from_str("about = \"x\"\n[fails]\nrace = \"race_reports\"\n").unwrap();
        assert_eq!(expect.fails["race"], "race_reports");
        assert!(
            toml::from_str::<Expect>("about = \"x\"\nfail = {}\n").is_err(),
            "an unknown field is refused"
        );
    }
}
