//! The contract between the lab and a learner's program, whatever its language: the environment
//! variables the lab starts it with. This is the one place they are written down; each
//! exercise's README says which of them its program gets.
//!
//! | variable         | exercises                             | what it is                                            |
//! |------------------|---------------------------------------|-------------------------------------------------------|
//! | `HOST`           | every one                             | `127.0.0.1`: the only address to listen on            |
//! | `PORT`           | the services                          | the port to listen on                                  |
//! | `LAB_RUN`        | every one                             | the run's id (eight hex digits), for log lines         |
//! | `DATABASE_URL`   | report-api, worker                    | `postgresql://…?options=-csearch_path%3Dlab_…`: the run's schema, with a role that owns it and nothing else |
//! | `REDIS_URL`      | charge-once, invoice-consumer         | `redis://127.0.0.1:…/0`, through the lab's fault proxy |
//! | `KEY_PREFIX`     | charge-once, invoice-consumer         | every key the program writes starts with it            |
//! | `LEASE_SECONDS`  | worker, charge-once, invoice-consumer | the lease to take (a task's, a reservation's)          |
//! | `PROVIDER_URL`   | charge-once                           | the lab's payment provider, through the fault proxy    |
//! | `PAYMENTS_URL`   | relay                                 | the lab's payment service, through the fault proxy     |
//! | `REPORTS_URL`    | worker                                | the lab's report service, the worker's own door to it  |
//! | `MAILER_URL`     | invoice-consumer                      | the lab's mailer                                       |
//! | `TASK_ID`        | worker                                | the task this run of the worker processes              |
//! | `WORKER`         | worker                                | `A` or `B`: which worker this is, for log lines        |
//! | `STRICT`         | worker                                | `true` or `false`, from the manifest's `strict`        |
//! | `STREAM`, `GROUP`, `CONSUMER`, `CLAIM_IDLE_MS` | invoice-consumer | the stream to read, its consumer group, this consumer's name, the idle time after which a pending entry is claimed again |
//! | `PYTHONUNBUFFERED` | every one                           | `1`: a Python program prints as it goes, so the lab can show why it never answered |
//!
//! Everything else of the learner's own environment is passed on, except the lab's own settings
//! (`LAB_*`, `DATABASE_URL`, `REDIS_URL`, `TOXIPROXY_URL`): the program sees only its run.

/// The variable that carries the run's id, in every process the program starts: how the next
/// `lab` finds what a killed one left (`lab_infra::leftovers`).
pub const RUN_VAR: &str = "LAB_RUN";

/// The environment of one start of the learner's program.
#[derive(Debug, Clone, Default)]
pub struct GuestEnv {
    pub run: String,
    pub port: Option<u16>,
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    pub key_prefix: Option<String>,
    pub lease_seconds: Option<u64>,
    pub provider_url: Option<String>,
    pub payments_url: Option<String>,
    pub reports_url: Option<String>,
    pub mailer_url: Option<String>,
    pub task_id: Option<i64>,
    pub worker: Option<String>,
    pub strict: Option<bool>,
    pub stream: Option<String>,
    pub group: Option<String>,
    pub consumer: Option<String>,
    pub claim_idle_ms: Option<u64>,
    /// More, from the caller of the check (`verify` gives a Cargo target folder).
    pub extra: Vec<(String, String)>,
}

impl GuestEnv {
    /// The environment of a run's program, with nothing but the run's id yet.
    pub fn new(run: &str, extra: &[(String, String)]) -> GuestEnv {
        GuestEnv {
            run: run.to_string(),
            extra: extra.to_vec(),
            ..GuestEnv::default()
        }
    }

    /// The variables, as the program gets them.
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut vars = vec![
            ("HOST".to_string(), "127.0.0.1".to_string()),
            (RUN_VAR.to_string(), self.run.clone()),
            ("PYTHONUNBUFFERED".to_string(), "1".to_string()),
        ];
        let mut put = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                vars.push((name.to_string(), value));
            }
        };
        put("PORT", self.port.map(|p| p.to_string()));
        put("DATABASE_URL", self.database_url.clone());
        put("REDIS_URL", self.redis_url.clone());
        put("KEY_PREFIX", self.key_prefix.clone());
        put("LEASE_SECONDS", self.lease_seconds.map(|s| s.to_string()));
        put("PROVIDER_URL", self.provider_url.clone());
        put("PAYMENTS_URL", self.payments_url.clone());
        put("REPORTS_URL", self.reports_url.clone());
        put("MAILER_URL", self.mailer_url.clone());
        put("TASK_ID", self.task_id.map(|t| t.to_string()));
        put("WORKER", self.worker.clone());
        put("STRICT", self.strict.map(|s| s.to_string()));
        put("STREAM", self.stream.clone());
        put("GROUP", self.group.clone());
        put("CONSUMER", self.consumer.clone());
        put("CLAIM_IDLE_MS", self.claim_idle_ms.map(|ms| ms.to_string()));
        vars.extend(self.extra.iter().cloned());
        vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_set_is_given_and_the_callers_extra_comes_last() {
        let mut env = GuestEnv::new("0a1b2c3d", &[("CARGO_TARGET_DIR".into(), "/t".into())]);
        env.port = Some(8000);
        env.strict = Some(false);
        let vars = env.vars();
        let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "HOST",
                "LAB_RUN",
                "PYTHONUNBUFFERED",
                "PORT",
                "STRICT",
                "CARGO_TARGET_DIR"
            ]
        );
        assert!(vars.contains(&("STRICT".into(), "false".into())));
    }
}
