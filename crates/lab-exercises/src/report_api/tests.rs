//! The judgements of `report-api`, rows and answers in, verdict key out; and the hostile
//! sample's reach.

use super::hostile::Hostile;
use super::staging::{self, Release, Staged};
use super::*;
use crate::judgement::{Stop, verdict_of};
use crate::verdict::Verdict;

fn sent(who: &str, status: Option<u16>, report_id: Option<i64>, replayed: bool) -> Sent {
    Sent {
        who: who.into(),
        path: "/reports".into(),
        key: Some("k".into()),
        body: report_body(7, "monthly"),
        status,
        answer: String::new(),
        no_answer: status.is_none().then_some("call.timed_out"),
        waited_ms: 40_000,
        json_body: status.is_some(),
        report_id,
        replayed: Some(replayed),
        charge_id: None,
        replayed_header: false,
        retry_after: None,
        outcome: Outcome::Ok,
    }
}

/// `call` as if it had sent `report_type`.
fn sending(mut call: Sent, report_type: &str) -> Sent {
    call.body = report_body(7, report_type);
    call
}

fn row(id: i64) -> ReportRow {
    ReportRow {
        id,
        task_id: 7,
        report_type: "monthly".into(),
        idempotency_key: Some("k".into()),
    }
}

fn key_of(judged: Judged) -> Option<String> {
    match verdict_of(judged).unwrap() {
        Verdict::Pass => None,
        other => Some(other.reason().unwrap().key.clone()),
    }
}

fn arg<'a>(judged: &'a Judged, name: &str) -> &'a lab_core::Arg {
    let Err(Stop::Verdict(verdict)) = judged else {
        panic!("no verdict: {judged:?}")
    };
    let msg = verdict.reason().unwrap();
    &msg.args.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn a_race_that_held_is_one_report_one_201_and_a_replay() {
    let calls = [
        sent("client.1", Some(201), Some(1), false),
        sent("client.2", Some(200), Some(1), true),
    ];
    assert_eq!(key_of(judge_race(&calls, &[row(1)], 7)), None);
}

#[test]
fn a_race_names_how_it_broke() {
    let both = [
        sent("client.1", Some(201), Some(1), false),
        sent("client.2", Some(201), Some(2), false),
    ];
    assert_eq!(
        key_of(judge_race(&both, &[row(1), row(2)], 7)).as_deref(),
        Some("broke.race_reports")
    );
    let two_created = [
        sent("client.1", Some(201), Some(1), false),
        sent("client.2", Some(201), Some(1), false),
    ];
    assert_eq!(
        key_of(judge_race(&two_created, &[row(1)], 7)).as_deref(),
        Some("broke.created")
    );
    let none = [
        sent("client.1", Some(409), None, false),
        sent("client.2", Some(409), None, false),
    ];
    assert_eq!(
        key_of(judge_race(&none, &[], 7)).as_deref(),
        Some("broke.reports")
    );
    let wrong_id = [
        sent("client.1", Some(201), Some(1), false),
        sent("client.2", Some(200), Some(9), true),
    ];
    assert_eq!(
        key_of(judge_race(&wrong_id, &[row(1)], 7)).as_deref(),
        Some("broke.other_id")
    );
}

#[test]
fn a_race_loser_is_told_by_what_it_got_and_what_its_answer_said() {
    let mut loser = sent("client.2", Some(500), None, false);
    loser.answer = r#"{"error": "could not serialize access"}"#.into();
    let calls = [sent("client.1", Some(201), Some(1), false), loser.clone()];
    let judged = judge_race(&calls, &[row(1)], 7);
    assert_eq!(
        key_of(judge_race(&calls, &[row(1)], 7)).as_deref(),
        Some("broke.race_loser")
    );
    let lab_core::Arg::Msg(what) = arg(&judged, "said") else {
        panic!("what the answer said is a message")
    };
    assert_eq!(what.key, "said.text");
    assert_eq!(
        what.args,
        [("text".into(), "could not serialize access".into())]
    );
    loser.answer = "Internal Server Error".into();
    assert_eq!(
        said(&loser).args,
        [("text".into(), "Internal Server Error".into())]
    );
    loser.answer = String::new();
    assert_eq!(said(&loser).key, "said.nothing");
}

