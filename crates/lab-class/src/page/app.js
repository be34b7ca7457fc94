// The board of `lab class`: reads /api/board every second and draws, per exercise, a grid of
// learners × checks (the newest verdict of each cell and how long ago it came), per check how
// many learners pass and the commonest broken invariant with one example replay line.
//
// Who sees what is the server's decision: without the instructor's token every learner is a
// number; with it (the URL lab class printed, `#token=…`) names, histories and the exports.
// The token is moved from the address bar into this tab's storage at once, so a projector
// showing the page does not show it. Every text from a learner is set with textContent.

"use strict";

const params = new URLSearchParams(location.search);
const hash = new URLSearchParams(location.hash.slice(1));
if (hash.get("token")) {
  sessionStorage.setItem("lab-class-token", hash.get("token"));
  history.replaceState(null, "", location.pathname + location.search);
}
const token = sessionStorage.getItem("lab-class-token");

let ui = { en: {}, ru: {} };
let lang = params.get("lang");
let langChosen = lang === "en" || lang === "ru";
// Projector mode: names hidden even for the instructor. `?projector=1` starts in it.
let projector = params.get("projector") === "1";
let last = null;
let historyOf = null;
// The example schedules the instructor opened: kept open across the redraws.
const opened = new Set();

const $ = (id) => document.getElementById(id);

/// The page's words in its language, with {name} replaced.
function t(key, args) {
  let text = (ui[lang] && ui[lang][key]) || (ui.en && ui.en[key]) || key;
  for (const [name, value] of Object.entries(args || {})) {
    text = text.split("{" + name + "}").join(String(value));
  }
  return text;
}

/// A broken invariant's words, in the page's language ({en, ru} from the learner's lab).
function reasonText(reason) {
  return reason ? reason[lang] || reason.en : null;
}

