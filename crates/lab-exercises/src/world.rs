//! The loop every exercise's checks share: pick the selected checks in the catalogue's order,
//! run each in the exercise's world (what its checks work with: the arena of `report-api`, the
//! yard of `worker`, the rig of `charge-once`, ...), make the world whole again after it, keep
//! the program's output beside a check that did not pass, and report each check as it ends.

use crate::catalogue::{CheckSpec, Exercise};
use crate::error::ExerciseError;
use crate::guest::Mark;
use crate::verdict::{CheckReport, Line, Verdict};

/// What one exercise's checks work with.
pub(crate) trait World {
    /// The schedule the current check records.
    fn schedule(&mut self) -> &mut Vec<Line>;

    /// The verdict of a check that cannot run here (without running it), if any.
    fn skipped(&self, _spec: &CheckSpec) -> Option<Verdict> {
        None
    }

    /// Where the program's output stands before a check.
    fn mark(&self) -> Mark {
        Mark::default()
    }

    /// Runs the check `name`.
    async fn check(&mut self, name: &str) -> Result<Verdict, ExerciseError>;

    /// Makes the world whole again after a check: faults disarmed, links restored, what the
    /// check started stopped.
    async fn after(&mut self) {}

    /// What the program printed during the check (since `mark`), if anything.
    async fn output(&self, mark: &Mark) -> Option<String>;

    /// Stops everything the world started.
    async fn close(self);
}

/// Runs the checks of `exercise` that `only` selects (all when empty) in `world`, calling
/// `on_report` as each ends; `seed` is reported with the checks that explore from it. The world
/// is closed on every way out.
pub(crate) async fn run_checks<W: World>(
    exercise: &'static Exercise,
    mut world: W,
    only: &[String],
    seed: u64,
    on_report: &mut dyn FnMut(&CheckReport),
) -> Result<Vec<CheckReport>, ExerciseError> {
    let mut reports = Vec::new();
    for spec in exercise.checks {
        if !only.is_empty() && !only.iter().any(|o| o == spec.name) {
            continue;
        }
        world.schedule().clear();
        let mark = world.mark();
        let verdict = match world.skipped(spec) {
            Some(verdict) => Ok(verdict),
            None => world.check(spec.name).await,
        };
        world.after().await;
        let verdict = match verdict {
            Ok(verdict) => verdict,
            Err(e) => {
                world.close().await;
                return Err(e);
            }
        };
        let output = match verdict {
            Verdict::Fail(_) | Verdict::Unknown(_) => world.output(&mark).await,
            _ => None,
        };
        let report = CheckReport {
            name: spec.name,
            verdict,
            schedule: std::mem::take(world.schedule()),
            seed: spec.seeded.then_some(seed),
            output,
        };
        on_report(&report);
        reports.push(report);
    }
    world.close().await;
    Ok(reports)
}
