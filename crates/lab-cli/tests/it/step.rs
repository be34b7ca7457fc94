//! Step mode as a class sees it: the footer at each pause (`step 3/8 · Enter next · s state ·
//! d diagram so far · b back · q quit`), the looks `s`, `d` and `b`, and where the footer goes.
//!
//! `s` reads the scenario's state views again (backstage: `--show-sql` and JSON do not change).
//!
//! Two ways in: piped (stdin a pipe, stdout and stderr one pipe, as `… | lab run x --step 2>&1 |
//! less` would see it), where every footer must end its line; and a real terminal, a `tmux`
//! pane, where every footer must be erased once answered. The terminal test needs `tmux`, so it
//! is `#[ignore]`d here and run by `.ci/run` (which installs tmux) with `--ignored`.

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// What a footer ends with, in English, whatever the pause.
const FOOTER_END: &str = "q quit";

/// Whether a line is a footer and nothing else.
fn is_footer(line: &str) -> bool {
    let line = line.trim();
    (line.starts_with("step ") || line.starts_with("Enter") || line.starts_with("your answer"))
        && line.ends_with(FOOTER_END)
}

/// `lab run duplicate --step --lang en`, fed `input`, its stdout and stderr in one pipe in the
/// order they were written.
fn piped_run(input: &str) -> (i32, String) {
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut command = lab(&[
        "run",
        "duplicate",
        "--step",
        "--lang",
        "en",
        "--color",
        "never",
    ]);
    command
        .stdin(Stdio::piped())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer);
    let mut child = command.spawn().unwrap();
    // The command holds the pipe's writing ends: without dropping it, reading never ends.
    drop(command);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let mut both = String::new();
    reader.read_to_string(&mut both).unwrap();
    let status = child.wait().unwrap();
    (status.code().unwrap_or(-1), both)
}

#[test]
fn piped_footers_end_their_lines_and_looks_show_state_diagram_and_the_step_again() {
    // Enter at step 1; `s`, `d` and `b` at step 2; then Enter to the end.
    let input = format!("\ns\nd\nb\n{}", "\n".repeat(200));
    let (code, both) = piped_run(&input);
    assert_eq!(code, 0, "{both}");

    let footers: Vec<&str> = both.lines().filter(|l| l.contains(FOOTER_END)).collect();
    assert!(footers.len() >= 10, "{both}");
    for line in &footers {
        assert!(
            is_footer(line),
            "a footer shares its line with other text: {line:?}\n{both}"
        );
    }
    // The count is real: eight steps, as in the expected narrative.
    for n in 1..=8 {
        assert!(
            both.contains(&format!(
                "  step {n}/8 · Enter next · s state · d diagram so far · b back · q quit"
            )),
            "no footer for step {n}/8:\n{both}"
        );
    }
    assert!(!both.contains("step 9"), "{both}");

    // `s` at step 2: the tasks table read again now: worker A's claim, made before step 2
    // was told, is there, marked as a change since the table was last shown.
    let state = both.split("── State").nth(1).expect("the state look");
    assert!(
        state.contains("our tasks table")
            && state.contains("pending→processing")
            && state.contains("read again just now"),
        "{state}"
    );
    // `d` at step 2: the swimlanes so far, our workers and our database.
    let diagram = both
        .split("── The run so far ──")
        .nth(1)
        .expect("the diagram look");
    assert!(
        diagram.contains("our workers") && diagram.contains("UPDATE tasks"),
        "{diagram}"
    );
    // `b` at step 2: the last step shown is step 2 (the pause comes after the step's text,
    // before the table that follows it).
    let again = both.split("── Again ──").nth(1).expect("the step again");
    assert!(
        again.trim_start().starts_with("2. Worker A claims"),
        "{again}"
    );
}

