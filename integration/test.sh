#!/usr/bin/env bash
# Refract's test command (CI runs it from .ci/run):
#
#   integration/test.sh
#
# 1. integration/setup.sh (system packages, Rust components, Python venv);
# 2. cargo build --release --workspace --all-targets, once;
# 3. cargo test --release --workspace (reuses that build);
# 4. the Python end-to-end tests in integration/python against the release
#    binary (wordcount on DirectRunner / PortableRunner / PrismRunner, errors,
#    command line, web UI in Chromium, OTLP export to an OpenTelemetry
#    Collector that integration/otel/build-collector.sh builds and caches;
#    the refract-beam wheel that integration/build-wheel.sh builds, installed
#    into a fresh virtualenv);
# 5. Beam's PrismRunnerTest suite via integration/prism_suite.sh, with the
#    pass bar from integration/prism_suite_bar.
# 6. Beam's shared cases without Prism's opt-outs via
#    integration/refract_suite.sh (bar in integration/refract_suite_bar),
#    then the same on three engine shards exchanging over gRPC (refract_shards=3,
#    refract_shard_exchange=grpc)
# 7. Beam's cross-language suite via integration/xlang_suite.sh: Python
#    pipelines whose transforms a second SDK process expands and runs
#    (bar in integration/xlang_suite_bar).
# 8. the Java SDK: integration/run-java-wordcount.sh runs the Java WordCount
#    on Refract and on Beam's DirectRunner and compares the outputs (Maven's
#    repository is cached in ~/.cache/refract/m2), and
#    integration/run-java-hot-key.sh has the Java harness read a key larger
#    than the memory budget as a state-backed iterable.
# 9. the TypeScript SDK's own tests via integration/ts_suite.sh (its
#    portable-runner and cross-language cases, beside Beam's Python job
#    server). The Go SDK's pipeline runs in step 4 (test_go_sdk.py); Beam's
#    Go suites are the separate command integration/go_suite.sh.
# It goes on after a failing step 3-5 so one run reports everything, prints
# each pytest summary and a closing "total: ..." line, and exits non-zero if
# any step failed.
#
# Builds go to $CARGO_TARGET_DIR, by default ~/.cache/refract/target (outside
# the clone, so that fresh clones reuse them).
#
# Environment knobs:
#   REFRACT_SKIP_CARGO=1   skip steps 2-3 and test $REFRACT_BIN instead
#   REFRACT_E2E_TIMEOUT    seconds per end-to-end test (default 120)
#   REFRACT_SUITE_*        see integration/prism_suite.sh
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
cd "$REFRACT_ROOT"
trap 'refract_kill_bounded; exit 130' INT TERM

"$here/setup.sh"

work=$(mktemp -d -t refract-test.XXXXXX)
record=$work/counts.jsonl
failed_steps=()

if [ "${REFRACT_SKIP_CARGO:-0}" = 1 ]; then
  bin=${REFRACT_BIN:?REFRACT_SKIP_CARGO=1 needs REFRACT_BIN}
  echo "== skipping cargo build and tests (REFRACT_SKIP_CARGO=1)"
else
  echo "== cargo build --release --workspace --all-targets (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
  cargo build --release --workspace --all-targets

  echo "== cargo test --release --workspace"
  rc=0
  # The tests that run the real Python SDK use the venv's interpreter, and
  # fail rather than skip without it.
  BEAM_PYTHON=$REFRACT_PY REFRACT_REQUIRE_PYTHON=1 \
    cargo test --release --workspace 2>&1 | tee "$work/cargo-test.log" || rc=$?
  # Sum the "test result: ok. N passed; M failed; K ignored; ..." lines.
  awk '/^test result:/ {
         for (i = 1; i <= NF; i++) {
           if ($(i+1) ~ /^passed;?$/)  p += $i
           if ($(i+1) ~ /^failed;?$/)  f += $i
           if ($(i+1) ~ /^ignored;?$/) s += $i
         }
       }
       END { printf "{\"label\": \"cargo\", \"passed\": %d, \"failed\": %d, \"skipped\": %d}\n", p, f, s }' \
    "$work/cargo-test.log" >>"$record"
  [ "$rc" -eq 0 ] || failed_steps+=("cargo test (exit $rc)")
  bin=$CARGO_TARGET_DIR/release/refract
fi

if [ ! -x "$bin" ]; then
  echo "test.sh: no refract binary at $bin" >&2
  exit 1
fi
bin=$(realpath "$bin")

echo "== OpenTelemetry Collector for the OTLP test (integration/otel)"
if REFRACT_OTELCOL=$("$here/otel/build-collector.sh"); then
  export REFRACT_OTELCOL
  echo "$REFRACT_OTELCOL"
else
  failed_steps+=("building the OpenTelemetry Collector")
fi

# The Go end-to-end test (integration/python/test_go_sdk.py) runs a Go
# pipeline; built here, so that a cold Go cache does not count against the
# test's time limit.
echo "== building the Go pipeline and Go's boot program (integration/go)"
if ! { refract_go_wordcount_bin >/dev/null && refract_go_boot_bin >/dev/null; }; then
  failed_steps+=("building the Go pipeline")
