//! Exercise `hello`: what it teaches, and the table of its checks.
//!
//! | check    | the schedule       | the invariant                   |
//! |----------|--------------------|---------------------------------|
//! | `greets` | one `POST /hello`  | 201, with a JSON body           |
use std::time::Duration;

use lab_core::Msg;

use crate::call::Call;
use crate::error::ExerciseError;
use crate::exercise::{Check, Checked, Checks, Exercise, Setup, Subject};
use crate::judgement::{Judged, broke, fail};
use crate::rig::{Program, Rig, World, run_checks};

pub static EXERCISE: Exercise = Exercise {
    name: "hello",
    lesson: "reports",
    needs: lab_infra::Needs {
        postgres: false,
        redis: false,
    },
    langs: &["python"],
    rust_uses_idem: false,
    checks: &CHECKS,
    open: |setup| Box::pin(open(setup)),
};

static CHECKS: Checks<Hello> =
    Checks(&[Check::new("greets", |w| Box::pin(greets(w))).starter_fails()]);

/// What the checks work with: the rig, and nothing of its own yet.
pub struct Hello {
    rig: Rig,
}

impl World for Hello {
    fn rig(&mut self) -> &mut Rig {
        &mut self.rig
    }

    async fn close(self) {
        self.rig.close().await;
    }
}

async fn open(setup: Setup<'_>) -> Result<Checked, ExerciseError> {
    let Subject::Program { dir, manifest } = setup.subject else {
        return Err(ExerciseError::TargetNotApplicable {
            exercise: "hello",
            why: "its checks start the program",
        });
    };
    let run = lab_infra::space::new_run_id();
    let mut rig = Rig::new(&run, setup.options, Some(Program { dir, manifest }));
    rig.build().await?;
    let env = rig.env();
    if let Err(not_ready) = rig.start_service(env).await? {
        rig.close().await;
        return Ok(Checked::NotReady(not_ready));
    }
    let world = Hello { rig };
    let reports = run_checks(&CHECKS, world, setup.options, setup.on_report).await?;
    Ok(Checked::Reports(reports))
}

async fn greets(w: &mut Hello) -> Judged {
    w.rig.step(Msg::new("step.greet"));
    let url = format!("{}/hello", w.rig.service_url());
    let call = Call::post("client", url, None, "{}".into(), Duration::from_secs(10));
    let answer = w.rig.send(call).await;
    if answer.status != Some(201) || !answer.json_body {
        return fail(broke("no_greeting").arg("status", answer.status_arg()));
    }
    Ok(())
}