#[test]
fn looks_go_to_stderr_and_never_change_the_narrative() {
    // With what ran shown: the looks' own reads (backstage) must not appear under a step.
    let plain = stdout(&run(&["run", "duplicate", "--lang", "en", "--show-sql"]));
    let mut child = lab(&["run", "duplicate", "--lang", "en", "--show-sql", "--step"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Every look at each of the six pauses before the prediction (where letters are answers).
    let looks = "s\nd\nb\nb\nb\n\n".repeat(6);
    stdin.write_all(looks.as_bytes()).unwrap();
    stdin.write_all("\n".repeat(200).as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_code(&out, 0);
    assert_eq!(stdout(&out), plain, "the narrative on stdout is the same");
    assert!(stderr(&out).contains("── State"), "{}", stderr(&out));
}

#[test]
fn at_a_prediction_b_is_an_answer_and_the_footer_says_how_to_answer() {
    // Seven pauses before the prediction (see cli.rs), then `b`: an answer, not "back".
    let (code, both) = piped_run(&format!("{}b\n{}", "\n".repeat(7), "\n".repeat(100)));
    assert_eq!(code, 0, "{both}");
    assert!(
        both.contains("your answer (a letter), then Enter · Enter alone skips · q quit"),
        "{both}"
    );
    assert!(both.contains("Your answer, b: not this one."), "{both}");
    assert!(!both.contains("── Again ──"), "{both}");
}

/// A tmux server of this test's own (its own socket), killed when the test ends however it ends.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `lab run duplicate --step --lang en` in a 120×40 pane of a tmux server of its own; when
    /// lab ends, the pane says `lab exited CODE`.
    fn start(name: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("lab-step-{name}-{}", std::process::id()),
        };
        // The environment `common::lab` clears, cleared here for the pane's shell too.
        let script = format!(
            "cd '{}' && env -u DATABASE_URL -u REDIS_URL -u LAB_LANG -u LANG -u LC_ALL -u NO_COLOR \
             -u LAB_SCENARIOS_DIR '{}' run duplicate --step --lang en --color never; \
             echo \"lab exited $?\"; sleep 600",
            repo().display(),
            lab_path()
        );
        tmux.run(&[
            "start-server",
            ";",
            "set-option",
            "-g",
            "history-limit",
            "50000",
            ";",
            "new-session",
            "-d",
            "-s",
            "lab",
            "-x",
            "120",
            "-y",
            "40",
            &script,
        ]);
        tmux
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket, "-f", "/dev/null"]);
        command
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().expect("tmux runs");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's whole history and screen, wrapped lines joined.
    fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", "lab"])
    }

    /// Types a key and Enter.
    fn send(&self, key: &str) {
        if key.is_empty() {
            self.run(&["send-keys", "-t", "lab", "Enter"]);
        } else {
            self.run(&["send-keys", "-t", "lab", key, "Enter"]);
        }
    }

    /// Polls the pane until `ready` holds for it, or fails after a deadline with what it shows.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let pane = self.capture();
            if ready(&pane) {
                return pane;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; the pane:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    /// A test that failed halfway leaves lab paused: Ctrl-C lets it clean up (a killed tmux
    /// would hang it up, and its servers' directories would wait for the next lab to remove
    /// them), then the server goes.
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["send-keys", "-t", "lab", "C-c"])
            .output();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let pane = self
                .command()
                .args(["capture-pane", "-p", "-t", "lab"])
                .output();
            // Gone (the shell ended), or lab has ended: done.
            let ended = pane.is_ok_and(|p| {
                !p.status.success() || String::from_utf8_lossy(&p.stdout).contains("lab exited")
            });
            if ended {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.command().arg("kill-server").output();
    }
}

/// The last line with text on it: where the cursor waits at a pause.
fn last_line(pane: &str) -> &str {
    pane.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

/// Whether the run waits at a footer that starts with `progress` (its last line is that footer).
fn waits_at(pane: &str, progress: &str) -> bool {
    let last = last_line(pane);
    is_footer(last) && last.trim_start().starts_with(progress)
}

#[test]
#[ignore = "needs tmux: .ci/run installs it and runs this with --ignored"]
fn on_a_terminal_the_footer_is_erased_once_answered() {
    let tmux = Tmux::start("footer");
    let pane = tmux.wait_for("step 1/8", |p| waits_at(p, "step 1/8"));
    assert_eq!(
        last_line(&pane).trim(),
        "step 1/8 · Enter next · s state · d diagram so far · b back · q quit"
    );
    tmux.send("");
    tmux.wait_for("step 2/8", |p| waits_at(p, "step 2/8"));

    tmux.send("s");
    let pane = tmux.wait_for("the state look, then the footer again", |p| {
        p.contains("read again just now") && waits_at(p, "step 2/8")
    });
    assert!(pane.contains("pending→processing"), "{pane}");
    tmux.send("d");
    tmux.wait_for("the diagram look", |p| {
        p.contains("── The run so far ──") && waits_at(p, "step 2/8")
    });
    tmux.send("b");
    tmux.wait_for("step 2 again", |p| {
        p.contains("── Again ──") && waits_at(p, "step 2/8")
    });
    tmux.send("");
    tmux.wait_for("step 3/8", |p| waits_at(p, "step 3/8"));
    tmux.send("q");
    let pane = tmux.wait_for("lab to stop", |p| p.contains("lab exited"));

    assert!(pane.contains("lab exited 130"), "{pane}");
    // Every footer was erased once answered (`q` too): none is left on the screen, so none can
    // share a line with a table, and none was left above the text that followed it.
    let left: Vec<&str> = pane.lines().filter(|l| l.contains(FOOTER_END)).collect();
    assert!(
        left.is_empty(),
        "footers left on the screen: {left:?}\n{pane}"
    );
    // The spinner, if the servers took long enough to show it, was cleared too.
    assert!(!pane.contains("Preparing the servers"), "{pane}");
    // What was typed went with its footer too.
    assert!(
        !pane
            .lines()
            .any(|l| l.trim() == "s" || l.trim() == "d" || l.trim() == "b"),
        "{pane}"
    );
    for heading in [
        "── State",
        "── The run so far ──",
        "── Again ──",
        " 3. Worker A asks",
    ] {
        assert!(
            pane.contains(heading),
            "no {heading:?} in the pane:\n{pane}"
        );
    }
}

#[test]
#[ignore = "needs tmux: .ci/run installs it and runs this with --ignored"]
fn ctrl_c_at_a_pause_says_so_on_a_line_of_its_own() {
    let tmux = Tmux::start("ctrl-c");
    tmux.wait_for("step 1/8", |p| waits_at(p, "step 1/8"));
    tmux.run(&["send-keys", "-t", "lab", "C-c"]);
    let pane = tmux.wait_for("lab to stop", |p| p.contains("lab exited"));
    assert!(pane.contains("lab exited 130"), "{pane}");
    // The footer's line was cleared (the terminal's `^C` with it) before the message.
    assert!(
        pane.lines().any(|l| l.starts_with("lab: interrupted")),
        "{pane}"
    );
    assert!(!pane.contains(FOOTER_END), "{pane}");
}
