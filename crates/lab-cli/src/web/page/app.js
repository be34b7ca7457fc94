// The web view of `lab run NAME --web`: a renderer of the messages lab sends, nothing more.
//
// lab renders every event of the run in both languages and with the marks it adds to the
// sequence diagram (lab-core's render/web.rs); this page only lays them out. It keeps the
// messages of the current scenario, so switching language or reconnecting redraws the whole
// view from them. The driving browser (opened with ?drive=TOKEN) sends Next and answers to
// POST /api/control; the others watch.
//
// Plain JavaScript, no framework and no build step: the file is served as it is written.

"use strict";

const params = new URLSearchParams(location.search);
const token = params.get("drive");
const $ = (id) => document.getElementById(id);

// What the server said in its hello: the page's words, the default language, our role.
let ui = { en: {}, ru: {} };
let lang = params.get("lang");
let langChosen = lang === "en" || lang === "ru";
let driver = false;
let connected = false;

// The messages of the current scenario, in order, and what they add up to.
let messages = [];
let view = freshView();
const listeners = [];

function freshView() {
  return {
    lanes: [],        // {id, name: {en, ru}}
    faults: {},       // hop id -> the fault mark active on it
    tables: {},       // table key -> last snapshot {columns, rows, title}
    services: {},     // service id -> lane index
    pause: null,      // {kind, id} where the run waits
    ended: null,      // {passed} once every scenario ran
    scenario: null,   // the ready message
    predict: null,    // the current prediction's block
    learner: null,    // the learner's answer to it
  };
}

// ---- words -------------------------------------------------------------------------------

function word(key, args) {
  let text = (ui[lang] && ui[lang][key]) || (ui.en && ui.en[key]) || key;
  for (const [name, value] of Object.entries(args || {})) {
    text = text.split(`{${name}}`).join(String(value));
  }
  return text;
}

