//! What every exercise's world is built on: the [`Rig`]. An exercise's world (its module's
//! `ReportApi`, `Worker`, …) is a `Rig` plus what only that exercise has (a table to read, a
//! provider, a stream); the rig has what they all share:
//!
//! - the schedule the current check records (`step`, `send`, `record`), with the lab's client
//!   (one connection per call);
//! - the learner's program: how it is built and started (its folder, its manifest, the
//!   [`GuestEnv`] it gets), as a service that listens (`start_service`, started again with
//!   another environment when a check needs it) or as one-shot jobs named by the check (`A`,
//!   `B`: workers, consumers);
//! - the fault proxies of the run, the checkpoints inside the lab's own services, and those
//!   services, all stopped when the rig closes;
//! - the program's output kept aside, and shown beside a check that did not pass.
//!
//! [`run_checks`] is the one loop every exercise runs its checks with: the selected checks in
//! their order, each in a fresh schedule, the world made whole after each, each reported as it
//! ends, and the world closed on every way out.

use std::path::PathBuf;
use std::time::Duration;

use lab_core::{Checkpoints, Msg};
use lab_services::spec::{RunningService, ServiceEnv, ServiceSpec};

use crate::call::{Call, send};
use crate::error::ExerciseError;
use crate::exercise::{CheckOptions, CheckSpec, Checks};
use crate::guest::{Guest, Mark, NotReady};
use crate::guest_env::GuestEnv;
use crate::judgement::{Judged, verdict_of};
use crate::manifest::Manifest;
use crate::verdict::{CheckReport, Line, Sent, Verdict};

/// How long the program's output must stay the same before it is shown beside a check, and the
/// longest the lab waits for that.
const OUTPUT_SETTLE: Duration = Duration::from_millis(150);
const OUTPUT_PATIENCE: Duration = Duration::from_secs(1);

/// The learner's program, as the lab starts it.
#[derive(Debug, Clone)]
pub struct Program {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// What every world is built on (see the module's documentation).
pub struct Rig {
    /// The run's id: in keys, names, and the program's `LAB_RUN`.
    pub run: String,
    /// What the current check records.
    pub schedule: Vec<Line>,
    /// The lab's client: one connection per call.
    pub http: reqwest::Client,
    /// The run's fault proxies; dropping the registry stops them.
    pub proxies: faultproxy::FaultProxy,
    /// The points inside the lab's own services where a check holds a call.
    pub checkpoints: Checkpoints,
    /// The seed of the checks that explore, and how often they repeat.
    pub seed: u64,
    pub repeat: u32,
    /// The learner's program; `None` when the lab checks a service it did not start
    /// (`--target`).
    program: Option<Program>,
    /// More environment for every start of the program (from the caller of the check).
    extra_env: Vec<(String, String)>,
    /// The learner's service, while it runs.
    pub guest: Option<Guest>,
    /// The current check's one-shot runs of the program, by the name the check gave them.
    jobs: Vec<(String, Guest)>,
    /// The lab's own services of this run.
    services: Vec<RunningService>,
    /// Where the service's output stood when the current check began.
    mark: Mark,
}

impl Rig {
    pub fn new(run: &str, options: &CheckOptions, program: Option<Program>) -> Rig {
        Rig {
            run: run.to_string(),
            schedule: Vec::new(),
            http: crate::call::client(),
            proxies: faultproxy::FaultProxy::new(),
            checkpoints: Checkpoints::new(),
            seed: options.seed,
            repeat: options.repeat,
            program,
            extra_env: options.guest_env.clone(),
            guest: None,
            jobs: Vec::new(),
            services: Vec::new(),
            mark: Mark::default(),
        }
    }

    /// What the lab does next, in the check's words.
    pub fn step(&mut self, msg: Msg) {
        self.schedule.push(Line::Step(msg));
    }

    pub fn record(&mut self, line: Line) {
        self.schedule.push(line);
    }

    /// Sends one call, and records it.
    pub async fn send(&mut self, call: Call) -> Sent {
        let sent = send(&self.http, call).await;
        self.schedule.push(Line::Call(sent.clone()));
        sent
    }

    /// The environment every start of the program begins with: the run's id, and what the
    /// caller of the check added.
    pub fn env(&self) -> GuestEnv {
        GuestEnv::new(&self.run, &self.extra_env)
    }

    /// Whether the lab started the program (and so may kill it and start it again).
    pub fn owns_program(&self) -> bool {
        self.program.is_some()
    }

    pub fn manifest(&self) -> Option<&Manifest> {
        self.program.as_ref().map(|p| &p.manifest)
    }

    fn program(&self) -> Result<&Program, ExerciseError> {
        self.program
            .as_ref()
            .ok_or(ExerciseError::ServerMissing("the learner's program"))
    }

    /// Runs the manifest's build step, if any.
    pub async fn build(&self) -> Result<(), ExerciseError> {
        let program = self.program()?;
        Guest::new(&program.dir, program.manifest.clone(), 0, self.env().vars())?
            .build()
            .await
    }