/// A schedule's lines in the page's language, as a <details> that stays open once opened.
function scheduleOf(schedule, id) {
  const lines = schedule ? schedule[lang] || schedule.en : null;
  if (!lines || !lines.length) return null;
  const details = el("details", "schedule");
  details.open = opened.has(id);
  details.addEventListener("toggle", () => (details.open ? opened.add(id) : opened.delete(id)));
  details.appendChild(el("summary", null, t("class.schedule")));
  details.appendChild(el("pre", null, lines.join("\n")));
  return details;
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function headers() {
  return token ? { Authorization: "Bearer " + token } : {};
}

function ago(seconds) {
  if (seconds < 60) return t("class.ago_s", { n: Math.max(0, Math.floor(seconds)) });
  if (seconds < 3600) return t("class.ago_min", { n: Math.floor(seconds / 60) });
  return t("class.ago_h", { n: Math.floor(seconds / 3600) });
}

const MARKS = { pass: "✓", fail: "✗", unknown: "?" };

function learnerHeader(learner, board) {
  const th = el("th", "learner");
  th.dataset.learner = learner.id;
  if (board.names && learner.name !== null) {
    const button = el("button", "name learner-name", learner.name);
    button.type = "button";
    button.addEventListener("click", () => openHistory(learner));
    th.appendChild(button);
  } else {
    th.appendChild(el("span", "learner-name", learner.label));
  }
  return th;
}

function cellOf(cell) {
  const td = el("td", "cell " + (cell ? cell.verdict : "none"));
  if (!cell) {
    td.textContent = "·";
    return td;
  }
  td.dataset.learner = cell.learner;
  td.dataset.exercise = cell.exercise;
  td.dataset.check = cell.check;
  td.dataset.verdict = cell.verdict;
  td.dataset.source = cell.source;
  td.appendChild(el("span", "mark", MARKS[cell.verdict] + " " + t("class.verdict_" + cell.verdict)));
  if (cell.source === "verified") td.appendChild(el("span", "source", " " + t("class.verified")));
  td.appendChild(el("span", "age", ago(cell.age_s)));
  const title = [reasonText(cell.reason), cell.replay].filter(Boolean).join("\n");
  td.title = (cell.source === "verified" ? t("class.verified") : t("class.self_reported")) +
    (title ? "\n" + title : "");
  return td;
}

function drawExercise(exercise, board) {
  const section = el("section", "exercise");
  section.dataset.exercise = exercise.name;
  section.appendChild(el("h2", null, exercise.name));
  const table = el("table", "grid");
  const head = el("tr");
  head.appendChild(el("th", "learner", t("class.learner")));
  for (const check of exercise.checks) head.appendChild(el("th", "check", check));
  table.appendChild(head);
  const cells = new Map();
  for (const cell of board.cells) {
    if (cell.exercise === exercise.name) cells.set(cell.learner + "/" + cell.check, cell);
  }
  for (const learner of board.learners) {
    if (!exercise.checks.some((check) => cells.has(learner.id + "/" + check))) continue;
    const row = el("tr");
    row.appendChild(learnerHeader(learner, board));
    for (const check of exercise.checks) row.appendChild(cellOf(cells.get(learner.id + "/" + check)));
    table.appendChild(row);
  }
  const tally = el("tr", "tally");
  tally.appendChild(el("td", null, t("class.passing_row")));
  const broken = el("ul", "broken");
  for (const check of exercise.checks) {
    const summary = board.checks.find((c) => c.exercise === exercise.name && c.check === check);
    const td = el("td", "passing", summary && summary.reported
      ? t("class.passing", { passing: summary.passing, reported: summary.reported })
      : "–");
    td.dataset.check = check;
    tally.appendChild(td);
    if (summary && summary.commonest_broken) {
      const c = summary.commonest_broken;
      const li = el("li");
      li.dataset.check = check;
      li.dataset.reasonKey = c.reason_key;
      li.appendChild(el("span", "check", check));
      li.appendChild(document.createTextNode(" — " + t("class.broken_by", { count: c.count, reported: summary.reported }) + ": "));
      li.appendChild(el("span", "reason", reasonText(c.reason) || c.reason_key));
      if (c.replay) li.appendChild(el("code", "replay", c.replay));
      const schedule = scheduleOf(c.schedule, exercise.name + "/" + check);
      if (schedule) li.appendChild(schedule);
      broken.appendChild(li);
    }
  }
  table.appendChild(tally);
  section.appendChild(table);
  if (broken.children.length) {
    section.appendChild(el("h3", null, t("class.commonest")));
    section.appendChild(broken);
  }
  return section;
}

function draw() {
  document.documentElement.lang = lang;
  $("lang-toggle").textContent = lang === "ru" ? "EN" : "RU";
  $("title").textContent = t("class.title");
  const board = last;
  if (!board) return;
  $("count").textContent = t("class.learners", { count: board.learners.length });
  const instructor = board.instructor;
  $("projector").hidden = !instructor;
  $("projector").setAttribute("aria-pressed", String(projector));
  $("projector").textContent = projector ? t("class.show_names") : t("class.hide_names");
  for (const [id, path] of [["export-csv", "/export.csv"], ["export-junit", "/export.junit.xml"]]) {
    $(id).hidden = !instructor || projector;
    if (instructor) $(id).href = path + "?token=" + encodeURIComponent(token);
  }
  const join = $("join");
  join.hidden = !board.join;
  if (board.join) {
    join.replaceChildren(
      document.createTextNode(t("class.join") + " "),
      el("code", "join-line", "lab exercise check " + t("class.exercise") + " --class " + board.join.url + " --class-code " + board.join.code),
    );
  }
  const grid = $("grid");
  const sections = board.exercises.map((exercise) => drawExercise(exercise, board));
  if (!sections.length) sections.push(el("p", "empty", t("class.empty")));
  grid.replaceChildren(...sections);
}

async function openHistory(learner) {
  historyOf = learner;
  $("history").hidden = false;
  $("history-title").textContent = t("class.history", { name: learner.name });
  const response = await fetch("/api/learners/" + learner.id + "/history", { headers: headers() });
  const body = await response.json();
  const list = $("history-list");
  list.replaceChildren(...(body.verdicts || []).map((v) => {
    const li = el("li", v.verdict);
    li.appendChild(el("span", "when", v.received_at + " "));
    li.appendChild(el("code", null, v.exercise + " " + v.check));
    li.appendChild(document.createTextNode(" " + MARKS[v.verdict] + " " + t("class.verdict_" + v.verdict) +
      (v.source === "verified" ? " (" + t("class.verified") + ")" : "") +
      (v.reason ? ": " + reasonText(v.reason) : "")));
    const schedule = scheduleOf(v.schedule, "history/" + v.id);
    if (schedule) li.appendChild(schedule);
    return li;
  }));
}

async function refresh() {
  try {
    const query = projector ? "?projector=1" : "";
    const response = await fetch("/api/board" + query, { headers: headers() });
    if (!response.ok) throw new Error(String(response.status));
    last = await response.json();
    $("status").textContent = "";
    $("status").classList.remove("lost");
  } catch (e) {
    $("status").textContent = t("class.disconnected");
    $("status").classList.add("lost");
  }
  draw();
}

async function start() {
  try {
    const response = await fetch("/api/ui");
    const body = await response.json();
    ui = body.ui;
    if (!langChosen) lang = body.lang;
  } catch (e) {
    lang = lang || "en";
  }
  if (!lang) lang = "en";
  await refresh();
  setInterval(refresh, 1000);
}

$("lang-toggle").addEventListener("click", () => {
  lang = lang === "ru" ? "en" : "ru";
  langChosen = true;
  draw();
});
$("projector").addEventListener("click", () => {
  projector = !projector;
  if (projector) $("history").hidden = true;
  refresh();
});
$("history-close").addEventListener("click", () => {
  historyOf = null;
  $("history").hidden = true;
});
// p toggles projector mode, l the language.
document.addEventListener("keydown", (event) => {
  if (event.target.tagName === "INPUT") return;
  if (event.key === "p" && last && last.instructor) $("projector").click();
  if (event.key === "l") $("lang-toggle").click();
});

// For the browser tests: what the page drew last.
window.labClass = {
  get board() { return last; },
  get lang() { return lang; },
  get projector() { return projector; },
};

start();
