#!/usr/bin/env bash
# Runs Beam's own PrismRunnerTest suite (84 tests, shipped in the apache-beam
# wheel as apache_beam/runners/portability/prism_runner_test.py) against a
# refract binary, then applies the pass bar.
#
#   integration/prism_suite.sh [BIN] [extra pytest args, e.g. -k test_read]
#
# BIN defaults to $REFRACT_BIN, then $CARGO_TARGET_DIR/release/refract. The
# suite starts the binary itself as `BIN --job_port N` and submits every test
# pipeline with --environment_type=LOOPBACK.
#
# Fails (non-zero) when fewer tests pass than the number in
# integration/prism_suite_bar, when any test hits the per-test timeout or the
# runner dies, or when pytest stops early or collects nothing.
#
# Environment knobs:
#   REFRACT_SUITE_BAR              override the bar
#   REFRACT_SUITE_TEST_TIMEOUT     seconds per test (default 120)
#   REFRACT_SUITE_SESSION_TIMEOUT  seconds for the whole suite (default 1200)
#   REFRACT_REPORT_DIR             where junit.xml goes (default: a temp dir)
#   REFRACT_RECORD                 append the counts to this file (test.sh)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary prism_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
bar=${REFRACT_SUITE_BAR:-$(tr -d '[:space:]' <"$here/prism_suite_bar")}
test_timeout=${REFRACT_SUITE_TEST_TIMEOUT:-120}
session_timeout=${REFRACT_SUITE_SESSION_TIMEOUT:-1200}
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-prism-suite.XXXXXX)}
mkdir -p "$report_dir"
report_dir=$(realpath "$report_dir")

if [ ! -x "$REFRACT_PY" ]; then
  echo "prism_suite.sh: no virtualenv at $REFRACT_VENV; run integration/setup.sh" >&2
  exit 1
fi
beam_dir=$("$REFRACT_PY" -c 'import importlib.util as u
print(u.find_spec("apache_beam").submodule_search_locations[0])')
test_file=$beam_dir/runners/portability/prism_runner_test.py
if [ ! -f "$test_file" ]; then
  echo "prism_suite.sh: $test_file not found (apache-beam without tests?)" >&2
  exit 1
fi

echo "== Beam PrismRunnerTest against $bin (bar: $bar passed; reports: $report_dir)"

trap 'refract_kill_bounded; exit 130' INT TERM

# Run from site-packages: test ids print short, and any file a test writes to
# its working directory lands in the virtualenv, not in the clone.
cd "$(dirname "$beam_dir")"
rc=0
PYTHONPATH="$here/beam_suite${PYTHONPATH:+:$PYTHONPATH}" \
  REFRACT_SUITE_EVENTS="$report_dir/events.json" \
  refract_run_bounded $((session_timeout + 300)) \
  "$REFRACT_PY" -m pytest \
  -p refract_beam_plugin -p no:cacheprovider \
  -c "$here/beam_suite/pytest.ini" --rootdir "$(dirname "$beam_dir")" \
  "$test_file::PrismRunnerTest" \
  --test-pipeline-options="--prism_bin='$bin' --environment_type=LOOPBACK" \
  --timeout "$test_timeout" --timeout-method=signal \
  --session-timeout "$session_timeout" \
  --junitxml "$report_dir/junit.xml" \
  -o junit_logging=all -o junit_log_passing_tests=false \
  -v --tb=native --show-capture=no -rfE --disable-warnings \
  "$@" || rc=$?

"$REFRACT_PY" "$here/beam_suite/summarize.py" \
  --junit "$report_dir/junit.xml" --events "$report_dir/events.json" \
  --bar "$bar" --pytest-exit "$rc" --label prism-suite \
  ${REFRACT_RECORD:+--record "$REFRACT_RECORD"}