#[test]
fn a_missing_answer_is_never_counted_as_a_wrong_status() {
    let silent = [
        sent("client.1", None, None, false),
        sent("client.2", None, None, false),
    ];
    assert_eq!(
        key_of(judge_race(&silent, &[row(1)], 7)).as_deref(),
        Some("broke.race_no_answer")
    );
    // A second report outweighs a silence: it is the invariant itself.
    assert_eq!(
        key_of(judge_race(&silent, &[row(1), row(2)], 7)).as_deref(),
        Some("broke.race_reports")
    );
}

#[test]
fn racing_contents_give_one_201_and_a_409_never_a_replay() {
    let monthly_won = [
        sent("client.1", Some(201), Some(1), false),
        sending(sent("client.2", Some(409), None, false), "yearly"),
    ];
    assert_eq!(key_of(judge_race(&monthly_won, &[row(1)], 7)), None);
    // Whoever comes first: the yearly report made, the monthly one refused.
    let mut yearly = row(1);
    yearly.report_type = "yearly".into();
    let yearly_won = [
        sent("client.1", Some(409), None, false),
        sending(sent("client.2", Some(201), Some(1), false), "yearly"),
    ];
    assert_eq!(key_of(judge_race(&yearly_won, &[yearly], 7)), None);
    let replayed_other = [
        sent("client.1", Some(201), Some(1), false),
        sending(sent("client.2", Some(200), Some(1), true), "yearly"),
    ];
    let judged = judge_race(&replayed_other, &[row(1)], 7);
    assert_eq!(
        key_of(judge_race(&replayed_other, &[row(1)], 7)).as_deref(),
        Some("broke.race_other_content")
    );
    assert_eq!(arg(&judged, "got"), &lab_core::Arg::Int(200));
    let mut plain = sending(sent("client.2", Some(409), None, false), "yearly");
    plain.json_body = false;
    let plain_refusal = [sent("client.1", Some(201), Some(1), false), plain];
    assert_eq!(
        key_of(judge_race(&plain_refusal, &[row(1)], 7)).as_deref(),
        Some("broke.not_json")
    );
}

#[test]
fn the_first_answer_names_its_report_and_says_it_is_new() {
    assert!(creates(&sent("client", Some(201), Some(1), false), &row(1)).is_ok());
    assert_eq!(
        key_of(creates(&sent("client", Some(201), Some(1), true), &row(1))).as_deref(),
        Some("broke.not_fresh")
    );
    let mut bare = sent("client", Some(201), Some(1), false);
    bare.replayed = None;
    assert_eq!(
        key_of(creates(&bare, &row(1))).as_deref(),
        Some("broke.not_fresh")
    );
    assert_eq!(
        key_of(creates(&sent("client", Some(201), Some(2), false), &row(1))).as_deref(),
        Some("broke.other_id")
    );
    assert_eq!(
        key_of(creates(&sent("client", Some(200), Some(1), false), &row(1))).as_deref(),
        Some("broke.status")
    );
}

#[test]
fn a_replay_must_say_so_and_name_the_stored_report() {
    assert!(replays(&sent("client", Some(200), Some(1), true), &row(1)).is_ok());
    let Err(Stop::Verdict(Verdict::Fail(msg))) =
        replays(&sent("client", Some(200), Some(1), false), &row(1))
    else {
        panic!("a replay without `replayed` passed")
    };
    assert_eq!(msg.key, "broke.not_replayed");
    let Err(Stop::Verdict(Verdict::Fail(msg))) =
        replays(&sent("client", None, None, false), &row(1))
    else {
        panic!("no answer passed")
    };
    assert_eq!(msg.key, "broke.status");
    let lab_core::Arg::Msg(got) = &msg.args[2].1 else {
        panic!("no answer is said in words")
    };
    assert_eq!(got.key, "call.no_answer");
}

