//! Lesson B: a payment charged once, with a Redis idempotency coordinator.
//!
//! A client pays through the payment service (`lab_services::payments`), which runs every charge
//! through the coordinator [`idem`] and charges the mock payment provider
//! (`lab_services::provider`). The helpers here are what every scenario of the lesson does: pay
//! and tell what the client saw, switch the service's policy or the provider's deduplication,
//! and show the two places where the truth is: the coordinator's record in Redis (read with
//! `GET` and `PTTL`) and the provider's own list of charges (read over HTTP).
//!
//! Each scenario module here has a folder of the same name under `scenarios/` (its texts and
//! expectations); `build.rs` lists the declared ones in the catalogue.

// The scenarios of this lesson, one module each (its folder under `scenarios/` has the same
// name, with `-` for `_`).
mod in_flight_modes;
pub mod keys;
pub mod provider_lost;
pub mod redis_down;
pub mod ttl_expiry;

use lab_core::{Msg, Table};
use lab_services::payments::{self, PaymentChange};
use lab_services::provider::{self, ProviderConfig};
use serde_json::Value;

pub use crate::kit::payments::{
    AMOUNT, CURRENCY, ORDER, Paid, TENANT, operation, pay, pay_as, pay_msg, provider_charges,
    provider_key, record_key, send_pay, show_charges,
};
use crate::kit::redis::{self, read_record};
use crate::scenario::Lesson;
use crate::{Ctx, ScenarioError};

/// The lesson: everything it keeps is in Redis and at the provider, so no tables of its own.
pub const LESSON: Lesson = Lesson {
    id: "B",
    order: 2,
    schema: "",
};

/// Switches the payment service (`PUT /config`): only the fields given change.
pub async fn configure_payments(ctx: &Ctx, change: PaymentChange) -> Result<(), ScenarioError> {
    ctx.configure(&payments::SPEC, &change).await.map(drop)
}

/// Switches the provider's deduplication by key.
pub async fn provider_dedup(ctx: &Ctx, on: bool) -> Result<(), ScenarioError> {
    let change = ProviderConfig { dedup_by_key: on };
    ctx.configure(&provider::SPEC, &change).await.map(drop)
}

/// A Redis key as the narrative shows it: without the run's own prefix, which changes every run.
pub fn shown_key(ctx: &Ctx, key: &str) -> String {
    key.strip_prefix(&ctx.space.prefix)
        .unwrap_or(key)
        .to_string()
}

/// Shows the coordinator's records for these client keys as they are in Redis now, each with
/// its TTL. In step mode, `s` reads them again (the TTLs have gone down since).
#[tracing::instrument(name = "lab.backstage", skip_all)]
pub async fn show_records(ctx: &Ctx, keys: &[&str]) -> Result<(), ScenarioError> {
    let conn = ctx.redis()?;
    // Each record's Redis key, and the key as the narrative shows it (without the run's
    // prefix).
    let keys: Vec<(String, String)> = keys
        .iter()
        .map(|key| {
            let redis_key = record_key(ctx, key);
            (redis_key.clone(), shown_key(ctx, &redis_key))
        })
        .collect();
    let table = records_table(conn.clone(), &keys).await?;
    let again = lab_core::narrator::reread(move || {
        let (conn, keys) = (conn.clone(), keys.clone());
        async move { records_table(conn, &keys).await.ok() }
    });
    ctx.narrator.state_view(table, again);
    Ok(())
}

/// A record's remaining life as the records table shows it: whole seconds, rounded up; from a
/// minute on, rounded up to 10 s. A table shows again the records written steps before (a
/// result kept for an hour), and a loaded machine can take a few seconds to get there: the
/// story must not change with the machine's speed (a CI run showed 3599 s where every other
/// run shows 3600 s). A lease of seconds is read in the step that takes it, and shown exactly.
fn shown_ttl(secs: i64) -> String {
    const STEP: u64 = 10;
    match u64::try_from(secs) {
        Ok(secs) if secs >= 60 => format!("{} s", secs.div_ceil(STEP) * STEP),
        _ => format!("{secs} s"),
    }
}

/// The coordinator's records at these Redis keys (each with the key it is shown as).
async fn records_table(
    mut conn: redis::Conn,
    keys: &[(String, String)],
) -> Result<Table, ScenarioError> {
    let mut rows = Vec::new();
    for (redis_key, shown) in keys {
        let row = match read_record(&mut conn, redis_key).await? {
            None => vec![
                shown.clone(),
                "(none)".into(),
                "".into(),
                "".into(),
                "".into(),
            ],
            Some(found) => {
                let result: Value =
                    serde_json::from_str(found.record.result.get()).unwrap_or(Value::Null);
                vec![
                    shown.clone(),
                    match found.record.status {
                        idem::Status::Pending => "pending",
                        idem::Status::Completed => "completed",
                    }
                    .to_string(),
                    found
                        .record
                        .fingerprint
                        .as_deref()
                        .map_or("NULL".to_string(), |f| format!("{}…", &f[..8.min(f.len())])),
                    result["charge_id"].as_str().unwrap_or("NULL").to_string(),
                    shown_ttl(found.ttl_secs),
                ]
            }
        };
        rows.push(row);
    }
    Ok(Table {
        title: Msg::new("table.redis_records"),
        columns: ["key", "status", "fingerprint", "result", "ttl"]
            .map(String::from)
            .to_vec(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::shown_ttl;

    /// A result kept for an hour reads the same a few seconds later; a lease shows its seconds.
    #[test]
    fn ttls_of_a_minute_or_more_are_shown_to_10_seconds() {
        assert_eq!(shown_ttl(3600), "3600 s");
        assert_eq!(shown_ttl(3599), "3600 s");
        assert_eq!(shown_ttl(3591), "3600 s");
        assert_eq!(shown_ttl(3590), "3590 s");
        assert_eq!(shown_ttl(86_400), "86400 s");
        assert_eq!(shown_ttl(60), "60 s");
        assert_eq!(shown_ttl(59), "59 s");
        assert_eq!(shown_ttl(30), "30 s");
        assert_eq!(shown_ttl(2), "2 s");
        assert_eq!(shown_ttl(-2), "-2 s");
    }
}