function tr(both) {
  if (both == null) return "";
  if (typeof both === "string") return both;
  return both[lang] ?? both.en ?? "";
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "style") node.style.cssText = value;
    else if (name.startsWith("--")) node.style.setProperty(name, value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// ---- the diagram ---------------------------------------------------------------------------

function setLaneCount() {
  document.documentElement.style.setProperty("--lanes", Math.max(view.lanes.length, 1));
}

function addLane(lane) {
  const i = view.lanes.length;
  view.lanes.push(lane);
  $("lanes").append(el("div", { class: "lane-head", "data-id": lane.id, "data-i": i }, tr(lane.name)));
  $("diagram").prepend(el("div", { class: "lifeline", "--i": i }));
  setLaneCount();
  relayoutMarksOnLanes();
  drawLaneFaults();
}

function laneIndex(id) {
  return view.lanes.findIndex((lane) => lane.id === id);
}

// A mark on one lane puts its text on the side with more room.
function relayoutMarksOnLanes() {
  const half = view.lanes.length / 2;
  for (const row of document.querySelectorAll("#diagram .row.at")) {
    const at = Number(row.dataset.at);
    row.classList.toggle("right", at < half || view.lanes.length === 1);
    row.classList.toggle("left", !(at < half || view.lanes.length === 1));
  }
}

function faultBadge(mark) {
  switch (mark.fault) {
    case "held": return word("web.held_badge", { ms: mark.millis });
    case "dropped": return word("web.dropped_badge");
    case "cut": return word("web.cut_badge");
    default: return "";
  }
}

function drawLaneFaults() {
  for (const head of document.querySelectorAll("#lanes .lane-head")) {
    head.querySelector(".hop-fault")?.remove();
    const mark = view.faults[head.dataset.id];
    if (mark) head.append(el("span", { class: "hop-fault", title: tr(mark.label) }, faultBadge(mark)));
  }
}

function span(from, to) {
  return {
    "--lo": Math.min(from, to),
    "--hi": Math.max(from, to),
    class: to >= from ? "ltr" : "rtl",
  };
}

function draw(mark) {
  const diagram = $("diagram");
  switch (mark.mark) {
    case "step":
      diagram.append(el("div", { class: "row step", "data-mark": "step" }, tr(mark.text)));
      break;
    case "call": {
      const s = span(mark.from, mark.to);
      diagram.append(
        el("div", {
          class: `row call inflight ${s.class}`, "--lo": s["--lo"], "--hi": s["--hi"],
          "data-mark": "call", "data-id": mark.id, "data-from": mark.from, "data-to": mark.to,
          "data-timeout-ms": mark.timeout_ms,
        },
        el("div", { class: "label" },
          tr(mark.label),
          mark.timeout_ms != null ? [" · ", el("span", { class: "waits" }, word("web.waits", { ms: mark.timeout_ms }))] : null,
          " ", el("span", { class: "flight" }, word("web.in_flight"))),
        el("div", { class: "arrow" })));
      break;
    }
    case "answer": {
      const s = span(mark.from, mark.to);
      const call = mark.call != null ? diagram.querySelector(`.row.call[data-id="${mark.call}"]`) : null;
      let versus = null;
      if (call) {
        call.classList.remove("inflight");
        call.dataset.outcome = mark.outcome;
        // A lost answer beside what explains it: how long the hop held it, how long the
        // caller waited.
        const held = view.faults[view.lanes[mark.from]?.id];
        const waited = call.dataset.timeoutMs;
        if (mark.outcome === "unknown" && held && held.fault === "held" && waited) {
          versus = el("span", { class: "versus", "data-held-ms": held.millis, "data-timeout-ms": waited },
            word("web.versus", { held: held.millis, waits: waited }));
        }
      }
      diagram.append(
        el("div", {
          class: `row answer ${mark.outcome} ${s.class}`, "--lo": s["--lo"], "--hi": s["--hi"],
          "data-mark": "answer", "data-id": mark.id, "data-call": mark.call, "data-outcome": mark.outcome,
          "data-from": mark.from, "data-to": mark.to,
        },
        el("div", { class: "label" }, tr(mark.label), versus),
        el("div", { class: "arrow" })));
      break;
    }
    case "note":
    case "checkpoint":
      diagram.append(
        el("div", { class: `row at ${mark.mark}`, "--at": mark.at, "data-at": mark.at, "data-mark": mark.mark, "data-id": mark.id },
          el("div", { class: "label" }, tr(mark.mark === "note" ? mark.text : mark.label))));
      break;
    case "fault": {
      if (mark.fault === "healed") delete view.faults[mark.hop];
      else view.faults[mark.hop] = mark;
      const at = mark.at != null ? mark.at : laneIndex(mark.hop);
      const attrs = { "data-mark": "fault", "data-fault": mark.fault, "data-hop": mark.hop, "data-millis": mark.millis };
      if (at >= 0) {
        diagram.append(el("div", { ...attrs, class: "row at fault", "--at": at, "data-at": at },
          el("div", { class: "label" }, tr(mark.label))));
      } else {
        // The hop's service has not been called yet: a banner across the diagram.
        diagram.append(el("div", { ...attrs, class: "row fault banner" },
          el("div", { class: "label" }, `⚡ ${tr(mark.hop_name)}: ${tr(mark.label)}`)));
      }
      drawLaneFaults();
      break;
    }
  }
  relayoutMarksOnLanes();
}

// ---- the story -----------------------------------------------------------------------------

function feed(node) {
  $("feed").append(node);
  return node;
}

function serviceName(id) {
  const i = laneIndex(`service.${id}`);
  return i >= 0 ? tr(view.lanes[i].name) : id;
}

// A table, with what changed since the last snapshot of the same table: a changed cell shows
// old → new, a row that was not there is marked. Rows are matched by their first column.
function table(message, t) {
  const key = message.table;
  const previous = view.tables[key];
  const before = previous && JSON.stringify(previous.columns) === JSON.stringify(t.columns) ? previous : null;
  view.tables[key] = { columns: t.columns, rows: t.rows, title: { en: message.en.title, ru: message.ru.title } };
  return tableElement(t.title, t.columns, t.rows, before, key);
}

function tableElement(title, columns, rows, before, key) {
  const body = rows.length === 0
    ? [el("tr", {}, el("td", { class: "empty", colspan: columns.length }, word("label.no_rows")))]
    : rows.map((row) => {
      const old = before ? before.rows.find((p) => p.length && p[0] === row[0]) : undefined;
      const added = before && !old;
      return el("tr", { class: added ? "added" : null },
        row.map((cell, i) => {
          const changed = old && old[i] !== cell;
          return el("td", { class: changed ? "changed" : null },
            changed ? [el("span", { class: "old" }, old[i]), "→ ", cell] : cell);
        }));
    });
  return el("table", { class: "data", "data-table": key },
    el("caption", {}, title),
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, body));
}

