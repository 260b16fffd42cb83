#!/usr/bin/env bash
# Runs Beam's shared portable-runner test cases against refract with none of
# Prism's opt-outs (integration/beam_suite/refract_runner_test.py): custom
# window coders, custom merging windows and the drain cases included, and
# the cross-language cases against Java expansion services it starts.
#
#   integration/refract_suite.sh [BIN] [extra pytest args, e.g. -k drain]
#
# BIN defaults to $REFRACT_BIN, then $CARGO_TARGET_DIR/release/refract.
# REFRACT_SUITE_EXPERIMENTS (comma-separated) adds experiments to every
# pipeline: REFRACT_SUITE_EXPERIMENTS=refract_shards=3 runs the suite on
# three engine shards (add refract_shard_exchange=grpc for the gRPC exchange).
# Fails when any test fails, hits the per-test timeout or crashes the
# runner, or when fewer tests pass than integration/refract_suite_bar.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary refract_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
bar=$(tr -d '[:space:]' <"$here/refract_suite_bar")
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-suite.XXXXXX)}
mkdir -p "$report_dir"

# The Java expansion services the cross-language cases use (each one's
# worker pool runs their Java transforms inside its JVM): Beam Java 2.73.0
# with KafkaIO, and Beam SQL (integration/sql-expansion, Beam 2.65.0).
expansion_pids=()
trap 'kill "${expansion_pids[@]}" 2>/dev/null || true' EXIT
trap 'refract_kill_bounded; exit 130' INT TERM
# start_expansion_service CLASSPATH LOG: starts one on a free port, waits
# until it listens, and sets expansion_port.
start_expansion_service() {
  expansion_port=$(refract_free_port)
  java -cp "$1" org.apache.beam.sdk.expansion.service.ExpansionService \
    "$expansion_port" --alsoStartLoopbackWorker >"$2" 2>&1 </dev/null &
  expansion_pids+=("$!")
  if ! refract_wait_for_port "$expansion_port" "$!" 120; then
    tail -n 30 "$2" >&2
    exit 1
  fi
}
start_expansion_service "$(refract_xlang_classpath)" "$report_dir/java-expansion.log"
java_expansion_port=$expansion_port
start_expansion_service "$(refract_sql_classpath)" "$report_dir/sql-expansion.log"
sql_expansion_port=$expansion_port

echo "== RefractRunnerTest against $bin (bar: $bar passed, none failed; reports: $report_dir)"
cd "$here/beam_suite"
rc=0
REFRACT_JAVA_EXPANSION_SERVICE=localhost:$java_expansion_port \
  REFRACT_SQL_EXPANSION_SERVICE=localhost:$sql_expansion_port \
  REFRACT_BIN=$bin PYTHONPATH="$here/beam_suite${PYTHONPATH:+:$PYTHONPATH}" \
  REFRACT_SUITE_EVENTS="$report_dir/events.json" \
  refract_run_bounded 1500 \
  "$REFRACT_PY" -m pytest \
  -p refract_beam_plugin -p no:cacheprovider -c "$here/beam_suite/pytest.ini" \
  refract_runner_test.py \
  --timeout 120 --timeout-method=signal --session-timeout 1200 \
  --junitxml "$report_dir/junit.xml" \
  -v --tb=native --show-capture=no -rfE --disable-warnings \
  "$@" || rc=$?

"$REFRACT_PY" "$here/beam_suite/summarize.py" \
  --junit "$report_dir/junit.xml" --events "$report_dir/events.json" \
  --bar "$bar" --all-must-pass --pytest-exit "$rc" \
  --label "refract-suite${REFRACT_SUITE_EXPERIMENTS:+ ($REFRACT_SUITE_EXPERIMENTS)}" \
  ${REFRACT_RECORD:+--record "$REFRACT_RECORD"}
