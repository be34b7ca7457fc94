//! `lab class`'s board in headless Chromium, with two learners posting live: the grid, the
//! commonest broken invariant, names shown as text (a name made of HTML stays text), projector
//! mode hiding names, and the token taken out of the address bar. It saves the screenshot the
//! instructor's guide shows (docs/img/class-board.png).
//!
//! It needs the browser, so it is `#[ignore]`d: `.ci/run` installs chromium and
//! chromium-driver and runs it with `--ignored`, beside the run's web view tests.

use serde_json::{Value, json};

use crate::class::ClassBoard;
use crate::common::{repo, shared_tempdir};
use crate::webdriver::{self, Driver, Session};
use lab_class::{Kind, VerdictPost};

/// Waits until `condition` (a JavaScript expression) is truthy on the page, and returns it.
async fn until(page: &Session, condition: &str) -> Value {
    page.eval_async(
        &format!(
            "const check = () => {{ let v; try {{ v = ({condition}); }} catch (e) {{ v = null; }}
               if (v) done(v); else setTimeout(check, 50); }};
             check();"
        ),
        json!([]),
    )
    .await
}

fn verdict(
    check: &str,
    kind: Kind,
    key: Option<&str>,
    reason: Option<(&str, &str)>,
) -> VerdictPost {
    VerdictPost {
        exercise: "report-api".into(),
        check: check.into(),
        verdict: kind,
        reason_key: key.map(str::to_string),
        reason: reason.map(|(en, ru)| lab_class::model::Reason {
            en: en.to_string(),
            ru: ru.to_string(),
        }),
        replay: key.map(|_| format!("lab exercise check report-api --only {check} --seed 7")),
        schedule: key.map(|_| lab_class::model::Schedule {
            en: vec!["1. Two requests with one key, at once.".into()],
            ru: vec!["1. Два запроса с одним ключом, одновременно.".into()],
        }),
    }
}