function sameValue(a, b) {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
  }
  return v;
}

function factsTable(t) {
  const names = [...new Set([...Object.keys(t.facts), ...Object.keys(t.expected)])].sort();
  const show = (v) => (v === undefined ? "—" : JSON.stringify(v));
  const knobs = t.settings && Object.keys(t.settings).length > 0;
  const rows = names.map((name) => {
    const ok = name in t.facts && sameValue(t.facts[name], t.expected[name]);
    return el("tr", { class: ok ? "ok" : "drift", "data-fact": name },
      el("td", { class: "name" }, name),
      el("td", { class: "measured" }, show(t.facts[name])),
      el("td", { class: "expected" }, show(t.expected[name])),
      el("td", { class: "mark" }, ok ? "✓" : "✗"));
  });
  return [
    el("h3", {}, word("label.facts")),
    el("table", { class: "facts", id: "facts" },
      el("thead", {}, el("tr", {},
        el("th", {}, word("label.fact")), el("th", {}, word("label.measured")),
        el("th", {}, word(knobs ? "label.default_run" : "label.expected")), el("th", {}, ""))),
      el("tbody", {}, rows)),
    knobs ? null : el("p", { class: t.passed ? "passed" : "failed" }, word(t.passed ? "label.passed" : "label.failed")),
  ];
}

function predictBlock(t) {
  const block = el("div", { class: "predict" },
    el("div", { class: "question" }, `? ${word("label.predict")}: ${t.question}`),
    el("div", { class: "options" },
      t.options.map((option, i) => {
        const letter = String.fromCharCode(97 + i);
        const button = el("button", { type: "button", class: "option", "data-letter": letter },
          el("span", { class: "letter" }, `${letter})`), option);
        button.addEventListener("click", () => answer(letter));
        return button;
      })));
  view.predict = block;
  view.learner = null;
  return block;
}

function revealBlock(t) {
  const block = el("div", { class: "reveal" },
    el("div", { class: "right-option" },
      `! ${word("label.answer")}: `, t.right ? `${t.right}) ${t.right_option}` : null),
    el("div", { class: "answer-text" }, t.answer));
  if (view.predict) {
    for (const option of view.predict.querySelectorAll(".option")) {
      if (option.dataset.letter === t.right) option.classList.add("right");
      else if (option.dataset.letter === view.learner) option.classList.add("wrong");
    }
  }
  if (t.learner_right != null && view.learner) {
    const key = t.learner_right ? "label.learner_right" : "label.learner_wrong";
    block.append(el("div", { class: `verdict ${t.learner_right ? "right" : "wrong"}`, "data-right": String(t.learner_right) },
      word(key, { answer: view.learner })));
  }
  view.predict = null;
  return block;
}

// The services' lines folded until a reveal, in full (the terminal prints the same block).
function unfoldedBlock(lines) {
  return el("div", { class: "unfolded" },
    el("div", { class: "unfolded-label" }, word("label.unfolded")),
    lines.map((u) => el("div", { class: "service-line" },
      `⚙ ${word("label.unfolded_line", { service: serviceName(u.service), step: u.step })}: ${u.text}`)));
}