fi

# The refract-beam wheel (integration/python/test_wheel.py installs it into
# a fresh virtualenv); maturin reuses the release build above.
echo "== building the refract-beam wheel (integration/build-wheel.sh)"
if REFRACT_WHEEL=$(REFRACT_DIST=$work/dist "$here/build-wheel.sh"); then
  export REFRACT_WHEEL
  echo "$REFRACT_WHEEL"
else
  failed_steps+=("building the refract-beam wheel")
fi

echo "== Python end-to-end tests (integration/python) against $bin"
e2e_timeout=${REFRACT_E2E_TIMEOUT:-120}
rc=0
# The session record (refract_session_record.py) makes a session that stops
# early — its time limit passed — a failure: pytest itself exits 0 then.
(
  cd "$here/python"
  PYTHONPATH="$here/beam_suite${PYTHONPATH:+:$PYTHONPATH}" \
    REFRACT_SUITE_EVENTS="$work/e2e-events.json" \
    REFRACT_BIN=$bin refract_run_bounded 2700 \
    "$REFRACT_PY" -m pytest . -p refract_session_record \
    --timeout "$e2e_timeout" --timeout-method=signal --session-timeout 2400 \
    --junitxml "$work/e2e.xml" -v --tb=native -rfE --disable-warnings
) || rc=$?
"$REFRACT_PY" "$here/beam_suite/summarize.py" --junit "$work/e2e.xml" \
  --events "$work/e2e-events.json" \
  --all-must-pass --pytest-exit "$rc" --label e2e --record "$record" ||
  failed_steps+=("Python end-to-end tests")
echo "UI screenshots of the browser tests: ${REFRACT_ARTIFACTS:-$HOME/.cache/refract/artifacts}/ui"

echo "== Beam PrismRunnerTest suite"
REFRACT_RECORD=$record REFRACT_REPORT_DIR=$work/prism-suite \
  "$here/prism_suite.sh" "$bin" ||
  failed_steps+=("Beam PrismRunnerTest suite (bar $(cat "$here/prism_suite_bar"))")

echo "== RefractRunnerTest suite (Beam's shared cases without Prism's opt-outs)"
REFRACT_RECORD=$record REFRACT_REPORT_DIR=$work/refract-suite \
  "$here/refract_suite.sh" "$bin" ||
  failed_steps+=("RefractRunnerTest suite (bar $(cat "$here/refract_suite_bar"))")

echo "== RefractRunnerTest suite again, every pipeline on three engine shards over gRPC"
REFRACT_SUITE_EXPERIMENTS=refract_shards=3,refract_shard_exchange=grpc REFRACT_RECORD=$record \
  REFRACT_REPORT_DIR=$work/refract-suite-shards "$here/refract_suite.sh" "$bin" ||
  failed_steps+=("RefractRunnerTest suite on three shards (bar $(cat "$here/refract_suite_bar"))")

echo "== Beam's cross-language suite (validate_runner_xlang_test, Python expansion service)"
REFRACT_RECORD=$record REFRACT_REPORT_DIR=$work/xlang-suite \
  "$here/xlang_suite.sh" "$bin" ||
  failed_steps+=("cross-language suites (bars in integration/xlang_suite_bar)")

# Runs one pass/fail step (a script under the wall-clock bound) and records
# it under LABEL: run_step LABEL DESCRIPTION SECONDS SCRIPT.
run_step() {
  local label=$1 description=$2 seconds=$3 script=$4 rc=0 passed=1 failed=0
  REFRACT_BIN=$bin refract_run_bounded "$seconds" "$script" || rc=$?
  if [ "$rc" -ne 0 ]; then
    passed=0 failed=1
    failed_steps+=("$description (exit $rc)")
  fi
  printf '{"label": "%s", "passed": %d, "failed": %d, "skipped": 0}\n' \
    "$label" "$passed" "$failed" >>"$record"
}

echo "== Java WordCount on Refract vs the DirectRunner"
run_step java-wordcount "Java WordCount" 900 "$here/run-java-wordcount.sh"

echo "== Java: a key larger than the memory budget, read as a state-backed iterable"
run_step java-hot-key "Java hot key" 600 "$here/run-java-hot-key.sh"

echo "== TypeScript SDK: its portable-runner and cross-language tests"
REFRACT_REPORT_DIR=$work/ts-suite run_step typescript "TypeScript SDK tests" 1200 "$here/ts_suite.sh"

echo "== reports in $work"
if [ "${#failed_steps[@]}" -gt 0 ]; then
  printf 'integration: FAILED: %s\n' "$(IFS=';'; echo "${failed_steps[*]}")"
  status=1
else
  echo "integration: OK"
  status=0
fi
"$REFRACT_PY" "$here/beam_suite/summarize.py" --total "$record"
exit "$status"