#[test]
fn a_retry_that_makes_a_second_report_is_named_for_when_it_came() {
    let retry = sent("client", Some(201), Some(2), false);
    assert_eq!(
        key_of(judge_retry(&retry, &[row(1)], &[row(1), row(2)], 7, true)).as_deref(),
        Some("broke.crash_forgot")
    );
    assert_eq!(
        key_of(judge_retry(&retry, &[row(1)], &[row(1), row(2)], 7, false)).as_deref(),
        Some("broke.retry_made")
    );
    let replay = sent("client", Some(200), Some(1), true);
    assert_eq!(
        key_of(judge_retry(&replay, &[row(1)], &[row(1)], 7, true)),
        None
    );
    // Two reports already before the retry: not the retry's doing.
    assert_eq!(
        key_of(judge_retry(
            &replay,
            &[row(1), row(2)],
            &[row(1), row(2)],
            7,
            true
        ))
        .as_deref(),
        Some("broke.reports")
    );
}

#[test]
fn the_longest_key_is_accepted_and_the_invalid_ones_refused() {
    let refused = || sent("client", Some(400), None, false);
    let invalid = [refused(), refused(), refused()];
    let created = sent("client", Some(201), Some(1), false);
    assert_eq!(
        key_of(judge_keys(&invalid, &[], 4, &created, &[row(1)], 7)),
        None
    );
    let off_by_one = sent("client", Some(400), None, false);
    assert_eq!(
        key_of(judge_keys(&invalid, &[], 4, &off_by_one, &[], 7)).as_deref(),
        Some("broke.longest_key")
    );
    assert_eq!(
        key_of(judge_keys(&invalid, &[row(9)], 4, &created, &[row(1)], 7)).as_deref(),
        Some("broke.invalid_stored")
    );
}

fn request(refused: bool) -> Hostile {
    Hostile {
        label: "task_id_zero",
        body: report_body(0, "monthly"),
        key: None,
        task: Some(0),
        refused,
    }
}

#[test]
fn a_malformed_request_gets_a_json_4xx_and_no_report_never_a_5xx() {
    let mut refused = sent("null", Some(422), None, false);
    assert!(judge_hostile(&request(true), &refused, None).is_ok());
    refused.json_body = false;
    assert_eq!(
        key_of(judge_hostile(&request(true), &refused, None)).as_deref(),
        Some("broke.not_json")
    );
    assert_eq!(
        key_of(judge_hostile(
            &request(true),
            &sent("null", Some(500), None, false),
            None
        ))
        .as_deref(),
        Some("broke.server_error")
    );
    assert_eq!(
        key_of(judge_hostile(
            &request(true),
            &sent("null", None, None, false),
            None
        ))
        .as_deref(),
        Some("broke.no_answer")
    );
    let accepted = sent("task_id_zero", Some(201), Some(5), false);
    assert_eq!(
        key_of(judge_hostile(&request(true), &accepted, None)).as_deref(),
        Some("broke.accepted_malformed")
    );
    assert_eq!(
        key_of(judge_hostile(&request(true), &accepted, Some(&row(5)))).as_deref(),
        Some("broke.malformed_stored")
    );
    // What the contract leaves open may be accepted, and make its report.
    assert!(judge_hostile(&request(false), &accepted, Some(&row(5))).is_ok());
}

#[test]
fn the_hostile_sample_crosses_each_bound_and_every_label_has_its_words() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let sample = hostile_sample(30, &mut rng);
    let bodies: Vec<serde_json::Value> = sample
        .iter()
        .filter_map(|r| serde_json::from_str(&r.body).ok())
        .collect();
    let types: Vec<&str> = bodies
        .iter()
        .filter_map(|b| b.get("report_type")?.as_str())
        .collect();
    assert!(types.contains(&""));
    assert!(types.iter().any(|t| t.chars().count() == 65));
    assert!(types.iter().any(|t| t.chars().any(char::is_control)));
    let tasks: Vec<i64> = bodies
        .iter()
        .filter_map(|b| b.get("task_id")?.as_i64())
        .collect();
    assert!(tasks.contains(&0) && tasks.contains(&-1));
    // A report could be told apart by its task: no two requests share one.
    let mut own: Vec<i64> = sample.iter().filter_map(|r| r.task).collect();
    let count = own.len();
    own.dedup();
    assert_eq!(own.len(), count);
    assert_eq!(
        sample
            .iter()
            .filter(|r| !r.refused)
            .map(|r| r.label)
            .collect::<Vec<_>>(),
        ["long_key", "unknown_field"]
    );
    let texts = crate::texts().unwrap();
    for request in &sample {
        for lang in lab_core::Lang::ALL {
            let key = format!("who.{}", request.label);
            assert!(texts.get("report-api", lang, &key).is_some(), "{key}");
        }
    }
}