// Applies one message to the view.
function apply(m) {
  const t = m[lang] || m.en || {};
  // A note drawn folded gets its full text when the answer is revealed.
  for (const r of m.redraw || []) {
    const label = document.querySelector(`#diagram .row.note[data-id="${r.id}"] .label`);
    if (label) label.textContent = tr(r.text);
  }
  // The lines of a part that revealed nothing come before what follows it.
  if (t.unfolded && t.unfolded.length && m.kind !== "reveal") feed(unfoldedBlock(t.unfolded));
  switch (m.kind) {
    case "ready":
      view.scenario = m;
      feed(el("div", { class: "ready", id: "ready" },
        el("div", { class: "title" }, `${m.scenario} · ${tr(m.title)}`),
        el("div", { class: "hint" }, word("web.start", { scenario: m.scenario }))));
      break;
    case "start":
      $("ready")?.remove();
      feed(el("h1", {}, t.title));
      feed(el("div", { class: "story" }, t.story));
      break;
    case "side":
      feed(el("h2", {}, t.text));
      break;
    case "step":
      document.querySelector(".step-card.current")?.classList.remove("current");
      feed(el("div", { class: "step-card current", "data-step": t.n }, el("span", { class: "n" }, `${t.n}.`), t.text));
      break;
    case "request":
      feed(el("div", { class: "call-line" }, `→ ${t.text}`));
      break;
    case "response": {
      const parts = [t.status, t.body == null ? null : JSON.stringify(t.body), t.detail].filter((p) => p != null);
      feed(el("div", { class: "call-line" }, el("span", { class: `outcome ${t.outcome}` }, word(`outcome.${t.outcome}`)), " ", parts.join(" · ")));
      break;
    }
    case "service":
      feed(el("div", { class: "service-line" }, `⚙ ${serviceName(t.service)}: ${t.text}`));
      break;
    case "state":
      feed(table(m, t));
      break;
    case "note":
      feed(el("div", { class: "note-text" }, t.text));
      break;
    case "predict":
      feed(predictBlock(t));
      break;
    case "learner_answer":
      view.learner = t.answer;
      view.predict?.querySelector(`.option[data-letter="${t.answer}"]`)?.classList.add("chosen");
      break;
    case "reveal":
      feed(revealBlock(t));
      if (t.unfolded && t.unfolded.length) feed(unfoldedBlock(t.unfolded));
      break;
    case "explain":
      feed(el("h3", {}, word("label.explain")));
      feed(el("div", { class: "explain" }, t.text));
      if (t.checklist && t.checklist.length) {
        feed(el("h3", {}, word("label.checklist")));
        feed(el("ul", { class: "checklist" }, t.checklist.map((item) => el("li", {}, item))));
      }
      break;
    case "quiz":
      feed(el("h3", {}, word("label.quiz")));
      feed(el("ol", { class: "quiz" }, t.questions.map((q, i) => el("li", {}, q,
        t.answers && t.answers[i] ? el("div", { class: "model" }, `${word("label.model_answer")}: ${t.answers[i]}`) : null))));
      break;
    case "summary":
      for (const node of factsTable(t)) if (node) feed(node);
      break;
    case "pause":
      view.pause = { kind: m.pause, id: m.id };
      break;
    case "resume":
      view.pause = null;
      break;
    case "end":
      view.ended = { passed: m.passed };
      feed(el("p", { class: "end", id: "end" }, word("web.ended")));
      break;
  }
  for (const lane of m.lanes || []) addLane(lane);
  for (const mark of m.draw || []) draw(mark);
}

// ---- the bar -------------------------------------------------------------------------------

function refreshBar() {
  const s = view.scenario;
  $("scenario").textContent = s ? s.scenario : "lab";
  $("scenario-title").textContent = s ? `· ${tr(s.title)}` : "";
  $("progress").textContent = s && s.of > 1 ? `(${s.n}/${s.of})` : "";
  document.title = s ? `lab · ${s.scenario}` : "lab";
  const status = $("status");
  status.className = "";
  let text;
  if (!connected) {
    text = word("web.disconnected");
    status.className = "lost";
  } else if (view.ended) {
    text = word("web.over");
    status.className = "ended";
  } else if (view.pause) {
    text = view.pause.kind === "start"
      ? word("web.start", { scenario: s ? s.scenario : "" })
      : word(`web.paused_${view.pause.kind}`);
  } else {
    text = word("web.running");
  }
  status.textContent = driver ? text : `${word("web.watching")} · ${text}`;
  status.dataset.pause = view.pause ? view.pause.kind : "";
  document.body.classList.toggle("watching", !driver);
  $("next").textContent = word("web.next");
  $("next").disabled = !(driver && connected && view.pause);
  $("restart").textContent = word("web.restart");
  $("restart").disabled = !(driver && connected && view.scenario);
  $("state-toggle").textContent = word("web.state");
  $("lang-toggle").textContent = lang === "ru" ? "EN" : "RU";
  document.documentElement.lang = lang;
  const answering = driver && connected && view.pause && view.pause.kind === "predict" && !view.learner;
  for (const option of document.querySelectorAll(".predict .option")) {
    option.disabled = !(answering && view.predict && view.predict.contains(option));
  }
  refreshStatePanel();
}