    /// Starts the learner's service (stopping the one that runs) with `env` on a free port,
    /// and waits until it answers `GET /health`.
    pub async fn start_service(
        &mut self,
        env: GuestEnv,
    ) -> Result<Result<(), NotReady>, ExerciseError> {
        if let Some(mut old) = self.guest.take() {
            old.stop().await;
        }
        let program = self.program()?.clone();
        let (guest, started) =
            Guest::start_on_a_free_port(&program.dir, program.manifest, env).await?;
        self.guest = Some(guest);
        Ok(started.map(drop))
    }

    /// The base URL of the learner's service (empty while none runs).
    pub fn service_url(&self) -> String {
        self.guest
            .as_ref()
            .map_or_else(String::new, Guest::base_url)
    }

    /// Kills the learner's service with its group: a crash, nothing flushed.
    pub async fn kill_service(&mut self) {
        if let Some(guest) = self.guest.as_mut() {
            guest.kill().await;
        }
    }

    /// Starts the service again with the environment it had, and waits until it answers.
    pub async fn restart_service(&mut self) -> Result<Result<(), NotReady>, ExerciseError> {
        let Some(guest) = self.guest.as_mut() else {
            return Err(ExerciseError::ServerMissing("the learner's service"));
        };
        Ok(guest.start().await?.map(drop))
    }

    /// Starts a one-shot run of the program named `who` (a worker, a consumer) with `env`, and
    /// keeps it, for its output, until the check ends.
    pub async fn launch_job(&mut self, who: &str, env: GuestEnv) -> Result<(), ExerciseError> {
        let program = self.program()?.clone();
        let mut job = Guest::new(&program.dir, program.manifest, 0, env.vars())?;
        job.launch().await?;
        self.jobs.push((who.to_string(), job));
        Ok(())
    }

    /// Waits, at most `limit`, for job `who` to exit: its exit code (`None` if a signal ended
    /// it), or `Err` if it still ran (it is killed then).
    pub async fn finish_job(&mut self, who: &str, limit: Duration) -> Result<Option<i32>, ()> {
        match self.job(who) {
            Some(job) => job.finish(limit).await,
            None => Ok(None),
        }
    }

    /// Job `who`, while the check keeps it.
    pub fn job(&mut self, who: &str) -> Option<&mut Guest> {
        self.jobs
            .iter_mut()
            .find(|(name, _)| name == who)
            .map(|(_, job)| job)
    }

    /// Kills job `who` with its group.
    pub async fn kill_job(&mut self, who: &str) {
        if let Some(job) = self.job(who) {
            job.kill().await;
        }
    }

    /// Starts one of the lab's own services on a loopback port of its own, stopped when the rig
    /// closes; its base URL.
    pub fn launch(
        &mut self,
        spec: &'static ServiceSpec,
        env: ServiceEnv,
    ) -> Result<String, ExerciseError> {
        let service = crate::lab_side::launch(spec, env)?;
        let url = service.url();
        self.services.push(service);
        Ok(url)
    }

    /// A fault proxy named `name` (in this run) in front of `upstream` (`host:port`).
    pub async fn proxy(
        &self,
        name: &str,
        upstream: &str,
    ) -> Result<faultproxy::Proxy, ExerciseError> {
        let info = self
            .proxies
            .create(
                &format!("exercise-{}-{name}", self.run),
                "127.0.0.1:0",
                upstream,
            )
            .await?;
        Ok(self.proxies.get(&info.name).expect("just created"))
    }

    /// A fresh schedule, and the output marked, for the next check.
    async fn begin_check(&mut self) {
        self.schedule.clear();
        self.stop_jobs().await;
        self.jobs.clear();
        self.mark = self.guest.as_ref().map(Guest::mark).unwrap_or_default();
    }

    async fn stop_jobs(&mut self) {
        for (_, job) in &mut self.jobs {
            job.stop().await;
        }
    }

    /// How much the program's copies have printed, all together.
    fn printed(&self) -> u64 {
        let service = self.guest.as_ref().map_or(0, Guest::printed);
        service + self.jobs.iter().map(|(_, job)| job.printed()).sum::<u64>()
    }

    /// What the program printed during the current check: the service's lines since the check
    /// began, and each job's, named. A program writes its traceback after the answer it sends
    /// (uvicorn logs a 500 once it went out), so the output is read once it has stopped growing
    /// for [`OUTPUT_SETTLE`], waiting at most [`OUTPUT_PATIENCE`]: what is shown, not an order.
    pub async fn output(&self) -> Option<String> {
        let started = std::time::Instant::now();
        let mut seen = self.printed();
        while started.elapsed() < OUTPUT_PATIENCE {
            tokio::time::sleep(OUTPUT_SETTLE).await;
            let now = self.printed();
            if now == seen {
                break;
            }
            seen = now;
        }
        let mut said = Vec::new();
        if let Some(guest) = &self.guest
            && let Some(output) = guest.said_since(&self.mark).await
        {
            said.push(output);
        }
        for (who, job) in &self.jobs {
            let output = job.output().await;
            if !output.trim().is_empty() {
                said.push(format!("[{who}]\n{output}"));
            }
        }
        (!said.is_empty()).then(|| said.join("\n"))
    }