fn staged(release: Release, ever_waited: bool, answers: Vec<Sent>) -> Staged {
    Staged {
        release,
        ever_waited,
        waiting: 1,
        answered: 0,
        absent: 1,
        held_for: Duration::from_millis(700),
        answers: answers
            .into_iter()
            .map(|sent| (sent, Duration::from_millis(600)))
            .collect(),
    }
}

#[test]
fn a_staged_moment_is_told_by_how_the_lab_let_go() {
    let two = || {
        vec![
            sent("client.1", Some(201), Some(1), false),
            sent("client.2", Some(200), Some(1), true),
        ]
    };
    let key = |told: Result<lab_core::Msg, lab_core::Msg>| match told {
        Ok(step) => format!("ok {}", step.key),
        Err(why) => format!("unknown {}", why.key),
    };
    assert_eq!(
        key(release_told(&staged(Release::Met, true, two()))),
        "ok step.race_release"
    );
    assert_eq!(
        key(release_told(&staged(
            Release::HeldBack {
                quiet: staging::QUIET
            },
            true,
            two()
        ))),
        "ok step.race_release_held"
    );
    assert_eq!(
        key(release_told(&staged(Release::Limit, true, two()))),
        "ok step.race_release_limit"
    );
    // Nothing ever waited for the lab: no race, whatever else happened.
    assert_eq!(
        key(release_told(&staged(Release::Limit, false, two()))),
        "unknown unknown.no_race"
    );
    assert_eq!(
        key(release_told(&staged(Release::AllEnded, false, two()))),
        "unknown unknown.no_race"
    );
    // A request the service ended on its own under the hold: named, with what it got.
    let gave_up = vec![
        sent("client.1", Some(503), None, false),
        sent("client.2", Some(201), Some(1), false),
    ];
    let told = release_told(&staged(Release::GaveUp { call: 0 }, true, gave_up));
    let Err(why) = told else {
        panic!("a spoilt moment is told as an unknown")
    };
    assert_eq!(why.key, "unknown.race_gave_up");
    assert_eq!(why.args[1].1, lab_core::Arg::Int(503));
}

#[test]
fn a_conflict_is_refused_field_by_field_and_changes_nothing_the_key_stands_for() {
    let conflicted = || Conflicted {
        first: sent("client", Some(201), Some(1), false),
        other_type: sent("client", Some(409), None, false),
        other_task: sent("client", Some(409), None, false),
        again: sent("client", Some(200), Some(1), true),
    };
    assert_eq!(
        key_of(judge_conflict(&conflicted(), &[row(1)], 7, &[], 13)),
        None
    );
    let mut replayed_other_task = conflicted();
    replayed_other_task.other_task = sent("client", Some(200), Some(1), true);
    let judged = judge_conflict(&replayed_other_task, &[row(1)], 7, &[], 13);
    assert_eq!(arg(&judged, "field"), &lab_core::Arg::from("task_id"));
    assert_eq!(key_of(judged).as_deref(), Some("broke.not_conflict"));
    let mut stored_other_task = conflicted();
    stored_other_task.other_task = sent("client", Some(409), None, false);
    let mut other = row(2);
    other.task_id = 13;
    assert_eq!(
        key_of(judge_conflict(
            &stored_other_task,
            &[row(1)],
            7,
            &[other],
            13
        ))
        .as_deref(),
        Some("broke.conflict_stored")
    );
    // The first content after the refusals: still its replay.
    let mut forgotten = conflicted();
    forgotten.again = sent("client", Some(409), None, false);
    assert_eq!(
        key_of(judge_conflict(&forgotten, &[row(1)], 7, &[], 13)).as_deref(),
        Some("broke.status")
    );
}