/// What the grid shows: each learner's label and, per check, the cell's verdict and source.
async fn grid(page: &Session) -> Value {
    page.eval(
        "return [...document.querySelectorAll('section.exercise tr')].slice(1)
           .filter((tr) => tr.querySelector('th.learner'))
           .map((tr) => ({
             name: tr.querySelector('.learner-name').textContent,
             cells: Object.fromEntries([...tr.querySelectorAll('td.cell[data-check]')]
               .map((td) => [td.dataset.check, td.dataset.verdict + '/' + td.dataset.source])),
           }));",
        json!([]),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/run installs them and runs this"]
async fn the_board_in_a_browser_shows_two_learners_live_and_hides_names_on_the_projector() {
    webdriver::require_browser();
    let tmp = shared_tempdir();
    let board = tokio::task::block_in_place(|| ClassBoard::start(tmp.path(), "en"));
    let driver = Driver::start();
    let page = driver.session().await;
    page.goto(&board.instructor_url).await;
    until(&page, "document.getElementById('count').textContent !== ''").await;
    let href = page.eval("return location.href;", json!([])).await;
    assert!(
        !href.as_str().unwrap().contains("token"),
        "the token left the bar: {href}"
    );
    let join = page
        .eval(
            "return document.getElementById('join').textContent;",
            json!([]),
        )
        .await;
    assert!(join.as_str().unwrap().contains(&board.code), "{join}");

    // Two learners join and post while the page is open; one's name is HTML.
    let client = lab_class::Client::new(&board.url).unwrap();
    let hostile_name = "<img src=x onerror=\"document.title=1\">";
    let ann = client.join(&board.code, "Ann").await.unwrap();
    let eve = client.join(&board.code, hostile_name).await.unwrap();
    let broke = Some("broke.duplicate_report");
    let (english, russian) = (
        "two reports for one key: the second request found no row and inserted its own",
        "два отчёта на один ключ: второй запрос не нашёл строки и вставил свою",
    );
    for check in ["replay", "no-key", "race"] {
        client
            .send(&ann.token, &verdict(check, Kind::Pass, None, None))
            .await
            .unwrap();
    }
    client
        .send(&eve.token, &verdict("replay", Kind::Pass, None, None))
        .await
        .unwrap();
    client
        .send(
            &eve.token,
            &verdict("race", Kind::Fail, broke, Some((english, russian))),
        )
        .await
        .unwrap();
    client
        .send(
            &eve.token,
            &verdict("no-key", Kind::Unknown, Some("unknown.no_answer"), None),
        )
        .await
        .unwrap();
    until(
        &page,
        "document.querySelectorAll('td.cell[data-verdict]').length === 6",
    )
    .await;

    let rows = grid(&page).await;
    assert_eq!(
        rows,
        json!([
            {"name": "Ann", "cells": {"replay": "pass/self_reported", "no-key": "pass/self_reported", "race": "pass/self_reported"}},
            {"name": hostile_name, "cells": {"replay": "pass/self_reported", "no-key": "unknown/self_reported", "race": "fail/self_reported"}},
        ])
    );
    // The name is text: no element came of it, no script ran.
    let injected = page
        .eval(
            "return [document.querySelectorAll('#grid img').length, document.title];",
            json!([]),
        )
        .await;
    assert_eq!(injected, json!([0, "lab class"]));
    let broken = page
        .eval(
            "const li = document.querySelector('ul.broken li[data-check=\"race\"]');
             return [li.dataset.reasonKey, li.querySelector('.reason').textContent,
                     li.querySelector('.replay').textContent];",
            json!([]),
        )
        .await;
    assert_eq!(
        broken,
        json!([
            broke,
            english,
            "lab exercise check report-api --only race --seed 7"
        ])
    );
    // In Russian, the page shows the Russian words the learner's lab sent beside the English.
    page.click("#lang-toggle").await;
    // The example's schedule, opened, stays open across the page's redraws (one a second).
    page.click("ul.broken li[data-check=\"race\"] details.schedule summary")
        .await;
    page.eval(
        "window.clickedSchedule = document.querySelector('ul.broken li[data-check=\"race\"] details.schedule');",
        json!([]),
    )
    .await;
    // A redraw later (a new element), it is still open.
    let schedule = until(
        &page,
        "(() => {
           const d = document.querySelector('ul.broken li[data-check=\"race\"] details.schedule');
           return d !== window.clickedSchedule && d.open && d.querySelector('pre').textContent;
         })()",
    )
    .await;
    assert_eq!(schedule, "1. Два запроса с одним ключом, одновременно.");
    let shown = until(
        &page,
        "document.querySelector('ul.broken li[data-check=\"race\"] .reason').textContent.startsWith('два') &&
         document.querySelector('ul.broken li[data-check=\"race\"] .reason').textContent",
    )
    .await;
    assert_eq!(shown, russian);
    page.click("#lang-toggle").await;
    let passing = page
        .eval(
            "return document.querySelector('td.passing[data-check=\"race\"]').textContent;",
            json!([]),
        )
        .await;
    assert_eq!(passing, "1 of 2");

    // A verified verdict comes in live, marked.
    client
        .send_verified(
            &board.token,
            "Ann",
            &verdict("race", Kind::Pass, None, None),
        )
        .await
        .unwrap();
    until(
        &page,
        "document.querySelector('td.cell[data-source=\"verified\"]')",
    )
    .await;
    save_screenshot(&page, "class-board.png").await;

    // Projector mode: numbers, no names, no exports.
    page.click("#projector").await;
    until(
        &page,
        "[...document.querySelectorAll('.learner-name')].map((n) => n.textContent).join() === '#1,#2'",
    )
    .await;
    let shown = page
        .eval("return document.body.innerText;", json!([]))
        .await;
    assert!(!shown.as_str().unwrap().contains("Ann"), "{shown}");
    let exports = page
        .eval(
            "return document.getElementById('export-csv').hidden;",
            json!([]),
        )
        .await;
    assert_eq!(exports, true);

    // Someone without the token: numbers, no join line (the code is the room's), no buttons.
    page.eval("sessionStorage.clear();", json!([])).await;
    page.goto(&board.url).await;
    until(&page, "window.labClass && window.labClass.board").await;
    let watcher = page
        .eval(
            "return [window.labClass.board.instructor, document.getElementById('join').hidden,
                     document.getElementById('projector').hidden,
                     [...document.querySelectorAll('.learner-name')].map((n) => n.textContent)];",
            json!([]),
        )
        .await;
    assert_eq!(watcher, json!([false, true, true, ["#1", "#2"]]));
    page.close().await;
    drop(driver);
    tokio::task::block_in_place(|| board.stop());
    crate::common::assert_nothing_left(tmp.path());
}

async fn save_screenshot(page: &Session, name: &str) {
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let dir = repo().join("docs/img");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), png).unwrap();
}