function refreshStatePanel() {
  const panel = $("state-panel");
  if (panel.hidden) return;
  panel.replaceChildren();
  const tables = Object.entries(view.tables);
  if (tables.length === 0) panel.append(el("p", {}, word("web.no_state")));
  for (const [key, t] of tables) panel.append(tableElement(tr(t.title), t.columns, t.rows, null, key));
}

// ---- drawing it all ------------------------------------------------------------------------

function redraw() {
  view = freshView();
  $("lanes").replaceChildren();
  $("diagram").replaceChildren();
  $("feed").replaceChildren();
  setLaneCount();
  for (const m of messages) apply(m);
  refreshBar();
  follow();
}

// Keep the newest of both panes in sight.
function follow() {
  for (const pane of [$("diagram-pane"), $("story-pane")]) pane.scrollTop = pane.scrollHeight;
}

function changed() {
  for (const listener of listeners.splice(0)) {
    try {
      if (!listener()) listeners.push(listener);
    } catch (e) {
      console.error(e);
    }
  }
}

function receive(m) {
  switch (m.kind) {
    case "hello":
      ui = m.ui;
      driver = m.driver;
      if (!langChosen) lang = m.lang;
      // A (re)connection replays the scenario from its start.
      messages = [];
      redraw();
      break;
    case "ready":
      messages = [m];
      redraw();
      break;
    default:
      messages.push(m);
      apply(m);
      refreshBar();
      follow();
  }
  changed();
}

// ---- the controls --------------------------------------------------------------------------

async function control(body) {
  if (!driver) return;
  try {
    const response = await fetch("/api/control", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token, ...body }),
    });
    // 409: that pause is over (a second click); the stream says what happens next.
    if (!response.ok && response.status !== 409) {
      console.warn("lab refused:", response.status, await response.text());
    }
  } catch (e) {
    console.warn("lab unreachable:", e);
  }
}

function next() {
  if (driver && view.pause) control({ action: "next", pause: view.pause.id });
}

function answer(letter) {
  if (driver && view.pause && view.pause.kind === "predict") {
    control({ action: "answer", answer: letter, pause: view.pause.id });
  }
}

function toggleState() {
  const panel = $("state-panel");
  panel.hidden = !panel.hidden;
  $("state-toggle").setAttribute("aria-pressed", String(!panel.hidden));
  refreshStatePanel();
}

function toggleLang() {
  lang = lang === "ru" ? "en" : "ru";
  langChosen = true;
  redraw();
  changed();
}

$("next").addEventListener("click", next);
$("restart").addEventListener("click", () => control({ action: "restart" }));
$("state-toggle").addEventListener("click", toggleState);
$("lang-toggle").addEventListener("click", toggleLang);

// Keys, for the presenter's clicker and keyboard: Space or Enter is Next wherever the focus is
// (a focused button would otherwise take it), a letter answers the prediction, s shows the
// state, l switches language.
document.addEventListener("keydown", (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === " " || e.key === "Enter") {
    e.preventDefault();
    next();
  } else if (/^[a-z]$/.test(e.key) && view.pause && view.pause.kind === "predict" && view.predict
      && view.predict.querySelector(`.option[data-letter="${e.key}"]`)) {
    answer(e.key);
  } else if (e.key === "s") {
    toggleState();
  } else if (e.key === "l") {
    toggleLang();
  }
});

// ---- the stream ----------------------------------------------------------------------------

function connect() {
  const url = token ? `/api/events?drive=${encodeURIComponent(token)}` : "/api/events";
  const source = new EventSource(url);
  source.onopen = () => {
    connected = true;
    refreshBar();
  };
  source.onmessage = (e) => {
    connected = true;
    receive(JSON.parse(e.data));
  };
  source.onerror = () => {
    // EventSource reconnects by itself; the hello that follows redraws everything.
    connected = false;
    refreshBar();
    changed();
  };
}

// For tests and curious instructors: where the run is, and a way to wait for it to change
// (`onChange(f)` calls f after every message until f returns true).
window.labView = {
  get pause() { return view.pause && { ...view.pause }; },
  get ended() { return view.ended && { ...view.ended }; },
  get driver() { return driver; },
  get connected() { return connected; },
  get lang() { return lang; },
  onChange(listener) {
    if (!listener()) listeners.push(listener);
  },
};

refreshBar();
connect();
