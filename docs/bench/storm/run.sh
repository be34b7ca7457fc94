#!/usr/bin/env bash
# The storm of the README's benchmarks (issue 22): a keyed storm against `lab serve`'s report
# service, then the same four statements through `pgbench -M prepared` on the same throwaway
# PostgreSQL (fsync=off, synchronous_commit=off: the lab's settings, so the ratio means
# something), in interleaved rounds; per round the rates, their ratio, and what a request cost
# each process in CPU (the service, the load generator, PostgreSQL's postmaster and backends).
#
#   docs/bench/storm/run.sh [ROUNDS] [SECONDS]        (defaults: 3 rounds of 10 s)
#
# Needs wrk and pgbench on PATH, and a release build (`cargo build --release -p lab-cli`);
# LAB=path/to/lab to use another binary, PIPELINED=1 to add pgbench with the statements in two
# pipelines (BEGIN with the INSERT, the SELECT with the COMMIT: two round trips instead of four).
# It starts `lab serve` on its default ports and stops it (Ctrl-C, as a person would) however
# it ends, which removes the session's schema and the throwaway servers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
seconds=${2:-10}
lab=${LAB:-$here/../../../target/release/lab}
for program in wrk pgbench "$lab"; do
  command -v "$program" >/dev/null || { echo "run.sh: $program not found" >&2; exit 3; }
done

log=$(mktemp)
"$lab" serve --lang en --color never >"$log" 2>&1 &
serve=$!
stop() {
  kill -INT "$serve" 2>/dev/null && wait "$serve" 2>/dev/null || true
  rm -f "$log"
}
trap stop EXIT
trap 'exit 130' INT TERM

# The session's PostgreSQL URL (with the run's schema as search_path) and the report service's
# direct port, from what `lab serve` prints once everything is up.
for _ in $(seq 300); do
  grep -q '^  PostgreSQL ' "$log" && break
  kill -0 "$serve" 2>/dev/null || { cat "$log" >&2; exit 3; }
  sleep 0.1
done
url=$(awk '/^  PostgreSQL /{print $2}' "$log")
service=$(awk '/^  report service /{print $NF}' "$log")
port=$(sed -E 's|.*:([0-9]+)/.*|\1|' <<<"$url")
[ -n "$url" ] && [ -n "$service" ] || { cat "$log" >&2; exit 3; }
postmaster=$(pgrep -f -- "postgres .*-p $port( |$)" | head -n 1)
[ -n "$postmaster" ] || { echo "run.sh: no PostgreSQL on port $port" >&2; exit 3; }

hz=$(getconf CLK_TCK)
# CPU ticks of one process (user + system).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# CPU ticks of the database: the postmaster, its live children, and the children it has reaped
# (backends that ended).
database_ticks() {
  local total=0 child
  for child in $postmaster $(pgrep -P "$postmaster"); do
    total=$((total + $(ticks "$child" 2>/dev/null || echo 0)))
  done
  echo $((total + $(awk '{print $16 + $17}' "/proc/$postmaster/stat")))
}
# µs of CPU per request: CPU seconds over requests (`rate` a second for `seconds`).
us_per_request() { awk -v cpu="$1" -v rate="$2" -v d="$seconds" 'BEGIN { printf "%.0f", cpu * 1e6 / (rate * d) }'; }
# The same from clock ticks.
ticks_per_request() { us_per_request "$(awk -v t="$1" -v hz="$hz" 'BEGIN { print t / hz }')" "$2"; }
# Runs a load generator under bash's `time`: its output, then its own CPU seconds as the last line.
timed() { { TIMEFORMAT='%U %S'; time "$@" 2>/dev/null; } 2>&1 | awk '{ if (/^[0-9.]+ [0-9.]+$/) print $1 + $2; else print }'; }

# One pgbench run of `script`: its transactions a second, then its own and the database's CPU
# per transaction.
pgbench_round() {
  local before after out tps
  before=$(database_ticks)
  out=$(timed pgbench -n -M prepared -c50 -j2 -T"$seconds" -f "$here/$1" "$url")
  after=$(database_ticks)
  tps=$(awk '/^tps/{print $3; exit}' <<<"$out")
  echo "$tps $(us_per_request "$(tail -n 1 <<<"$out")" "$tps") $(ticks_per_request $((after - before)) "$tps")"
}

echo "lab serve's report service at $service, PostgreSQL $url"
printf '%-6s %10s %8s %6s %6s | %10s %8s %6s | %6s' round storm_rps service wrk pg pgbench_tps own pg ratio
[ "${PIPELINED:-0}" = 1 ] && printf ' | %12s %6s' pipelined_tps ratio
echo
for round in $(seq "$rounds"); do
  before=$(ticks "$serve"); db_before=$(database_ticks)
  out=$(timed wrk -t2 -c50 -d"${seconds}s" -s "$here/storm.lua" "$service")
  after=$(ticks "$serve"); db_after=$(database_ticks)
  rps=$(awk '/^requests_per_sec/{print $2}' <<<"$out")
  bad=$(awk '/^non_2xx/{n += $2} /^socket_errors/{n += $2} END {print n + 0}' <<<"$out")
  [ "$bad" = 0 ] || { echo "run.sh: $bad requests were not answered 200 or 201" >&2; exit 1; }
  read -r tps pgbench_own pgbench_pg < <(pgbench_round pgbench.sql)
  printf '%-6s %10.0f %8s %6s %6s | %10.0f %8s %6s | %6.2f' "$round" "$rps" \
    "$(ticks_per_request $((after - before)) "$rps")" \
    "$(us_per_request "$(tail -n 1 <<<"$out")" "$rps")" \
    "$(ticks_per_request $((db_after - db_before)) "$rps")" \
    "$tps" "$pgbench_own" "$pgbench_pg" "$(awk -v a="$rps" -v b="$tps" 'BEGIN { print a / b }')"
  if [ "${PIPELINED:-0}" = 1 ]; then
    read -r piped _ < <(pgbench_round pgbench-pipelined.sql)
    printf ' | %12.0f %6.2f' "$piped" "$(awk -v a="$piped" -v b="$tps" 'BEGIN { print a / b }')"
  fi
  echo
done
echo "service, wrk, pg: CPU µs per request of the storm; own, pg: per pgbench transaction."