    /// Stops everything the rig started: the program, its jobs, the lab's services, the proxies.
    pub async fn close(mut self) {
        if let Some(mut guest) = self.guest.take() {
            guest.stop().await;
        }
        self.stop_jobs().await;
        for service in self.services.drain(..) {
            service.stop().await;
        }
    }
}

/// What one exercise's checks work with: its rig, and what is its own.
pub(crate) trait World: Sized {
    fn rig(&mut self) -> &mut Rig;

    /// Readies the world for the check `spec` names, whatever ran before it (the checks run in
    /// any order): e.g. a program an earlier check changed, started again. A judgement here
    /// (could not decide) stands for the check's.
    async fn before(&mut self, _spec: &CheckSpec) -> Judged {
        Ok(())
    }

    /// Makes the world whole again after a check: faults disarmed, links restored.
    async fn after(&mut self) {}

    /// Stops everything the world started.
    async fn close(self);
}

/// Runs the checks `options` selects, in the order it says ([`CheckOptions::ordered`]), in
/// `world`, reporting each to `on_report` as it ends; the world is closed on every way out.
pub(crate) async fn run_checks<W: World>(
    checks: &Checks<W>,
    mut world: W,
    options: &CheckOptions,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Vec<CheckReport>, ExerciseError> {
    let mut reports = Vec::new();
    let names: Vec<&str> = checks.0.iter().map(|check| check.spec.name).collect();
    for name in options.ordered(&names) {
        let check = checks
            .0
            .iter()
            .find(|check| check.spec.name == name)
            .expect("ordered names only the exercise's checks");
        let spec = check.spec;
        world.rig().begin_check().await;
        let judged: Judged = if spec.restarts && !world.rig().owns_program() {
            crate::judgement::skipped(Msg::new("skipped.target"))
        } else {
            match world.before(&spec).await {
                Ok(()) => (check.run)(&mut world).await,
                Err(stop) => Err(stop),
            }
        };
        world.after().await;
        let verdict = match verdict_of(judged) {
            Ok(verdict) => verdict,
            Err(error) => {
                world.close().await;
                return Err(error);
            }
        };
        let output = match verdict {
            Verdict::Fail(_) | Verdict::Unknown(_) => world.rig().output().await,
            _ => None,
        };
        let report = CheckReport {
            name: spec.name,
            verdict,
            schedule: std::mem::take(&mut world.rig().schedule),
            seed: spec.seeded.then_some(options.seed),
            output,
        };
        on_report(&report);
        reports.push(report);
    }
    world.close().await;
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::exercise::Check;
    use crate::judgement::{undecided, unknown};

    /// A world that writes down what is done to it, and cannot be readied for one check.
    struct Diary {
        rig: Rig,
        entries: Arc<Mutex<Vec<String>>>,
        unready_for: &'static str,
    }

    impl Diary {
        fn write(&self, entry: String) {
            self.entries.lock().unwrap().push(entry);
        }
    }

    impl World for Diary {
        fn rig(&mut self) -> &mut Rig {
            &mut self.rig
        }

        async fn before(&mut self, spec: &CheckSpec) -> Judged {
            self.write(format!("before {}", spec.name));
            if spec.name == self.unready_for {
                return unknown(undecided("no_restart"));
            }
            Ok(())
        }

        async fn after(&mut self) {
            self.write("after".into());
        }

        async fn close(self) {
            self.write("close".into());
        }
    }

    async fn runs(w: &mut Diary, name: &str) -> Judged {
        w.write(format!("run {name}"));
        Ok(())
    }

    static CHECKS: Checks<Diary> = Checks(&[
        Check::new("first", |w| Box::pin(runs(w, "first"))),
        Check::new("second", |w| Box::pin(runs(w, "second"))),
        Check::new("third", |w| Box::pin(runs(w, "third"))),
    ]);

    /// Every check is readied before it runs, in the order the options give; a world that
    /// could not be readied for a check makes that check "could not decide", and the check
    /// does not run on it.
    #[tokio::test]
    async fn each_check_is_readied_before_it_runs_and_an_unready_world_is_undecided() {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let options = CheckOptions {
            only: Vec::new(),
            seed: 1,
            repeat: CheckOptions::REPEAT,
            guest_env: Vec::new(),
            first: vec!["third".into()],
            restarts_beside: false,
        };
        let world = Diary {
            rig: Rig::new("test", &options, None),
            entries: entries.clone(),
            unready_for: "second",
        };
        let reports = run_checks(&CHECKS, world, &options, &mut |_| {})
            .await
            .unwrap();

        let entries = entries.lock().unwrap().clone();
        let expected = [
            "before third",
            "run third",
            "after",
            "before first",
            "run first",
            "after",
            "before second",
            "after",
            "close",
        ];
        assert_eq!(entries, expected);
        let verdicts: Vec<_> = reports.iter().map(|r| (r.name, &r.verdict)).collect();
        assert!(matches!(
            verdicts[..],
            [
                ("third", Verdict::Pass),
                ("first", Verdict::Pass),
                ("second", Verdict::Unknown(_)),
            ]
        ));
    }
}
