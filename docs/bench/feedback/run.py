#!/usr/bin/env python3
"""How long a learner waits in `lab exercise watch`: from saving a file to the first verdict, and
to the last (the summary), for each exercise, language and side (starter, solution).

For each case it starts the project (`lab exercise start`, the reference solution copied over it
for the solution side), runs `lab exercise watch` on it, waits for the first check run to end (a
Rust project builds then), and then saves the program's main file again N times: the same bytes,
a new modification time, as an editor's save. It reads watch's output with a timestamp per line:
the first verdict line (`  pass …`, `  fail …`) and the summary (`N passed, …`) after each save.
Each save waits for the previous run to end (watch's footer on stderr).

    docs/bench/feedback/run.py                          # every exercise, both languages, both sides
    docs/bench/feedback/run.py report-api:python        # one exercise in one language
    docs/bench/feedback/run.py --saves 10 --lab target/release/lab report-api

It prints a Markdown table: medians and (min-max) in seconds. Needs a built `lab` and, for the
Python exercises, a venv with their requirements (`--python-venv`, default target/exercise-py,
which .ci/run makes). Standard library only.
"""

import argparse
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXERCISES = ["report-api", "worker", "charge-once", "relay", "invoice-consumer"]
LANGS = ["python", "rust"]
SIDES = ["starter", "solution"]
# The file a learner edits, per language.
MAIN = {"python": None, "rust": "src/main.rs"}
# The verdict words as `lab` prints them in English (LAB_LANG=en, no colour).
VERDICT = ("  pass", "  fail", "  unknown", "  skipped")


def main_file(project: Path, lang: str) -> Path:
    if MAIN[lang]:
        return project / MAIN[lang]
    # The Python exercises' program is the one .py file the manifest runs.
    manifest = (project / "lab-exercise.toml").read_text()
    for token in manifest.split('"'):
        if token.endswith(".py"):
            return project / token
    raise SystemExit(f"no .py file named in {project}/lab-exercise.toml")


def reader(stream, name: str, lines: "queue.Queue"):
    for line in iter(stream.readline, ""):
        lines.put((time.monotonic(), name, line.rstrip("\n")))
    lines.put((time.monotonic(), name, None))


def wait_for(lines: "queue.Queue", wanted, timeout: float):
    """The first (time, stream, line) for which wanted(stream, line) holds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("watch said nothing of what was awaited")
        at, stream, line = lines.get(timeout=left)
        if line is None:
            raise RuntimeError(f"watch's {stream} closed")
        if wanted(stream, line):
            return at, stream, line


def measure(lab: str, exercise: str, lang: str, side: str, saves: int, venv: Path):
    work = Path(tempfile.mkdtemp(prefix="lab-feedback-"))
    try:
        project = work / exercise
        subprocess.run(
            [lab, "exercise", "start", exercise, str(project), "--in", lang],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if side == "solution":
            solution = REPO / "exercises" / exercise / lang / "solution"
            shutil.copytree(solution, project, dirs_exist_ok=True)
        if lang == "python":
            (project / ".venv").symlink_to(venv.resolve())
        env = dict(os.environ, NO_COLOR="1", LAB_LANG="en")
        watch = subprocess.Popen(
            [lab, "exercise", "watch", exercise, str(project), "--color", "never"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        lines: "queue.Queue" = queue.Queue()
        for stream, name in ((watch.stdout, "out"), (watch.stderr, "err")):
            threading.Thread(target=reader, args=(stream, name, lines), daemon=True).start()
        footer = lambda stream, line: stream == "err" and line.startswith("watching ")
        # The first run: a Rust project builds here.
        wait_for(lines, footer, timeout=900)
        edited = main_file(project, lang)
        content = edited.read_bytes()
        first, last = [], []
        for _ in range(saves):
            while not lines.empty():
                lines.get_nowait()
            saved = time.monotonic()
            edited.write_bytes(content)
            at, _, _ = wait_for(lines, lambda s, l: s == "out" and l.startswith(VERDICT), 300)
            first.append(at - saved)
            at, _, _ = wait_for(lines, lambda s, l: s == "out" and " passed, " in l, 300)
            last.append(at - saved)
            wait_for(lines, footer, timeout=300)
        watch.stdin.write("q\n")
        watch.stdin.flush()
        watch.wait(timeout=60)
        return first, last
    finally:
        shutil.rmtree(work, ignore_errors=True)


def spread(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="EXERCISE[:LANG[:SIDE]]; default: all")
    parser.add_argument("--lab", default=str(REPO / "target/debug/lab"))
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--python-venv", default=str(REPO / "target/exercise-py"))
    args = parser.parse_args()
    cases = []
    for spec in args.cases or EXERCISES:
        exercise, *rest = spec.split(":")
        langs = [rest[0]] if rest else LANGS
        sides = [rest[1]] if len(rest) > 1 else SIDES
        cases += [(exercise, lang, side) for lang in langs for side in sides]
    print(f"save to verdict in `lab exercise watch`, seconds: median (min-max) of {args.saves} saves")
    print()
    print("| exercise | language | side | first verdict | last verdict |")
    print("|---|---|---|---|---|")
    for exercise, lang, side in cases:
        first, last = measure(args.lab, exercise, lang, side, args.saves, Path(args.python_venv))
        print(f"| {exercise} | {lang} | {side} | {spread(first)} | {spread(last)} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
